"""Pipelines whose jobs run in container images: warm in the jobs' own software, bind the
cache, catch a software mismatch.

Real Snakemake runs with ``--sdm apptainer``, through tests/bin/apptainer (a stand-in over
bwrap, see its docstring): each job runs in an isolated root with Python 3.9 and jax 0.4.30
(the host has Python 3.11 and jax 0.10.2), where only bound host paths are visible. The
cache root lies outside the stand-in's default binds, so a job sees it only when bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HOOK, PROFILE, SCRIPTS, SNAKEFILE, clean_environ, read_json, run_cli, run_snakemake

#: A job's program: three small jits, each a compile that the cache can serve.
PROGRAM = """
import jax, jax.numpy as jnp
for n in (3, 4, 5):
    print(float(jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.ones(n)).sum()))
"""

#: The host's own pipeline: one job in the image, no gpu-cache in the Snakefile (the profile
#: gives it the cache environment and the binds).
JOBS = """
rule all:
    input: "job.txt"

rule job:
    output: "job.txt"
    container: "{image}"
    shell: "GPU_CACHE_RULE=job python3 program.py > {{output}}"
"""


def pipeline(tmp_path: Path, image: str, warm_in_image: bool) -> tuple[Path, Path]:
    """A working directory with the program and a gpu-cache config whose one GPU type warms
    the program, in the image or on the host; and the config file."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "program.py").write_text(PROGRAM)
    (work / "Snakefile").write_text(JOBS.format(image=image))
    gpu_type = {"workloads": ["program"], "gpus": 0}
    if warm_in_image:
        gpu_type["container"] = image
    config = {"gpu_types": {"cpu": gpu_type},
              "workloads": {"program": {"command": "{python} program.py", "expects": ["jax"]}},
              "validate": {"measure_cold": False}}
    path = work / "gpu-cache.json"
    path.write_text(json.dumps(config))
    return work, path


def records_of(root: Path, rule: str) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((root / "records").glob("*.json"))]
    return [r for r in found if r.get("rule") == rule]


def test_warm_in_the_image_makes_the_images_jobs_hit(container_root, unbound_dir, tmp_path):
    root = unbound_dir / "cache"
    work, config = pipeline(tmp_path, container_root.image, warm_in_image=True)
    env = container_root.environ(GPU_CACHE_ROOT=str(root))
    warm = run_snakemake(work, "-s", SNAKEFILE, "--configfile", str(config), "--sdm", "apptainer",
                         "--cores", "1", env=env, timeout=600)
    assert warm.returncode == 0, warm.stderr[-3000:]
    verdict = read_json(work / "results" / "gpu-cache" / "validate" / "cpu.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["jax"]["hits"] >= 3 and verdict["misses"] == 0
    # Validated with the image's software, not the host's.
    assert verdict["software"]["python"] == container_root.python_version
    assert verdict["software"]["jax"] == container_root.jax_version
    assert verdict["software"]["image"]
    # The pipeline's own job, in the same image, through the profile only: every compile hits.
    jobs = run_snakemake(work, "--profile", PROFILE, "--sdm", "apptainer", "--cores", "1",
                         env=env, timeout=600)
    assert jobs.returncode == 0, jobs.stderr[-3000:]
    (record,) = records_of(root, "job")
    assert record["jax"]["hits"] == verdict["jax"]["hits"] and record["jax"]["misses"] == 0
    assert record["software"]["jax"] == container_root.jax_version
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    assert stats["software_mismatches"] == []
    # jax 0.4.30 logs neither hits nor misses: the startup hook names them from its cache reads,
    # so the next warm step can check that what validation hit is still there.
    (warmed,) = records_of(root, "warm_cache")
    assert len(warmed["jax"]["missed"]) == warmed["jax"]["misses"] >= 3 and not warmed["jax"]["hit_keys"]
    assert sorted(record["jax"]["hit_keys"]) == sorted(m["key"] for m in warmed["jax"]["missed"])


def test_warm_on_the_host_makes_the_images_jobs_miss_and_says_why(container_root, unbound_dir, tmp_path):
    root = unbound_dir / "cache"
    work, config = pipeline(tmp_path, container_root.image, warm_in_image=False)
    env = container_root.environ(GPU_CACHE_ROOT=str(root))
    warm = run_snakemake(work, "-s", SNAKEFILE, "--configfile", str(config), "--cores", "1",
                         env=env, timeout=600)
    assert warm.returncode == 0, warm.stderr[-3000:]
    verdict = read_json(work / "results" / "gpu-cache" / "validate" / "cpu.json")
    # The host passes its own validation, and the verdict names the software it validated.
    assert verdict["passed"] is True and verdict["software"]["image"] is None
    assert verdict["software"]["python"] != container_root.python_version
    jobs = run_snakemake(work, "--profile", PROFILE, "--sdm", "apptainer", "--cores", "1",
                         env=env, timeout=600)
    assert jobs.returncode == 0, jobs.stderr[-3000:]
    (record,) = records_of(root, "job")
    assert record["jax"]["hits"] == 0 and record["jax"]["misses"] >= 3
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(root)).stdout)
    (line,) = stats["software_mismatches"]
    # The image as the job saw it: Snakemake's local copy of the docker:// image.
    assert f"jax {container_root.jax_version}" in line and record["software"]["image"] in line
    assert "rule job" in line and f"0 of {record['jax']['misses']} hits" in line
    assert "software mismatch" in run_cli("stats", "--cache-root", str(root)).stdout
    prune = run_cli("prune", "--json", "--cache-root", str(root))
    assert json.loads(prune.stdout)["software_mismatches"] == [line]


HOST = """
import os

os.environ.setdefault("APPTAINER_BIND", "{before}")

module gpu_cache:
    snakefile: "{snakefile}"
    config: {{"validate": {{"measure_cold": False}}, "default_workloads": []}}

use rule * from gpu_cache as gpu_cache_*

os.environ.setdefault("APPTAINER_BINDPATH", "{after}")

rule all:
    input: "seen.txt"
    default_target: True

rule look:
    output: "seen.txt"
    container: "{image}"
    shell: "ls -d {before} {after} $GPU_CACHE_ROOT/jax > {{output}}"
"""


def test_a_hosts_binds_set_before_and_after_including_gpu_cache_are_kept(container_root, unbound_dir,
                                                                           tmp_path):
    before, after = unbound_dir / "before", unbound_dir / "after"
    before.mkdir()
    after.mkdir()
    root = unbound_dir / "cache"
    work = tmp_path / "host"
    work.mkdir()
    (work / "Snakefile").write_text(HOST.format(before=before, after=after, snakefile=SNAKEFILE,
                                                image=container_root.image))
    env = container_root.environ(GPU_CACHE_ROOT=str(root))
    result = run_snakemake(work, "--sdm", "apptainer", "--cores", "1", "seen.txt", env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = (work / "seen.txt").read_text().split()
    assert str(before) in seen and str(after) in seen and str(root / "jax") in seen


@pytest.mark.slow
def test_a_job_that_cannot_create_the_triton_folder_still_runs(tmp_path):
    # As in a read-only image where the cache root is not bound: Triton creates its folder at
    # start and raises. /proc takes no new folders, even for root.
    unusable = "/proc/gpu-cache-not-bound/triton"
    command = [sys.executable, "-m", "gpu_cache.workloads.triton_kernels", "--shape", "1000",
               "--mode", "aot"]
    bare = subprocess.run(command, env=clean_environ(TRITON_CACHE_DIR=unusable, TRITON_HOME=str(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    assert bare.returncode != 0  # plain Triton fails
    hooked = subprocess.run(command, env=clean_environ(
        TRITON_CACHE_DIR=unusable, TRITON_HOME=str(tmp_path), TMPDIR=str(tmp_path),
        PYTHONPATH=os.pathsep.join([str(HOOK), str(SCRIPTS)])), capture_output=True, text=True, timeout=300)
    assert hooked.returncode == 0, hooked.stderr[-2000:]
    assert "is the cache root bound into the container?" in hooked.stderr.lower()
    assert any((tmp_path / f"gpu-cache-{os.getuid()}" / "triton").iterdir())
