"""The gpu-cache workflow and the example host pipeline through the SLURM profile on a real
two-node cluster (tests/harness/nodes.py): slurmctld on the head node, one slurmd on ``gcnode-a`` and one
on ``gcnode-b``, each node in its own network, UTS and mount namespaces, with its own ``/tmp``
and its own sshfs mount of the share that holds the working directory and the cache root.
Snakemake runs on the head, as on a login node. Each GPU type is sent to one node through its
``slurm_extra`` (``--nodelist``): h100 to ``gcnode-a``, a100 to ``gcnode-b``. Every job must run
on its node (its hostname, SLURM's NodeList), with its type's GRES, and see the shared root."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, SMALL, SNAKEFILE, clean_environ, host_copy, read_json

pytestmark = pytest.mark.slurm
TIMEOUT = 420
#: Where each GPU type's jobs are sent.
NODE_OF = {"h100": "gcnode-a", "a100": "gcnode-b"}


def send_types_to_nodes(gpu_types: dict) -> dict:
    """``gpu_types`` with each type's jobs pinned to its node of :data:`NODE_OF`."""
    for name, spec in gpu_types.items():
        spec.setdefault("resources", {})["slurm_extra"] = f"--nodelist={NODE_OF[name]}"
    return gpu_types


def run_pipeline(cluster, two_nodes, work: Path, cache: Path, *args: str) -> str:
    """The SLURM profile's snakemake in ``work`` (a path on the share), on the head node."""
    env = clean_environ(GPU_CACHE_ROOT=str(cache), SLURM_CONF=str(cluster.slurm_conf))
    command = [sys.executable, "-m", "snakemake", "--profile", str(REPO / "profiles" / "slurm"), *args,
               # A test cluster answers at once: poll sooner than a real site would.
               "--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5",
               "--jobs", "4", "--nocolor"]
    process = two_nodes.head.popen(command, cwd=work, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = cluster.finish(process, TIMEOUT, "the SLURM pipeline")
    assert process.returncode == 0, log[-5000:]
    return log


def assert_on_its_node(cluster, job_id: str, host: str, gpu_type: str) -> None:
    """The job ran on ``gpu_type``'s node (as the job saw its hostname and as SLURM accounts it),
    with that type's GPU and not the other's."""
    assert job_id, "the job did not run under SLURM"
    assert host == NODE_OF[gpu_type], (job_id, host, gpu_type)
    rows = cluster.wait_accounted(job_id, ["AllocTRES", "NodeList"])
    assert rows[0]["NodeList"] == NODE_OF[gpu_type], rows
    assert f"gres/gpu:{gpu_type}=1" in rows[0]["AllocTRES"], rows
    other = "a100" if gpu_type == "h100" else "h100"
    assert f"gres/gpu:{other}" not in rows[0]["AllocTRES"], rows


def test_gpu_cache_workflow_on_two_nodes(slurm_two_nodes, two_nodes):
    work, cache = two_nodes.shared / "workflow", two_nodes.shared / "workflow-cache"
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text()) | SMALL | {
        "validate": {"measure_cold": False},
        "gpu_types": send_types_to_nodes({
            gpu_type: {"device": "cpu", "resources": {"gres": f"gpu:{gpu_type}:1", "mem_mb": 1000,
                                                      "runtime": 10}}
            for gpu_type in NODE_OF}),
    }
    (two_nodes.host_path(work) / "config").mkdir(parents=True)
    (two_nodes.host_path(work) / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    run_pipeline(slurm_two_nodes, two_nodes, work, cache, "-s", SNAKEFILE)
    results = two_nodes.host_path(work) / "results" / "gpu-cache"
    for gpu_type in NODE_OF:
        warm = read_json(results / "warm" / f"{gpu_type}.json")
        assert_on_its_node(slurm_two_nodes, warm["job"]["slurm_job_id"], warm["job"]["host"], gpu_type)
        verdict = read_json(results / "validate" / f"{gpu_type}.json")
        assert verdict["passed"] is True and verdict["misses"] == 0, verdict["problems"]
        assert verdict["hits"] > 0
        assert verdict["cache_root"] == str(cache)  # the shared root, as every node mounts it
    # What the nodes wrote through their own mounts is on the storage node, whole.
    assert any(two_nodes.host_path(cache / "jax").glob("*-cache"))
    assert read_json(results / "prune.json")["jax"]["entries_before"] > 0


def test_host_pipeline_on_two_nodes(slurm_two_nodes, two_nodes):
    work = host_copy(two_nodes.host_path(two_nodes.shared / "pipeline"))
    config_file = work / "config" / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    send_types_to_nodes(config["gpu_cache"]["gpu_types"])
    config_file.write_text(yaml.safe_dump(config))
    work = two_nodes.shared / "pipeline" / "host"  # as the nodes see it
    cache = two_nodes.shared / "pipeline-cache"
    run_pipeline(slurm_two_nodes, two_nodes, work, cache,
                 "--config", f"gpu_cache_snakefile={SNAKEFILE}")
    results = two_nodes.host_path(work) / "results" / "gpu-cache"

    for gpu_type in NODE_OF:
        # The warm and validate jobs ran on their type's node, with their type's GRES.
        for step in ("warm", "validate"):
            report = read_json(results / step / f"{gpu_type}.json")
            assert_on_its_node(slurm_two_nodes, report["job"]["slurm_job_id"], report["job"]["host"],
                               gpu_type)
            assert report["device"]["visible_devices"], "SLURM gave the job a GPU"
        verdict = read_json(results / "validate" / f"{gpu_type}.json")
        assert verdict["passed"] is True, verdict["problems"]
        assert verdict["misses"] == 0 and verdict["hits"] > 0

    samples = yaml.safe_load(config_file.read_text())["samples"]
    predictions = sorted(two_nodes.host_path(work / "predictions").glob("*.json"))
    assert len(predictions) == 4
    for path in predictions:
        prediction = read_json(path)
        environment = prediction["environment"]
        # Each prediction ran on its sample's GPU type's node, where that type was warmed.
        assert_on_its_node(slurm_two_nodes, environment["SLURM_JOB_ID"], prediction["host"],
                           samples[path.stem]["gpu_type"])
        # The share is sshfs: each job works in its node's local tier over the shared root.
        assert environment["GPU_CACHE_SHARED"] == str(cache)
        assert environment["JAX_COMPILATION_CACHE_DIR"] == os.path.join(environment["GPU_CACHE_TIER"], "jax")
        assert environment["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
        assert prediction["cache"]["hits"] == prediction["cache"]["requests"] > 0

    # Pruning ran after the last prediction had finished.
    prune = results / "prune.json"
    assert prune.stat().st_mtime >= max(p.stat().st_mtime for p in predictions)
    assert read_json(prune)["jax"]["entries_before"] > 0
