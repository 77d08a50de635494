"""Where a GPU type's warm and check jobs run (gpu_cache.config.placement, which the workflow's
common.smk wires into its rules): resources, the --deadline, the unscheduled skip, the retry."""

from __future__ import annotations

import json

import pytest

from gpu_cache.config import cluster, placement
from gpu_cache.config.memory import run_memory_mb
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


#: A partition of nodes of 48 GB with two 3090s each (sinfo -h -e -o "%P|%m|%c|%G|%f|%l").
NODES_48G = tuple(cluster.parse("gpu*|48000|32|gpu:3090:2(S:0-1)|(null)|infinite\n"))
BUCKETS = [128, 256, 512, 768, 1024]


def af3_settings(**extra):
    from gpu_cache.config.settings import settings_from

    af3 = {"model_dir": "weights", "shapes": BUCKETS}
    config = {"workloads": {"alphafold3": af3},
              "gpu_types": {"3090": {"workloads": ["alphafold3"],
                                     "resources": {"slurm_partition": "gpu", "gpu": 1, "gpu_model": "3090"}},
                            "own": {"workloads": ["alphafold3"], "resources": {"mem_mb": 20000}}}}
    return settings_from(config | extra)


def test_warm_and_check_jobs_are_sized_from_one_process_per_bucket_and_fit_the_nodes():
    """Each run asks for what one process of it needs (gpu_cache.config.memory, measured); the
    check job runs one at a time (its largest), the warm job as many of the largest side by side
    as fit the largest node that can take the type (sinfo), and no more than warm.parallel."""
    settings = af3_settings()
    one = {n: run_memory_mb("alphafold3", True, n) for n in BUCKETS}
    sizes = placement.job_sizes(settings, "3090", NODES_48G)
    assert sizes.runs_mb == tuple(one[n] for n in BUCKETS) and sizes.budget_mb == 48000
    fit = max(k for k in range(1, 6) if sum(sorted(one.values(), reverse=True)[:k]) <= 48000)
    assert sizes.warm_parallel == fit and sizes.warm_mb == sum(sorted(one.values(), reverse=True)[:fit])
    assert sizes.check_mb == max(one.values()) and sizes.problems == ()
    # No cluster answers: all side by side (the runner still starts only what fits the job).
    assert placement.job_sizes(settings, "3090", ()).warm_parallel == 5
    two = placement.job_sizes(af3_settings(warm={"parallel": 2}), "3090", NODES_48G)
    assert two.warm_parallel == min(2, fit)
    # A type's own mem_mb is its jobs' and the budget of what runs at once.
    own = placement.job_sizes(settings, "own", NODES_48G)
    assert own.warm_mb == own.check_mb == own.budget_mb == 20000
    assert own.warm_parallel == max(1, max(k for k in range(1, 6)
                                           if sum(sorted(one.values(), reverse=True)[:k]) <= 20000))


def test_a_run_larger_than_every_node_is_named_with_the_key_that_fixes_it():
    budget = run_memory_mb("alphafold3", True, 1024) - 1
    small = tuple(cluster.parse(f"gpu*|{budget}|32|gpu:3090:2|(null)|infinite\n"))
    problems = placement.job_sizes(af3_settings(), "3090", small).problems
    over = [n for n in BUCKETS if run_memory_mb("alphafold3", True, n) > budget]
    assert [line.split(" at shape ")[1].split()[0] for line in problems] == [str(n) for n in over]
    assert problems[-1].startswith("GPU type 3090: one run of alphafold3 at shape 1024 needs ")
    assert problems[-1].endswith("its jobs would be refused; drop 1024 from workloads.alphafold3.shapes, "
                                 "or give gpu_types.3090 a partition of larger nodes")


def test_a_skipped_job_asks_for_little_memory_and_a_workload_of_unknown_size_for_none():
    from gpu_cache.config.settings import settings_from

    settings = af3_settings()
    check = placement.sized(settings, settings.gpu_types, "check", NODES_48G)
    assert check["3090"].resources["mem_mb"] == run_memory_mb("alphafold3", True, 1024)
    assert check["own"].resources["mem_mb"] == 20000  # the type's own value wins
    assert placement.resource("mem_mb", check["3090"], lambda: True) == placement.SKIPPED_MEM_MB
    # A workload of unknown size: no memory, so set for some types only, which Snakemake refuses.
    mixed = settings_from({"gpu_types": {"a": {"workloads": ["alphafold3"]}, "jax": {}}})
    assert placement.job_sizes(mixed, "jax", ()).warm_mb is None
    with pytest.raises(UsageError, match="mem_mb is set for some GPU types but not for jax"):
        placement.resource_names(placement.sized(mixed, mixed.gpu_types, "warm", ()))


def test_the_preflights_plan_is_what_the_jobs_read_and_it_is_planned_here_before(tmp_path):
    settings = af3_settings()
    report = tmp_path / "preflight.json"
    here = placement.planned_in(str(report), settings, "own")  # no report yet: planned here
    assert here["warm_mb"] == 20000 and here["skip"] is None
    report.write_text(json.dumps({"placement": {"own": {**here, "skip": "planned by the preflight"}}}))
    assert placement.planned_in(str(report), settings, "own")["skip"] == "planned by the preflight"
    report.write_text("{ not json")
    assert placement.planned_in(str(report), settings, "own") == here


def overlaps(log: str) -> int:
    """The most runs that were running at once, from their ``start``/``end`` lines."""
    running = most = 0
    for line in log.splitlines():
        running += {"start": 1, "end": -1}.get(line.split(" ")[0], 0)
        most = max(most, running)
    return most


@pytest.mark.parametrize("job_mb, at_once", [("1000", 1), ("1500", 2), (None, 3)])
def test_the_runner_starts_runs_side_by_side_only_while_they_fit_the_jobs_memory(tmp_path, job_mb, at_once):
    """Three runs of 600 MB each, three at a time at most: a job of 1000 MB runs them one after
    another, one of 1500 MB two at once; where the job's memory is not known, the machine's
    available memory bounds them (more than 1800 MB here)."""
    import os

    from gpu_cache.core.runner import Command, Plan, run_plan

    log = tmp_path / "log"
    template = f"echo start >> {log}; sleep 0.4; echo end >> {log}"
    plan = Plan("warm", "cpu", tuple(Command("w", n, template, 30.0, memory_mb=600) for n in range(3)),
                parallel=3)
    environ = {k: v for k, v in os.environ.items() if k not in ("SLURM_MEM_PER_NODE", "GPU_CACHE_ROOT")}
    if job_mb:
        environ["SLURM_MEM_PER_NODE"] = job_mb
    with open(tmp_path / "out", "w") as output:
        runs = run_plan(plan, output, environ).runs
    assert all(run.ok for run in runs)
    assert overlaps(log.read_text()) == at_once
