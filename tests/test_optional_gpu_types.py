"""A GPU type the partition may lack (optional: the default for a type with SLURM resources)
on a real SLURM cluster: a host job that may land on any GPU of the partition waits for every
type's verdict, and a type that SLURM cannot schedule is retried once without its GPU, marked
"unscheduled", and holds nothing back. The test cluster has fake h100 and a100 GPUs and no
h200."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, SNAKEFILE, clean_environ, read_json, run_cli

pytestmark = pytest.mark.slurm
TIMEOUT = 420

#: The host: one job on "any GPU of the partition", waiting for every type's verdict.
HOST = """
GPU_TYPES = list(config["gpu_cache"]["gpu_types"])


module gpu_cache:
    snakefile:
        config["gpu_cache_workflow"]
    config:
        config["gpu_cache"]


use rule * from gpu_cache as gpu_cache_*


GPU_CACHE_VALIDATIONS = expand(rules.gpu_cache_validate_cache.output.report, gpu_type=GPU_TYPES)


rule all:
    input:
        "predicted.txt",
        rules.gpu_cache_cache_report.output.summary,


rule predict:
    input:
        gpu_cache=GPU_CACHE_VALIDATIONS,
    output:
        "predicted.txt",
    resources:
        gres="gpu:1",
        runtime=5,
    shell:
        "GPU_CACHE_RULE={rule} {params.python} program.py > {output}"


use rule prune_cache from gpu_cache as gpu_cache_prune_cache with:
    input:
        validations=GPU_CACHE_VALIDATIONS,
        outputs="predicted.txt",
"""

PROGRAM = "import jax, jax.numpy as jnp\nprint(float(jax.jit(lambda x: jnp.sin(x) + 1)(jnp.ones(3)).sum()))\n"


def test_an_optional_type_slurm_cannot_schedule_is_unscheduled_and_holds_nothing_back(slurm_cluster,
                                                                                      tmp_path):
    work = tmp_path / "host"
    work.mkdir()
    (work / "Snakefile").write_text(HOST.replace("{params.python}", sys.executable))
    (work / "program.py").write_text(PROGRAM)
    # Neither says optional: a type that asks SLURM for a place is optional by default (#25).
    gpu_type = {"device": "cpu", "queue_wait": "10m", "workloads": ["program"]}
    config = {
        "gpu_cache_workflow": SNAKEFILE,
        "gpu_cache": {
            "gpu_types": {
                "h100": {**gpu_type, "resources": {"gres": "gpu:h100:1", "runtime": 5}},
                "h200": {**gpu_type, "resources": {"gres": "gpu:h200:1", "runtime": 5}},
            },
            "workloads": {"program": {"command": "{python} program.py", "expects": ["jax"]}},
            "validate": {"measure_cold": False, "strict": True},
        },
    }
    (work / "config.json").write_text(json.dumps(config))
    cache = tmp_path / "cache"
    env = clean_environ(GPU_CACHE_ROOT=str(cache), SLURM_CONF=slurm_cluster.env["SLURM_CONF"])
    command = [sys.executable, "-m", "snakemake", "--profile", str(REPO / "profiles" / "slurm"),
               "--configfile", str(work / "config.json"), "--retries", "0",
               "--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5", "--jobs", "4",
               "--nocolor"]
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = slurm_cluster.finish(process, TIMEOUT)
    assert process.returncode == 0, log[-5000:]
    results = work / "results" / "gpu-cache"
    # h100 exists: warmed and validated on its node, with the deadline SLURM accepted.
    h100 = read_json(results / "validate" / "h100.json")
    assert h100["status"] == "passed", h100["problems"]
    job_id = read_json(results / "warm" / "h100.json")["job"]["slurm_job_id"]
    rows = slurm_cluster.wait_accounted(job_id)
    assert "gres/gpu:h100=1" in rows[0]["AllocTRES"], rows
    submitted = slurm_cluster.run(["sacct", "-n", "-X", "-j", str(job_id), "-o", "SubmitLine%4000"]).stdout
    assert f"--deadline=now+{600 + 5 * 60}" in submitted, submitted
    # h200 does not: sbatch rejected its warm job; the retry asked for no GPU, ran no
    # workload and said so; its check asked for no GPU either.
    h200 = read_json(results / "validate" / "h200.json")
    assert h200["status"] == "unscheduled" and h200["passed"] is False
    assert h200["problems"][0].startswith("not validated: its warm job was not scheduled")
    warm = read_json(results / "warm" / "h200.json")
    assert warm["unscheduled"].startswith("its job did not finish on an H200 node") and warm["runs"] == []
    check = read_json(results / "check" / "h200.json")
    assert check["unscheduled"].startswith("its warm job was not scheduled")
    rows = slurm_cluster.wait_accounted(check["job"]["slurm_job_id"])
    assert "gres/gpu" not in rows[0]["AllocTRES"], rows
    # The host's job ran (strict validation does not fail for an unscheduled type), the
    # prune and the summary too.
    assert float(Path(work / "predicted.txt").read_text()) > 0
    summary = (results / "summary.txt").read_text()
    assert "h200: UNSCHEDULED (optional type)" in summary and "h100 on cpu: PASSED" in summary
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(cache)).stdout)
    assert stats["usage"]["by_rule"]["predict"]["jax_hits"] > 0


def test_doctor_names_the_clusters_gres_types_and_the_gpu_type_that_asks_for_each(slurm_cluster, tmp_path):
    """`gpu-cache doctor` where sinfo answers: each GPU GRES type of the partition, the
    configured type that asks for it (or that none does), and a type the partition lacks."""
    config = {"gpu_types": {
        "h100": {"device": "cpu", "resources": {"gres": "gpu:h100:1"}},
        "h200": {"device": "cpu", "resources": {"gpu": 1, "gpu_model": "h200"}},
    }}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    env = clean_environ(SLURM_CONF=slurm_cluster.env["SLURM_CONF"])
    done = run_cli("doctor", "--json", "--no-fail", "--config", str(path),
                   "--cache-root", str(tmp_path / "cache"), env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    partition = slurm_cluster.partition
    assert f"gpu:h100 (partition {partition}): GPU type h100 (device cpu)" in report["gres"]
    (a100,) = [line for line in report["gres"] if line.startswith("gpu:a100")]
    assert "no GPU type asks for it" in a100
    lacking = ("GPU type h200 asks for gpu:h200, which no partition offers: its jobs end "
               "unscheduled and hold nothing back")
    assert lacking in report["gres"] and lacking in report["warnings"]
    # Which cluster and configuration sinfo answered from (a node may read another's).
    assert report["slurm"] == f"cluster {slurm_cluster.cluster_name} (config {slurm_cluster.slurm_conf})"
    text = run_cli("doctor", "--no-fail", "--config", str(path), "--cache-root", str(tmp_path / "cache"),
                   env=env).stdout
    assert f"gres: gpu:h100 (partition {partition}): GPU type h100" in text
    assert f"slurm: sinfo answered for {report['slurm']}" in text
