"""Never silently cold, on a real SLURM cluster (issue 49): a node of 16000 MB with two GPUs of
one model (``gpu:3090:2``, fake GRES devices) besides an h100 and an a100 (tests/conftest.py).

- A second folder on the same cache root skips its warm whichever 3090 its jobs get: the warm
  job is planned to run nothing and asks for no GPU, and the check job, on the other 3090,
  confirms the first folder's verdict (the skip's identity is the GPU's model, not its index).
- A warm job SLURM refuses (more memory than any node has) is a failed warm: the verdict says
  FAILED with the reason and the key that fixes it, and the run exits non-zero; a type no node
  offers stays UNSCHEDULED.
- ``gpu-cache doctor`` and the run's start name a type no node can take as its type (no GPU
  resources at all), whatever its resources say.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import REPO, SMALL, SNAKEFILE, clean_environ, read_json, run_cli

pytestmark = pytest.mark.slurm
PROFILE = REPO / "profiles" / "slurm"
TIMEOUT = 420


def slurm_workflow(cluster, work: Path, cache: Path, config: dict, *args: str) -> subprocess.CompletedProcess:
    """gpu-cache's workflow in ``work`` through its SLURM profile on ``cluster``."""
    (work / "config").mkdir(parents=True, exist_ok=True)
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    env = clean_environ(GPU_CACHE_ROOT=str(cache), SLURM_CONF=cluster.env["SLURM_CONF"])
    command = [sys.executable, "-m", "snakemake", "-s", SNAKEFILE, "--profile", str(PROFILE),
               "--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5",
               "--jobs", "4", "--nocolor", *args]
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    log = cluster.finish(process, TIMEOUT)
    return subprocess.CompletedProcess(command, process.returncode, log, "")


def config_of(gpu_types: dict) -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text()) | SMALL | {
        "validate": {"measure_cold": False}, "gpu_types": gpu_types}


THE_3090 = {"3090": {"device": "cpu", "resources": {"gres": "gpu:3090:1", "runtime": 10, "mem_mb": 1000}}}


def hold_gpu(cluster, index: str) -> list[int]:
    """Jobs that hold the node's 3090s until one holds CUDA_VISIBLE_DEVICES ``index`` (the others
    are cancelled): the id of the one that holds it."""
    held = []
    for attempt in range(2):
        out = cluster.workdir / f"hold-{attempt}.out"
        held.append(cluster.sbatch(f"#!/bin/sh\necho $CUDA_VISIBLE_DEVICES > {out}\nsleep 600\n",
                                   "--gres=gpu:3090:1"))
        deadline = time.monotonic() + 30
        while not (out.is_file() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if out.is_file() and out.read_text().strip() == index:
            for other in held[:-1]:
                cluster.run(["scancel", str(other)])
            return held[-1:]
    for job in held:
        cluster.run(["scancel", str(job)])
    pytest.fail(f"no job got the 3090 with CUDA_VISIBLE_DEVICES {index}")


def test_a_second_folder_skips_its_warm_whichever_3090_its_jobs_get(slurm_cluster, tmp_path):
    cache = tmp_path / "cache"
    one = slurm_workflow(slurm_cluster, tmp_path / "one", cache, config_of(THE_3090))
    assert one.returncode == 0, one.stdout[-5000:]
    results = tmp_path / "one" / "results" / "gpu-cache"
    assert read_json(results / "validate" / "3090.json")["status"] == "passed"
    first = read_json(results / "check" / "3090.json")  # one pass (no cold pass): its result alone
    first = (first if first.get("phase") == "validate" else first["validate"])["device"]["visible_devices"]
    held = hold_gpu(slurm_cluster, first)  # the second folder's jobs get the other 3090
    try:
        two = slurm_workflow(slurm_cluster, tmp_path / "two", cache, config_of(THE_3090))
    finally:
        for job in held:
            slurm_cluster.run(["scancel", str(job)])
    assert two.returncode == 0, two.stdout[-5000:]
    results = tmp_path / "two" / "results" / "gpu-cache"
    warm = read_json(results / "warm" / "3090.json")
    assert warm["skipped"].startswith("the last validation of the same workloads") and warm["runs"] == []
    # The planned skip asked SLURM for no GPU (nor the type's memory).
    rows = slurm_cluster.wait_accounted(warm["job"]["slurm_job_id"], ["AllocTRES", "ReqMem"])
    assert "gres/gpu" not in rows[0]["AllocTRES"], rows
    # The check job got the other 3090 and confirmed the verdict there: nothing warmed again.
    check = read_json(results / "check" / "3090.json")
    assert check["validate"]["device"]["visible_devices"] not in (None, first), check["validate"]["device"]
    assert check["warm"]["skipped"] and check["warm"]["runs"] == [], check["warm"]
    verdict = read_json(results / "validate" / "3090.json")
    assert verdict["status"] == "passed" and verdict["new_entries"] == 0, verdict["problems"]
    assert any("the check job confirmed that verdict on its node" in note for note in verdict["notes"])


def test_a_warm_slurm_refuses_for_its_memory_fails_the_run_with_the_key(slurm_cluster, tmp_path):
    """A type asks for more memory than the 16000 MB node has: named before any job, SLURM
    refuses its warm job at once, and the verdict says FAILED (not UNSCHEDULED) with the reason
    and the key; an h200, which no node offers, stays UNSCHEDULED; the run exits non-zero."""
    asks = {"runtime": 10, "mem_mb": 1000}
    gpu_types = {"3090": {"device": "cpu", "resources": {**asks, "gres": "gpu:3090:1", "mem_mb": 20000}},
                 "h200": {"device": "cpu", "resources": {**asks, "gres": "gpu:h200:1"}}}
    run = slurm_workflow(slurm_cluster, tmp_path / "work", tmp_path / "cache", config_of(gpu_types))
    assert run.returncode != 0, run.stdout[-5000:]
    before = run.stdout[:run.stdout.index("Building DAG of jobs")]
    assert ("gpu-cache: PROBLEM: GPU type 3090: its resources.mem_mb asks for 19.5 GiB, more than the "
            "largest node that can take it has (15.6 GiB): SLURM refuses its warm and check jobs") in before
    results = tmp_path / "work" / "results" / "gpu-cache"
    verdict = read_json(results / "validate" / "3090.json")
    assert verdict["status"] == "failed" and verdict["passed"] is False
    said = ("SLURM refused its warm job: it asked for 19.5 GiB of memory, and the nodes of partition "
            f"{slurm_cluster.partition} that offer gpu:3090 have at most 15.6 GiB (SLURM: ")
    assert verdict["not_warmed"].startswith(said), verdict["not_warmed"]
    assert verdict["not_warmed"].endswith("lower gpu_types.3090.resources.mem_mb to what such a node has")
    assert read_json(results / "validate" / "h200.json")["status"] == "unscheduled"
    # The summary job prints the summary, then fails (so Snakemake keeps no summary.txt).
    assert "  3090: FAILED: not warmed\n" in run.stdout and "h200: UNSCHEDULED (optional type)" in run.stdout
    assert "gpu-cache: ERROR: GPU type 3090: not warmed: SLURM refused its warm job" in run.stdout


def test_doctor_and_the_run_name_a_type_no_node_can_take_as_its_own(slurm_cluster, tmp_path):
    """h100 with no resources at all, while the cluster answers: named by doctor and by a dry
    run (its jobs would run on any node, or here, and see no h100)."""
    config = {"gpu_types": {"h100": {}, "3090": {"device": "cpu", "resources": {"gres": "gpu:3090:1"}}}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    env = clean_environ(SLURM_CONF=slurm_cluster.env["SLURM_CONF"])
    said = ("GPU type h100 asks SLURM for no GPU of a type (its resources name neither a gpu_model "
            "nor a typed gres): its warm and check jobs may run on a node without an H100")
    report = json.loads(run_cli("doctor", "--json", "--no-fail", "--config", str(path),
                                "--cache-root", str(tmp_path / "cache"), env=env).stdout)
    assert [w for w in report["warnings"] if w.startswith("GPU type")] == [
        w for w in report["warnings"] if w.startswith(said)], report["warnings"]
    work = tmp_path / "work"
    dry = slurm_workflow(slurm_cluster, work, tmp_path / "cache", config_of(config["gpu_types"]), "-n")
    assert dry.returncode == 0, dry.stdout[-3000:]
    (line,) = [line for line in dry.stdout.splitlines() if line.startswith("gpu-cache: warning: GPU type")]
    assert line.startswith(f"gpu-cache: warning: {said}"), line
    assert "rule warm_cache:" in dry.stdout
