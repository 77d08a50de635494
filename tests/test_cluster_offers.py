"""What a SLURM cluster offers and what it means for a GPU type's jobs (issue 49): real ``sinfo``
output read, which nodes can take a type, the largest memory among them, a type no node can take
as a node of its type whatever its resources say, and why SLURM refused a job, with the key that
fixes it. Pure functions over sinfo's text, with no ``sbatch`` on PATH (``sbatch --test-only``
is asked on the real cluster: tests/test_slurm_not_cold.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpu_cache.config import cluster
from gpu_cache.config.settings import GpuType
from gpu_cache.core.device import Device
from helpers import fake_sinfo, run_cli, write_config

#: ``sinfo -h -e -o "%P|%m|%c|%G|%f|%l"`` of a site with two GPU partitions and nodes of 48 GB.
SINFO = """\
gpu*|48000|16|gpu:3090:2(S:0-1)|(null)|2-00:00:00
gpu*|256000|64|gpu:a100:4(S:0-1)|nvlink,a100|2-00:00:00
training|512000|96|gpu:h200:8(S:0-1)|(null)|infinite
htc|256000|128|(null)|(null)|30:00
"""
OFFERS = tuple(cluster.parse(SINFO))
CPU = Device("cpu", "cpu", 0)


def gpu_type(name: str, **resources) -> GpuType:
    return GpuType(name, ("alphafold3",), resources=resources, device=None)


def test_sinfo_lines_are_read_with_memory_cpus_gres_features_and_time_limit():
    first, a100, h200, htc = OFFERS
    assert (first.partition, first.default, first.memory_mb, first.cpus, first.gres) == (
        "gpu", True, 48000, 16, {"3090": 2})
    assert a100.features == frozenset({"nvlink", "a100"}) and a100.time_limit_minutes == 2880
    assert h200.time_limit_minutes is None and h200.default is False
    assert htc.gres == {} and htc.time_limit_minutes == 30
    assert cluster.parse("gpu|48000+|16|gpu:4|(null)|1:30:00\n")[0].gres == {"": 4}
    limits = [o.time_limit_minutes for o in cluster.parse("".join(
        f"gpu|48000|16|(null)|(null)|{limit}\n" for limit in ("1:30:00", "2-12:00:00", "45", "UNLIMITED")))]
    assert limits == [90, 3600, 45, None]
    assert cluster.parse("not sinfo output\ngpu|x|16|(null)|(null)|infinite\n") == []


def test_the_largest_node_that_can_take_a_type_is_in_its_partition_with_its_gres():
    assert cluster.largest_memory(gpu_type("3090", gpu=1, gpu_model="3090"), OFFERS) == 48000
    assert cluster.largest_memory(gpu_type("a100", gres="gpu:a100:1", constraint="nvlink"), OFFERS) == 256000
    assert cluster.largest_memory(gpu_type("a100", gres="gpu:a100:1", constraint="pcie"), OFFERS) is None
    # No partition named: SLURM's default partition (gpu), not the training one.
    assert cluster.largest_memory(gpu_type("h200", gpu=1, gpu_model="h200"), OFFERS) is None
    placed = gpu_type("h200", slurm_partition="gpu,training", gpu=1, gpu_model="h200")
    assert cluster.largest_memory(placed, OFFERS) == 512000


@pytest.mark.parametrize("resources, said", [
    ({}, "GPU type h100 asks SLURM for no GPU of a type (its resources name neither a gpu_model nor "
         "a typed gres): its warm and check jobs may run on a node without an H100"),
    ({"gpu": 1}, "GPU type h100 asks SLURM for any GPU of a type"),
    ({"gpu": 1, "gpu_model": "h100"}, "GPU type h100 asks for gpu:h100, which no partition offers: its jobs "
                                      "end unscheduled and hold nothing back"),
])
def test_a_type_no_node_can_take_as_its_own_is_named_whatever_its_resources_say(resources, said):
    (line,) = cluster.unreachable({"h100": gpu_type("h100", **resources)}, CPU, OFFERS)
    assert line.startswith(said), line


def test_a_type_offered_only_outside_its_partition_names_the_partition_that_has_it():
    (line,) = cluster.unreachable({"h200": gpu_type("h200", gpu=1, gpu_model="h200")}, CPU, OFFERS)
    assert "(partition training has it): set gpu_types.h200.resources.slurm_partition" in line


def test_a_type_asking_for_a_gres_no_node_offers_is_named_though_this_machine_is_its_device():
    """The tests' types say device: cpu (this machine) and still ask SLURM for a GPU type."""
    here = GpuType("h100", ("w",), resources={"gpu": 1, "gpu_model": "h100"}, device="cpu")
    (line,) = cluster.unreachable({"h100": here}, CPU, OFFERS)
    assert line.startswith("GPU type h100 asks for gpu:h100, which no partition offers")


def test_types_a_node_can_take_and_this_machines_own_are_not_named():
    types = {"3090": gpu_type("3090", slurm_partition="gpu", gpu=1, gpu_model="3090"),
             "cpu": GpuType("cpu", ("jax-transformer",))}
    assert cluster.unreachable(types, CPU, OFFERS) == []


KEYS = {"mem_mb": "set gpu_types.3090.resources.mem_mb", "cpus": "lower warm.parallel"}
THE_3090 = gpu_type("3090", slurm_partition="gpu", gpu=1, gpu_model="3090", runtime=60)


@pytest.mark.parametrize("request_, said", [
    ({"mem_mb": 61154, "threads": 5}, "SLURM refused its warm job: it asked for 59.7 GiB of memory, and "
                                      "the nodes of partition gpu that offer gpu:3090 have at most 46.9 GiB; "
                                      "set gpu_types.3090.resources.mem_mb"),
    ({"mem_mb": 20000, "threads": 32}, "SLURM refused its warm job: it asked for 32 CPUs, and the nodes "
                                       "of partition gpu that offer gpu:3090 have at most 16; lower "
                                       "warm.parallel"),
    ({"mem_mb": 20000, "threads": 1, "gpu": 4}, "SLURM refused its warm job: it asked for 4 GPUs"),
    ({"mem_mb": 20000, "threads": 1, "runtime": 5000}, "SLURM refused its warm job: it asked for 5000 "
                                                       "minutes, and the partition allows 2880"),
    ({"mem_mb": 20000, "threads": 1}, "its warm job did not finish on a 3090 node, though SLURM would take "
                                      "it: it did not start within gpu_types.3090.queue_wait"),
])
def test_a_refused_job_is_a_failure_with_its_cause_and_key(request_, said, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    found = cluster.refusal("3090", THE_3090, "warm", request_, OFFERS, KEYS)
    assert not found.unscheduled and found.reason.startswith(said), found.reason


def test_a_type_no_node_offers_is_unscheduled_and_without_a_cluster_the_log_is_named(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    h100 = gpu_type("h100", gpu=1, gpu_model="h100")
    found = cluster.refusal("h100", h100, "warm", {"mem_mb": 1000}, OFFERS, KEYS)
    assert found.unscheduled and found.reason == "no partition offers gpu:h100"
    alone = cluster.refusal("h100", h100, "check", {"mem_mb": 1000}, None, KEYS)
    assert not alone.unscheduled and "no SLURM cluster answers here to say why" in alone.reason


def test_the_sbatch_flags_of_a_request_are_the_plugins():
    assert cluster.sbatch_flags({"mem_mb": 1000, "runtime": 10, "slurm_partition": "gpu", "gpu": 1,
                                 "gpu_model": "3090", "threads": 2, "slurm_extra": "--deadline=now+600"}) == [
        "--mem", "1000", "-t", "10", "-p", "gpu", "--gpus=3090:1", "--cpus-per-task=2",
        "--deadline=now+600"]


# --- sinfo's numbers, read strictly and bounded -----------------------------------------------

NINES = "9" * 401


def test_sinfo_numbers_are_read_strictly_and_a_line_names_the_first_left_out():
    """"²" is a digit to str.isdigit and no number to int; 401 digits overflowed the sizes'
    floats (doctor's traceback): such a group of nodes is left out, and one line names it."""
    text = (f"gpu*|{NINES}|16|gpu:a100:2|(null)|infinite\n"
            "gpu*|48000|16|gpu:h100:²|(null)|infinite\n"
            "gpu*|48000|1234567890123|(null)|(null)|infinite\n"
            "gpu*|48000|16|(null)|(null)|1:2:3:4\n"
            "big|512000|64|gpu:h200:8(S:0-1)|(null)|1-00:00:00\n")
    offers, said = cluster.read(text)
    assert [(o.partition, o.memory_mb, o.gres, o.time_limit_minutes) for o in offers] == [
        ("big", 512000, {"h200": 8}, 1440)]
    assert said == (f"sinfo: 4 group(s) of nodes left out, which gpu-cache could not read (the first: "
                    f"partition gpu: node memory '{'9' * 17}...{'9' * 18}' (401 characters) is not a whole "
                    "number gpu-cache reads)")
    assert cluster.parse(text) == offers


AF3_A100 = {"gpu_types": {"a100": {"workloads": ["alphafold3"], "device": "cpu",
                                   "resources": {"gpu": 1, "gpu_model": "a100"}}},
            "workloads": {"alphafold3": {"shapes": [128, 256]}}}


def test_doctor_leaves_out_a_node_memory_of_401_digits_with_one_line(tmp_path):
    environ = fake_sinfo(tmp_path / "bin", f"echo 'gpu*|{NINES}|16|gpu:a100:2|(null)|infinite'\n"
                                   "echo 'gpu*|48000|16|gpu:a100:2|(null)|infinite'")
    config = write_config(tmp_path / "c.yaml", AF3_A100)
    done = run_cli("doctor", "--config", str(config), "--cache-root", str(tmp_path / "c"), env=environ)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "  warning: sinfo: 1 group(s) of nodes left out, which gpu-cache could not read (the first: " \
           "partition gpu: node memory '999" in done.stdout, done.stdout
    assert "placement: a100: warm runs 2 of its 2 runs at once in 10.1 GiB of 46.9 GiB" in done.stdout


def test_doctor_reads_at_most_4_mib_of_sinfo(tmp_path):
    """50 MB of sinfo's output was read whole (923 MB peak): under a cap of 400 MB of address
    space, doctor reads 4 MiB of it and says so in one line."""
    line = "gpu*|48000|16|gpu:a100:2|(null)|infinite"
    environ = fake_sinfo(tmp_path / "bin", f"yes '{line}' | head -c 50000000")
    done = subprocess.run(["prlimit", f"--as={400 << 20}", sys.executable, "-m", "gpu_cache", "doctor",
                           "--cache-root", str(tmp_path / "c")],
                          env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert ("  warning: sinfo wrote more than 4194304 bytes: gpu-cache read no more of it, and sizes and "
            "places no job from it") in done.stdout.splitlines(), done.stdout


@pytest.mark.slow  # doctor waits its 5 s for sinfo
def test_doctor_waits_for_sinfo_5_s_at_most_and_says_so(tmp_path):
    environ = fake_sinfo(tmp_path / "bin", "echo 'gpu*|48000|16|gpu:a100:2|(null)|infinite'; exec sleep 60")
    started = time.monotonic()
    done = run_cli("doctor", "--cache-root", str(tmp_path / "c"), env=environ)
    assert time.monotonic() - started < 30 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "  warning: sinfo did not answer within 5 s" in done.stdout.splitlines(), done.stdout
    assert "gres:" not in done.stdout  # nothing read from it
