"""GPU type names (#25): how gpu-cache names a device, and how a GPU type named as the cluster
names it (its GRES type) meets that name. Pure functions over real product names and real
``nvidia-smi -L`` / ``sinfo`` output; no subprocess."""

from __future__ import annotations

import pytest

from gpu_cache.config.cluster import gres_by_partition, parse
from gpu_cache.config.settings import GpuType
from gpu_cache.config.targets import a_gpu, device_problems, gres_mapping, gres_names
from gpu_cache.core.device import Device, gpu_type_of, mig_names

#: Product names as nvidia-smi and JAX's device kind write them, and the name of each.
#: Memory, form-factor and edition variants of one model share a name; models never do.
NAMES = [
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA GH200 144G HBM3e", "gh200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L40", "l40"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A40", "a40"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA RTX A6000", "rtxa6000"),
    ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA GeForce RTX 4090 D", "rtx4090d"),
    ("NVIDIA GeForce RTX 5090", "rtx5090"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
    ("Quadro RTX 6000", "rtx6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtxpro6000blackwell"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtxpro6000blackwell"),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtxpro6000blackwell"),
    ("NVIDIA RTX PRO 4500 Blackwell", "rtxpro4500blackwell"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("Tesla V100S-PCIE-32GB", "v100s"),
    ("Tesla T4", "t4"),
    ("NVIDIA TITAN RTX", "titanrtx"),
    # A MIG slice has other SMs and another JAX device kind: a device of its own.
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "a100-mig1g.5gb"),
    ("NVIDIA RTX PRO 4500 Blackwell MIG 1g.16gb", "rtxpro4500blackwell-mig1g.16gb"),
    ("cpu", "cpu"),
    ("", "gpu"),
    ("NVIDIA", "gpu"),
]


@pytest.mark.parametrize("product,name", NAMES)
def test_each_product_gets_its_models_name(product, name):
    assert gpu_type_of(product) == name


def test_two_models_never_share_a_name():
    """The names of the table's models are all different: the RTX PRO 6000 and 4500 were both
    ``rtxpro``, the RTX 3090 Ti was an ``rtx3090`` and the RTX 6000 Ada a Quadro RTX 6000."""
    models = {name for _product, name in NAMES}
    for one in ("rtxpro6000blackwell", "rtxpro4500blackwell", "rtx3090", "rtx3090ti", "rtx6000",
                "rtx6000ada", "rtx4090", "rtx4090d", "a100", "a100-mig1g.5gb", "h100", "h200", "gh200"):
        assert one in models
    assert len({gpu_type_of(p) for p, _ in NAMES}) == len(models)


def test_names_users_have_verdicts_under_stay_what_they_were():
    # validate/{gpu_type}.json and configs' device keys are named by these.
    assert [gpu_type_of(p) for p in ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S",
                                     "NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3",
                                     "NVIDIA RTX A6000", "NVIDIA GeForce RTX 3090")] == \
        ["h200", "a100", "l40s", "rtx4090", "h100", "rtxa6000", "rtx3090"]


#: ``nvidia-smi -L`` on a machine with MIG slices (the format of NVIDIA's MIG user guide).
NVIDIA_SMI_L = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 3g.20gb     Device  1: (UUID: MIG-1d4f4b9a-3e1c-5a0b-8f55-1c2d3e4f5a6b)
GPU 1: NVIDIA RTX PRO 4500 Blackwell (UUID: GPU-0c2b1f4e-aa11-4b7d-9c3e-7f6e5d4c3b2a)
  MIG 1g.16gb     Device  0: (UUID: MIG-9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d)
"""


def test_a_mig_slice_visible_by_uuid_is_named_as_cuda_names_it():
    names = mig_names(NVIDIA_SMI_L)
    assert names == {
        "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f": "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "MIG-1d4f4b9a-3e1c-5a0b-8f55-1c2d3e4f5a6b": "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        "MIG-9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d": "NVIDIA RTX PRO 4500 Blackwell MIG 1g.16gb",
    }
    assert gpu_type_of(names["MIG-9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d"]) == "rtxpro4500blackwell-mig1g.16gb"


@pytest.mark.parametrize("name, said", [("a100", "an A100"), ("h200", "an H200"), ("rtx4090", "an RTX4090"),
                                        ("l40s", "an L40S"), ("b200", "a B200"), ("3090", "a 3090"),
                                        ("8000", "an 8000"), ("a100-mig1g.5gb", "an a100-mig1g.5gb")])
def test_a_sentence_says_a_gpu_with_its_article(name, said):
    """A model's code is said letter by letter ("an A100", never "a a100")."""
    assert a_gpu(name) == said


# --- a GPU type named as the cluster names it --------------------------------------------------

RTX3090 = Device("NVIDIA GeForce RTX 3090", "rtx3090", 1)


def test_a_type_named_by_its_gres_needs_its_device_and_the_problem_says_the_line():
    bare = GpuType("3090", ("inference",), resources={"gpu": 1, "gpu_model": "3090"})
    (problem,) = device_problems(bare, RTX3090)
    assert "GPU type 3090 expects device 3090, but the job saw NVIDIA GeForce RTX 3090" in problem
    assert "add `device: rtx3090` to gpu_types.3090" in problem
    mapped = GpuType("3090", ("inference",), resources={"gpu": 1, "gpu_model": "3090"}, device="rtx3090")
    assert device_problems(mapped, RTX3090) == []


def test_the_device_may_be_the_exact_product_name_to_tell_memory_variants_apart():
    eighty = GpuType("a100-80", ("w",), device="NVIDIA A100-SXM4-80GB")
    assert device_problems(eighty, Device("NVIDIA A100-SXM4-80GB", "a100", 1)) == []
    assert device_problems(eighty, Device("NVIDIA A100-SXM4-40GB", "a100", 1))


#: ``sinfo -h -e -o "%P|%m|%c|%G|%f|%l"`` (gpu_cache.config.cluster.FORMAT) of a cluster named
#: like AlphaPulldownSnakemake's (GRES types as the site chose them), with a CPU partition.
SINFO = """\
gpu-el8*|96000|32|gpu:3090:4(S:0-1)|(null)|7-00:00:00
gpu-el8*|512000|64|gpu:a100:4(S:0-1),gpu:l40s:8|(null)|7-00:00:00
gpu-el8*|256000|64|gpu:rtxpro6000:4|(null)|7-00:00:00
htc-el8|256000|128|(null)|(null)|infinite
gpu-training|1024000|96|gpu:h200:8(S:0-1)|(null)|2-00:00:00
"""


def test_sinfo_lists_the_gpu_gres_types_per_partition():
    assert gres_by_partition(tuple(parse(SINFO))) == {
        "gpu-el8": {"3090", "a100", "l40s", "rtxpro6000"}, "htc-el8": set(), "gpu-training": {"h200"}}


def test_gres_names_of_a_types_resources():
    assert gres_names(GpuType("x", (), resources={"gres": "gpu:3090:1"})) == {"3090"}
    assert gres_names(GpuType("x", (), resources={"gpu": 1, "gpu_model": "a100"})) == {"a100"}
    assert gres_names(GpuType("x", (), resources={"gres": "gpu:1"})) == set()


def test_each_gres_name_is_mapped_to_a_type_or_said_to_be_unmapped():
    types = {
        "3090": GpuType("3090", (), resources={"gpu": 1, "gpu_model": "3090"}, device="rtx3090"),
        "a100": GpuType("a100", (), resources={"gres": "gpu:a100:1"}),
        "h100": GpuType("h100", (), resources={"gpu": 1, "gpu_model": "h100"}),
        "b200": GpuType("b200", (), resources={"gpu": 1, "gpu_model": "b200"}, optional=False),
    }
    lines = gres_mapping(types, gres_by_partition(tuple(parse(SINFO))))
    assert "gpu:3090 (partition gpu-el8): GPU type 3090 (device rtx3090)" in lines
    assert "gpu:a100 (partition gpu-el8): GPU type a100 (device a100)" in lines
    (l40s,) = [line for line in lines if line.startswith("gpu:l40s")]
    assert "no GPU type asks for it" in l40s and "gpu_model: l40s" in l40s
    assert ("GPU type h100 asks for gpu:h100, which no partition offers: its jobs end "
            "unscheduled and hold nothing back") in lines
    assert any(line.startswith("GPU type b200 asks for gpu:b200, which no partition offers: its "
                               "warm job fails") for line in lines)


# --- a device's identity: its model, not its index (issue 49) -----------------------------------


def test_a_verdict_is_the_gpus_model_not_which_of_the_nodes_gpus_the_job_got():
    """Two 3090s of one node (CUDA_VISIBLE_DEVICES 0 and 1) share a fingerprint, so a warm on
    either skips; another model, compute capability, driver or count of GPUs does not."""
    from dataclasses import replace

    from gpu_cache.core.runner import Command, Plan, fingerprint

    plan = Plan("warm", "3090", (Command("w", 16, "{python} w.py {shape}", 60.0),))
    software = {"python": "3.12.1", "jax": "0.9.1"}
    first = Device("NVIDIA GeForce RTX 3090", "rtx3090", 1, "0", "8.6", "550.54.15")
    key = fingerprint(plan, software, first.as_dict())
    assert fingerprint(plan, software, replace(first, visible_devices="1").as_dict()) == key
    assert fingerprint(plan, software, replace(first, visible_devices=None).as_dict()) == key
    for other in (replace(first, name="NVIDIA GeForce RTX 3090 Ti", gpu_type="rtx3090ti"),
                  replace(first, compute_capability="8.9"), replace(first, driver="560.28.03"),
                  replace(first, count=2, visible_devices="0,1")):
        assert fingerprint(plan, software, other.as_dict()) != key, other
