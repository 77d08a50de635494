"""Where a GPU type's warm and check jobs run (gpu_cache.config.placement, which the workflow's
common.smk wires into its rules): resources, the --deadline, the unscheduled skip, the retry."""

from __future__ import annotations

import json

import pytest
import yaml

from gpu_cache.config import cluster, placement
from gpu_cache.config.memory import run_memory_mb
from gpu_cache.config.settings import GpuType
from gpu_cache.config.units import format_size
from gpu_cache.core.errors import UsageError
from helpers import REPO, SNAKEFILE, fake_sinfo, run_cli, run_snakemake, workdir_with_config, write_config


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
    assert why.startswith("its job did not finish on an H200 node within gpu_types.h200.queue_wait")
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


def test_the_buckets_that_fit_are_warmed_and_one_no_node_can_take_is_named():
    """A bucket larger than every node that can take the type left the whole type unwarmed (its
    warm job asked for it, and SLURM refused the job): the jobs leave it out (warm, cold and
    validate passes) and warm the others, and one line names it with the key that fixes it."""
    budget = run_memory_mb("alphafold3", True, 1024) - 1
    small = tuple(cluster.parse(f"gpu*|{budget}|32|gpu:3090:2|(null)|infinite\n"))
    settings = af3_settings()
    sizes = placement.job_sizes(settings, "3090", small)
    assert sizes.left_out == (("alphafold3", 1024),)
    assert sizes.runs_mb == tuple(run_memory_mb("alphafold3", True, n) for n in BUCKETS[:-1])
    assert sizes.check_mb == run_memory_mb("alphafold3", True, 768) and sizes.warm_mb <= budget
    (problem,) = sizes.problems
    assert problem == (f"GPU type 3090: one run of alphafold3 at shape 1024 needs 13.6 GiB, more than the "
                       f"largest node that can take it has ({format_size(budget << 20)}): it is left out of "
                       "the type's warm and check jobs (its other runs are warmed), and jobs of that shape "
                       "compile for themselves; drop 1024 from workloads.alphafold3.shapes, or give "
                       "gpu_types.3090 a partition of larger nodes")
    planned = json.loads(json.dumps(sizes.as_dict()))  # as the preflight's report has it
    for phase in ("warm", "cold", "validate"):
        plan = placement.job_plan(settings, "3090", phase, planned)
        assert [c.shape for c in plan.commands] == BUCKETS[:-1]
    # No bucket fits: none is left out (an empty warm would prove nothing); the jobs ask for
    # what they need, SLURM refuses them and the verdict says why.
    tiny = tuple(cluster.parse("gpu*|1000|32|gpu:3090:2|(null)|infinite\n"))
    none = placement.job_sizes(settings, "3090", tiny)
    assert none.left_out == () and none.check_mb == run_memory_mb("alphafold3", True, 1024)
    assert len(none.problems) == 5 and all("its jobs would be refused; drop" in p for p in none.problems)


def test_a_mem_mb_larger_than_every_node_that_can_take_the_type_is_named():
    """A type's own mem_mb larger than every node passed doctor ("result: ok") and showed only in
    the summary, after the pipeline ran cold; whatever its workloads (sizes known or not)."""
    resources = {"slurm_partition": "gpu", "gpu": 1, "gpu_model": "3090", "mem_mb": 64000}
    settings = af3_settings(gpu_types={"big": {"workloads": ["alphafold3"], "resources": resources},
                                       "jax": {"resources": resources}})
    said = ("GPU type {}: its resources.mem_mb asks for 62.5 GiB, more than the largest node that can take "
            "it has (46.9 GiB): SLURM refuses its warm and check jobs; lower gpu_types.{}.resources.mem_mb")
    for name in ("big", "jax"):
        assert placement.job_sizes(settings, name, NODES_48G).problems[0] == said.format(name, name)
    assert placement.sizing_problems(settings, NODES_48G) == [said.format(n, n) for n in ("big", "jax")]
    assert placement.sizing_problems(af3_settings(), NODES_48G) == []


#: AlphaPulldown's default --buckets (alphapulldown/scripts/run_structure_prediction.py, 2.6.2).
ALPHAPULLDOWN_BUCKETS = [128, 256, 512, 768, 1024, 1280, 1536, 2048, 2560, 3072, 3584, 4096, 4608, 5120]


def test_on_48_gb_nodes_alphapulldowns_buckets_from_3584_tokens_are_left_out():
    """AlphaFold 3's pair stack grows with the square of the tokens: on 48 GB nodes the buckets up
    to 3072 tokens are warmed, those from 3584 on (55 GB, 66 GB at 4096) are not."""
    settings = af3_settings(workloads={"alphafold3": {"shapes": ALPHAPULLDOWN_BUCKETS}})
    sizes = placement.job_sizes(settings, "3090", NODES_48G)
    assert [shape for _, shape in sizes.left_out] == [3584, 4096, 4608, 5120]
    assert sizes.check_mb == run_memory_mb("alphafold3", True, 3072) <= 48000


def test_a_runs_memory_covers_the_measured_peaks_and_the_pair_representation():
    """The estimate of one run (gpu_cache.config.memory) against what was measured (the CPU runs of
    tests/benchmarks/results) and what AlphaFold 3 must hold: its pair representation, tokens x
    tokens x 128 channels of float32, held at least twice (a block's input and output)."""
    from gpu_cache.config import memory

    measured = json.loads((REPO / "tests" / "benchmarks" / "results" / "cpu_alphafold3_memory.json")
                          .read_text())
    for run in measured["runs"]:
        estimate = run_memory_mb("alphafold3", True, run["bucket"])
        assert run["peak_rss_mb"] <= estimate <= 1.3 * run["peak_rss_mb"], run
    for tokens in (1024, 2048, 4096, 5120):
        linear = memory.SAFETY * (memory.AF3_BASE_MB + memory.AF3_PER_TOKEN_MB * tokens)
        pair_mb = tokens * tokens * 128 * 4 / 2**20
        assert run_memory_mb("alphafold3", True, tokens) - linear >= 2 * pair_mb, tokens


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


# --- what doctor, a dry run and the start of a run say ---------------------------------------

#: A partition of 48 GB nodes with two A100s each.
SINFO_48G = "echo 'gpu*|48000|16|gpu:a100:2(S:0-1)|(null)|infinite'"
A100 = {"slurm_partition": "gpu", "gpu": 1, "gpu_model": "a100"}


def sizing_config(*buckets: object, mem_mb: int | None = None) -> dict:
    """An alphafold3 type on the A100s at ``buckets``, and with ``mem_mb`` a type of its own."""
    types = {"a100": {"workloads": ["alphafold3"], "device": "cpu", "resources": A100}}
    if mem_mb:
        types["big"] = {"device": "cpu", "resources": {**A100, "mem_mb": mem_mb}}
    return {"gpu_types": types, "workloads": {"alphafold3": {"shapes": list(buckets)}}}


def test_doctor_names_a_mem_mb_and_a_bucket_no_node_can_take_as_problems(tmp_path):
    """A mem_mb larger than every node passed doctor ("result: ok"), and an oversized bucket was
    a warning: both are PROBLEMs (exit 1 without --no-fail), the type's placement one line."""
    environ = fake_sinfo(tmp_path / "bin", SINFO_48G)
    config = write_config(tmp_path / "c.yaml", sizing_config(128, 256, 4096, mem_mb=64000))
    args = ("doctor", "--config", str(config), "--cache-root", str(tmp_path / "c"))
    done = run_cli(*args, env=environ)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    problems = [line for line in lines if line.startswith("  PROBLEM: ")]
    assert [p.split(":")[1] for p in problems] == [" GPU type a100", " GPU type big"], problems
    assert problems[0].startswith("  PROBLEM: GPU type a100: one run of alphafold3 at shape 4096 needs "
                                  "64.5 GiB, more than the largest node that can take it has (46.9 GiB): "
                                  "it is left out")
    assert problems[1].startswith("  PROBLEM: GPU type big: its resources.mem_mb asks for 62.5 GiB")
    (placed,) = [line for line in lines if line.startswith("placement: ")]
    assert placed == ("placement: a100: warm runs 2 of its 2 runs at once in 10.1 GiB of 46.9 GiB (1 left "
                      "out: PROBLEM below); check one at a time in 5.6 GiB")
    assert lines[-1] == "result: some jobs cannot run as configured (PROBLEM above)"
    report = json.loads(run_cli(*args, "--json", "--no-fail", env=environ).stdout)
    assert report["problems"] == [p.removeprefix("  PROBLEM: ") for p in problems] and report["ok"] is False
    assert report["placement"]["a100"]["left_out"] == [["alphafold3", 4096]]
    ok = write_config(tmp_path / "ok.yaml", sizing_config(128, 256))
    fine = run_cli("doctor", "--config", str(ok), "--cache-root", str(tmp_path / "c"), env=environ)
    assert fine.returncode == 0 and fine.stdout.splitlines()[-1] == "result: ok", fine.stdout[-2000:]


def test_a_bucket_is_a_whole_number_of_tokens_from_1_to_100000():
    settings = af3_settings(workloads={"alphafold3": {"shapes": [1, "100000"]}})
    sizes = placement.job_sizes(settings, "3090", ())
    assert sizes.runs_mb == (run_memory_mb("alphafold3", True, 1), run_memory_mb("alphafold3", True, 100000))
    assert run_memory_mb("alphafold3", True, 1) == 3447 and run_memory_mb("jax-transformer", True, 32) is None
    for bucket in (100001, "100001", 0, 128.0):
        with pytest.raises(UsageError, match=r"shapes: .* is no bucket: a bucket is a whole number of "):
            placement.job_sizes(af3_settings(workloads={"alphafold3": {"shapes": [bucket]}}), "3090", ())


@pytest.mark.parametrize("bucket", ["²", 10 ** 3999, 0, "12.5"],
                         ids=["superscript two", "4000 digits", "zero", "a fraction"])
def test_a_bucket_that_is_no_whole_number_of_tokens_is_one_line(bucket, tmp_path):
    """"²" is a digit to str.isdigit and no number to int; 4,000 digits overflowed a float:
    doctor ended in tracebacks."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(sizing_config(128, bucket)))
    done = run_cli("doctor", "--config", str(config), "--cache-root", str(tmp_path / "c"),
                   env=fake_sinfo(tmp_path / "bin", SINFO_48G))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpu-cache: error: config key workloads.alphafold3.shapes: ") and line.endswith(
        " is no bucket: a bucket is a whole number of tokens from 1 to 100000"), line
    assert len(line) < 200


@pytest.mark.slow
def test_a_dry_run_names_the_problems_and_warms_the_buckets_that_fit(tmp_path):
    """Before any job (the dry run's parse, as a run's), one PROBLEM line each; the warm and
    check jobs leave the oversized bucket out and keep the others. A bucket that is no number is
    one line."""
    work = workdir_with_config(tmp_path, sizing_config(128, 256, 4096, mem_mb=64000))
    environ = fake_sinfo(tmp_path / "bin", SINFO_48G)
    environ["GPU_CACHE_ROOT"] = str(tmp_path / "cache")
    dry = run_snakemake(work, "-s", SNAKEFILE, "-n", "-p", env=environ)
    assert dry.returncode == 0, dry.stderr[-3000:]
    said = [line for line in dry.stderr.splitlines() if line.startswith("gpu-cache: PROBLEM: ")]
    assert [line.split(":")[2] for line in said] == [" GPU type a100", " GPU type big"], said
    assert "one run of alphafold3 at shape 4096 needs" in said[0] and "mem_mb asks for 62.5 GiB" in said[1]
    (warm,) = [job for job in dry.stdout.split("\nrule ")
               if job.startswith("warm_cache:") and "gpu_type=a100" in job]
    assert '"shape": 128' in warm and '"shape": 256' in warm and '"shape": 4096' not in warm, warm
    both = run_memory_mb("alphafold3", True, 128) + run_memory_mb("alphafold3", True, 256)
    assert f"mem_mb={both}," in warm
    work = workdir_with_config(tmp_path / "bad", sizing_config(128, "²"))
    bad = run_snakemake(work, "-s", SNAKEFILE, "-n", env=environ)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "gpu-cache: config: config key workloads.alphafold3.shapes: '²' is no bucket: a bucket is a whole "
        "number of tokens from 1 to 100000"], bad.stderr[-3000:]
