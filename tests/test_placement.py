"""Where a GPU type's warm and check jobs run (gpu_cache.config.placement, which the workflow's
common.smk wires into its rules): resources, the --deadline, the unscheduled skip, the retry."""

from __future__ import annotations

import json
import math

import pytest

from gpu_cache.config import placement
from gpu_cache.config.settings import GpuType
from gpu_cache.core.errors import UsageError


def gpu(name: str = "h200", **resources: object) -> GpuType:
    return GpuType(name, ("jax-transformer",), resources=dict(resources), queue_wait_seconds=3600.0)


HERE = gpu("cpu")  # asks SLURM for nothing: runs where Snakemake runs, never unscheduled
H200 = gpu("h200", slurm_partition="gpu", gpu=1, gpu_model="h200", runtime=30)


def test_only_types_that_ask_slurm_for_a_place_are_optional_and_get_the_retry():
    assert placement.optional_types({"cpu": HERE, "h200": H200}) == ["h200"]
    assert placement.retries({"cpu": HERE}) == 0
    assert placement.retries({"cpu": HERE, "h200": H200}) == 1
    pinned = GpuType("h200", (), resources={"gpu": 1}, optional=False)
    assert placement.retries({"h200": pinned}) == 0


def test_an_optional_types_deadline_is_its_queue_wait_plus_its_runtime():
    assert placement.deadline(H200) == f"--deadline=now+{3600 + 30 * 60}"
    assert placement.deadline(gpu("a100", gpu=1)) is None  # no runtime: no deadline at all
    pinned = GpuType("h200", (), resources={"gpu": 1, "runtime": 30}, optional=False)
    assert placement.deadline(pinned) is None  # not optional: it waits as long as it must


def test_a_later_attempt_of_an_optional_type_runs_no_workload_and_says_why():
    assert placement.skip_reason("h200", H200, None, attempt=1) is None
    why = placement.skip_reason("h200", H200, None, attempt=2)
    assert why.startswith("its job did not finish on a h200 node within gpu_types.h200.queue_wait")
    assert placement.skip_reason("cpu", HERE, None, attempt=2) is None  # not optional: it runs


def test_a_check_whose_warm_was_unscheduled_runs_no_workload(tmp_path):
    report = tmp_path / "warm.json"
    assert placement.skip_reason("h200", H200, str(report), attempt=1) is None  # not there yet
    report.write_text(json.dumps({"unscheduled": "no h200 node"}))
    why = placement.skip_reason("h200", H200, str(report), 1)
    assert why == "its warm job was not scheduled (no h200 node)"
    report.write_text("{ not json")
    assert placement.skip_reason("h200", H200, str(report), 1) is None
    report.write_text(json.dumps({"passed": True}))
    assert placement.skip_reason("h200", H200, str(report), 1) is None


def test_the_jobs_ask_for_every_resource_a_type_sets_and_the_deadlines():
    assert placement.resource_names({"cpu": HERE}) == []
    names = placement.resource_names({"h200": H200, "a100": gpu("a100", gpu=1, runtime=10)})
    assert names == ["gpu", "gpu_model", "runtime", "slurm_extra", "slurm_partition"]


def test_a_size_or_time_resource_set_for_some_types_only_is_refused():
    with pytest.raises(UsageError, match="runtime is set for some GPU types but not for a100"):
        placement.resource_names({"h200": H200, "a100": gpu("a100", gpu=1)})


def test_a_job_that_runs_no_workload_asks_for_no_place_but_keeps_its_other_resources():
    asked = []

    def skipped() -> bool:
        asked.append(True)
        return True

    assert placement.resource("gpu_model", H200, skipped) is None
    assert placement.resource("slurm_extra", H200, skipped) is None
    assert placement.resource("runtime", H200, lambda: pytest.fail("asked for a sized resource")) == 30
    assert len(asked) == 2
    running = lambda: False  # noqa: E731
    assert placement.resource("gpu_model", H200, running) == "h200"
    assert placement.resource("slurm_extra", H200, running) == f"--deadline=now+{3600 + 1800}"
    extra = gpu("h200", gpu=1, runtime=30, slurm_extra="--exclusive")
    assert placement.resource("slurm_extra", extra, running) == f"--exclusive --deadline=now+{3600 + 1800}"
    assert placement.resource("mem_mb", H200, running) is None  # the type does not set it


def test_warm_and_check_jobs_get_the_memory_of_their_alphafold3_buckets():
    """AlphaPulldownSnakemake's sizing of a fold, 1.25 x (8000 + 0.0045 x N^2) MB: the check job
    the largest bucket (it runs them one at a time), the warm job those it runs side by side."""
    from gpu_cache.config.settings import settings_from

    af3 = {"model_dir": "weights", "shapes": [128, 256, 512, 768, 1024]}
    config = {"workloads": {"alphafold3": af3},
              "gpu_types": {"a100": {"workloads": ["alphafold3"], "resources": {"gpu": 1}},
                            "own": {"workloads": ["alphafold3"], "resources": {"mem_mb": 64000}}}}
    settings = settings_from(config)
    fold = {n: math.ceil(1.25 * (8000 + 0.0045 * n * n)) for n in af3["shapes"]}
    assert placement.memory_mb(settings, "a100", "check") == fold[1024] == 15899
    assert placement.memory_mb(settings, "a100", "warm") == sum(fold.values())
    two_at_once = settings_from(config | {"warm": {"parallel": 2}})
    assert placement.memory_mb(two_at_once, "a100", "warm") == fold[1024] + fold[768]
    check = placement.sized(settings, settings.gpu_types, "check")
    assert check["a100"].resources == {"gpu": 1, "mem_mb": 15899}
    assert check["own"].resources == {"mem_mb": 64000}  # the type's own value wins
    assert placement.resource("mem_mb", check["a100"], lambda: True) == placement.SKIPPED_MEM_MB
    # A workload of unknown size: no memory, so set for some types only, which Snakemake refuses.
    config["gpu_types"]["jax"] = {"workloads": ["jax-transformer"]}
    mixed = settings_from(config)
    assert placement.memory_mb(mixed, "jax", "warm") is None
    with pytest.raises(UsageError, match="mem_mb is set for some GPU types but not for jax"):
        placement.resource_names(placement.sized(mixed, mixed.gpu_types, "warm"))
