"""The example host pipeline through the SLURM profile on a real single-node cluster with
fake h100 and a100 GPUs: per-type warm jobs with their GRES, the cache environment in every
SLURM job, validation per type, pruning last."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, clean_environ, read_json

pytestmark = pytest.mark.slurm
TIMEOUT = 420


def run_pipeline(cluster, work: Path, cache: Path) -> str:
    env = clean_environ(GPU_CACHE_ROOT=str(cache), SLURM_CONF=cluster.env["SLURM_CONF"])
    command = [sys.executable, "-m", "snakemake", "--profile", str(REPO / "profiles" / "slurm"),
               "--config", f"gpu_cache_snakefile={REPO / 'workflow' / 'Snakefile'}",
               # A one-node test cluster answers at once: poll sooner than a real site would.
               "--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5",
               "--jobs", "4", "--nocolor"]
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        log, _ = process.communicate()
        cluster.run(["scancel", "--full", "-p", cluster.partition], check=False)
        pytest.fail(f"the SLURM pipeline did not finish in {TIMEOUT} s:\n{log[-5000:]}")
    assert process.returncode == 0, log[-5000:]
    return log


def test_host_pipeline_on_slurm_per_gpu_type(slurm_cluster, tmp_path):
    work = tmp_path / "host"
    shutil.copytree(REPO / "tests" / "example_host", work,
                    ignore=shutil.ignore_patterns(".snakemake", "results", "logs", "predictions"))
    cache = tmp_path / "cache"
    run_pipeline(slurm_cluster, work, cache)
    results = work / "results" / "gpu-cache"

    for gpu_type in ("h100", "a100"):
        # The warm and validate jobs ran under SLURM with their type's GRES.
        for step in ("warm", "validate"):
            report = read_json(results / step / f"{gpu_type}.json")
            job_id = report["job"]["slurm_job_id"]
            assert job_id, f"{step} of {gpu_type} did not run under SLURM"
            rows = slurm_cluster.wait_accounted(job_id)
            assert f"gres/gpu:{gpu_type}=1" in rows[0]["AllocTRES"], rows
            other = "a100" if gpu_type == "h100" else "h100"
            assert f"gres/gpu:{other}" not in rows[0]["AllocTRES"], rows
            assert report["device"]["visible_devices"], "SLURM gave the job a GPU"
        verdict = read_json(results / "validate" / f"{gpu_type}.json")
        assert verdict["passed"] is True, verdict["problems"]
        assert verdict["misses"] == 0 and verdict["hits"] > 0

    predictions = sorted((work / "predictions").glob("*.json"))
    assert len(predictions) == 4
    for path in predictions:
        prediction = read_json(path)
        environment = prediction["environment"]
        assert environment["SLURM_JOB_ID"], "the prediction ran under SLURM"
        assert environment["JAX_COMPILATION_CACHE_DIR"] == str(cache / "jax")
        assert environment["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
        assert prediction["cache"]["hits"] == prediction["cache"]["requests"] > 0

    # Pruning ran after the last prediction had finished.
    prune = results / "prune.json"
    assert prune.stat().st_mtime >= max(p.stat().st_mtime for p in predictions)
    assert read_json(prune)["jax"]["entries_before"] > 0
