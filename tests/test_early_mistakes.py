"""A newcomer's first steps and mistakes, each answered with one line (#41): a config key that
is not gpu-cache's under `snakemake -n` or a run (not Snakemake's schema dump), a GPU type that
no partition offers and this machine is not (the dry run and doctor name it), `gpu-cache
summary` in a folder with results, `warm` and `validate` saying what they run before they
start, and the target that only warms. Real Snakemake runs and the real CLI."""

from __future__ import annotations

import json
import os
import re

import pytest

from gpu_cache import __version__
from gpu_cache.core import kinds
from gpu_cache.reports import KindCounts, Verdict
from helpers import SNAKEFILE, clean_environ, run_cli, run_snakemake, workdir_with_config, write_config

#: What the GPU type a100 is told on a machine without an a100 and without a cluster.
NO_A100 = ("GPU type a100: no SLURM cluster answers here (sinfo) and this machine's device is cpu, "
           "not a100: its warm and check jobs would run here and its validation fail")


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["-n"], ["--cores", "1"]])
def test_a_key_that_is_not_gpu_caches_is_one_line_naming_it(tmp_path, flags):
    work = workdir_with_config(tmp_path, {"gpu_typos": {"a100": {}}})
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    done = run_snakemake(work, "-s", SNAKEFILE, *flags, env=env)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "gpu-cache: config: config key gpu_typos: not a key of gpu-cache's config; did you mean "
        "gpu_types? (config/README.md explains each)"], done.stderr
    assert not (tmp_path / "cache").exists()


def no_cluster_environ(tmp_path, **extra: str) -> dict[str, str]:
    """A clean environment whose ``sinfo`` fails, as where no cluster answers: the tests' own
    SLURM cluster may be up meanwhile (another worker's), and Snakemake's SLURM plugin wants the
    other SLURM commands on PATH."""
    folder = tmp_path / "no-cluster"
    folder.mkdir(exist_ok=True)
    (folder / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: no cluster' >&2\nexit 1\n")
    (folder / "sinfo").chmod(0o755)
    environ = clean_environ(**extra)
    environ["PATH"] = f"{folder}{os.pathsep}{environ['PATH']}"
    return environ


@pytest.mark.slow
def test_a_gpu_type_no_partition_offers_and_no_device_here_is_named_before_the_run(tmp_path):
    config = {"gpu_types": {"a100": {}}, "workloads": {"jax-transformer": {"shapes": [16]}}}
    work = workdir_with_config(tmp_path, config)
    env = no_cluster_environ(tmp_path, GPU_CACHE_ROOT=str(tmp_path / "cache"))
    dry = run_snakemake(work, "-s", SNAKEFILE, "-n", env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    (line,) = [line for line in dry.stderr.splitlines() if line.startswith("gpu-cache: warning: ")]
    assert line.startswith(f"gpu-cache: warning: {NO_A100}"), line
    # A type this machine is (cpu) is named by nobody.
    work = workdir_with_config(tmp_path / "here", config | {"gpu_types": {"a100": {"device": "cpu"}}})
    dry = run_snakemake(work, "-s", SNAKEFILE, "-n", env=env)
    assert dry.returncode == 0 and "gpu-cache: warning:" not in dry.stderr, dry.stderr[-3000:]


def test_doctor_names_a_gpu_type_no_partition_offers_and_no_device_here_is(tmp_path):
    path = write_config(tmp_path / "config.yaml", {"gpu_types": {"a100": {}, "here": {"device": "cpu"}}})
    root = str(tmp_path / "cache")
    environ = no_cluster_environ(tmp_path)
    done = run_cli("doctor", "--json", "--no-fail", "--config", str(path), "--cache-root", root, env=environ)
    assert done.returncode == 0, done.stderr
    warnings = json.loads(done.stdout)["warnings"]
    assert [w for w in warnings if w.startswith("GPU type ")] == [
        next(w for w in warnings if w.startswith(NO_A100))]


def test_summary_prints_the_verdicts_of_a_run_in_this_folder(tmp_path):
    results = tmp_path / "results" / "gpu-cache"
    (results / "validate").mkdir(parents=True)
    counts = {kind.name: KindCounts(hits=3) for kind in kinds.OBSERVED}
    verdict = Verdict(gpu_type="cpu", device={"name": "cpu"}, passed=True, cold_seconds=4.0,
                      warm_seconds=1.0, problems=[], kinds=counts, status="passed")
    (results / "validate" / "cpu.json").write_text(json.dumps(verdict.as_dict()))
    pruned = run_cli("prune", "--cache-root", str(tmp_path / "c"), "--output", str(results / "prune.json"))
    assert pruned.returncode == 0, pruned.stderr
    done = run_cli("summary", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"gpu-cache {__version__} summary" and lines[1].startswith("  cpu on cpu: PASSED: ")
    assert "  jax cache: 0 B in 0 entries after pruning (removed 0, 0 B)" in lines
    empty = run_cli("summary", cwd=tmp_path / "results")
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1
    assert "no verdicts here (results/gpu-cache/validate/*.json)" in empty.stderr


@pytest.mark.parametrize("command, passes", [
    ("warm", "each run in a fresh process"),
    ("validate", "each run in a fresh process, first with every cache off, then on the cache"),
])
def test_warm_and_validate_say_what_they_run_before_they_start(tmp_path, command, passes):
    config = {"default_workloads": ["hello"], "workloads": {"hello": {"command": "echo hello {shape}",
                                                                      "shapes": [1, 2]}}}
    path = write_config(tmp_path / "config.yaml", config)
    root = tmp_path / "cache"
    out = str(tmp_path / "out.json")
    done = run_cli(command, "--config", str(path), "--cache-root", str(root), "--output", out)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"gpu-cache {command}: GPU type cpu: hello at shapes 1, 2; {passes}; cache root {root}"
    assert any(line.startswith("$ echo hello") for line in lines[1:]), lines


@pytest.mark.slow
def test_the_warm_target_warms_and_validates_only(tmp_path):
    work = workdir_with_config(tmp_path, {})
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    dry = run_snakemake(work, "-s", SNAKEFILE, "-n", "warm", env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    jobs = dict(re.findall(r"^(\S+)\s+(\d+)$", dry.stdout, re.MULTILINE))
    assert jobs == {"preflight_cache": "1", "warm_cache": "1", "check_cache": "1", "validate_cache": "1",
                    "warm": "1", "total": "5"}, dry.stdout
