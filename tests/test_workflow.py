"""Real Snakemake runs: the default workflow through the profile, and the profile on a stranger's workflow."""

import re

import pytest

from helpers import (
    PROFILE,
    REPO,
    SMALL,
    SNAKEFILE,
    clean_environ,
    read_json,
    run_cli,
    run_snakemake,
    workdir_with_config,
)

pytestmark = pytest.mark.slow  # every test here runs JAX or Snakemake for seconds

STRANGER = """
rule all:
    input: "env.txt"

rule dump:
    output: "env.txt"
    shell: "env | grep -E '^(JAX_|TRITON_|TORCHINDUCTOR_|CUDA_CACHE_|GPU_CACHE_ROOT)' | sort > {output}"
"""


def readme_summary() -> str:
    """The summary README.md shows for its first command (the block after "it printed:")."""
    text = (REPO / "README.md").read_text()
    return re.search(r"it printed[^\n]*:\n\n```\n(.*?)```", text, re.DOTALL).group(1)


def shape(line: str) -> str:
    """A summary line with its figures (counts, seconds, sizes) as ``#``, and the software it
    names as ``<software>`` (what is installed beside jax differs from machine to machine)."""
    line = re.sub(r"validated .* (on the host|in \S+)$", r"validated <software> \1", line)
    return re.sub(r"\d+(?:\.\d+)*(?: (?:B|KiB|MiB|GiB|TiB))?", "#", line)


def test_default_workflow_warms_validates_prunes_and_summarises(tmp_path):
    work = workdir_with_config(tmp_path, SMALL)
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    result = run_snakemake(work, "-s", SNAKEFILE, "--profile", PROFILE, "--cores", "2", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    results = work / "results" / "gpu-cache"
    verdict = read_json(results / "validate" / "cpu.json")
    assert verdict["passed"] is True and verdict["misses"] == 0, verdict["problems"]
    assert verdict["cache_root"] == str(tmp_path / "cache")
    prune = read_json(results / "prune.json")
    assert prune["jax"]["entries_before"] > 0 and prune["jax"]["dry_run"] is False
    # The prune checkpoint ran after validation, and the summary after pruning.
    assert (results / "prune.json").stat().st_mtime >= (results / "validate" / "cpu.json").stat().st_mtime
    summary = (results / "summary.txt").read_text()
    assert "cpu on cpu: PASSED" in summary and "jax cache:" in summary
    # The README's example is such a summary, line for line but for the figures.
    assert list(map(shape, summary.splitlines())) == list(map(shape, readme_summary().splitlines()))
    assert "PASSED" in result.stdout + result.stderr  # printed, not only written
    for log in ("preflight.log", "warm/cpu.log", "validate/cpu.log", "prune.log"):
        assert (work / "logs" / "gpu-cache" / log).exists()
    # Nothing left to do on a second run.
    again = run_snakemake(work, "-s", SNAKEFILE, "--profile", PROFILE, "--cores", "2", env=env)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_unusable_root_does_not_fail_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    work = workdir_with_config(tmp_path, SMALL | {"validate": {"measure_cold": False}})
    env = clean_environ(GPU_CACHE_ROOT=str(blocker / "cache"))
    result = run_snakemake(work, "-s", SNAKEFILE, "--profile", PROFILE, "--cores", "2", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = read_json(work / "results" / "gpu-cache" / "validate" / "cpu.json")
    assert verdict["passed"] is False
    assert any("cannot create" in p for p in verdict["problems"])
    assert result.stderr.count("gpu-cache: warning: jax: cannot create") == 1  # warned once


def test_installed_profile_exports_into_any_workflow(tmp_path):
    config_home = tmp_path / "xdg"
    env = clean_environ(XDG_CONFIG_HOME=str(config_home), GPU_CACHE_ROOT=str(tmp_path / "cache"),
                        TRITON_CACHE_DIR=str(tmp_path / "mine"))
    installed = run_cli("install-profile", env=env)
    assert installed.returncode == 0, installed.stderr
    work = tmp_path / "stranger"
    work.mkdir()
    (work / "Snakefile").write_text(STRANGER)
    # Run from elsewhere than the checkout, with gpu_cache not importable by default.
    env["PYTHONPATH"] = ""
    result = run_snakemake(work, "--profile", "gpu-cache", "--cores", "1", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = dict(line.split("=", 1) for line in (work / "env.txt").read_text().splitlines())
    cache = tmp_path / "cache"
    assert seen["JAX_COMPILATION_CACHE_DIR"] == str(cache / "jax")
    assert seen["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")
    assert seen["CUDA_CACHE_PATH"] == str(cache / "cuda")
    assert seen["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert seen["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    assert seen["TRITON_CACHE_DIR"] == str(tmp_path / "mine")  # the user's own value wins
    assert "keeping your TRITON_CACHE_DIR" in result.stderr  # and is reported


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["-n"], ["-np"], ["--dry-run", "--quiet"]])
def test_a_dry_run_with_the_installed_profile_creates_no_cache_folder(tmp_path, flags):
    home = tmp_path / "home"
    home.mkdir()
    env = clean_environ(HOME=str(home))
    for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "GPU_CACHE_ROOT"):
        env.pop(name, None)
    assert run_cli("install-profile", env=env).returncode == 0
    work = workdir_with_config(tmp_path, SMALL)
    result = run_snakemake(work, "-s", SNAKEFILE, "--profile", "gpu-cache", *flags, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (home / ".cache" / "gpu-cache").exists(), "a dry run created the cache root"
    assert not list(tmp_path.glob("**/gpu-cache-*")), "a dry run created a node-local folder"


def test_profile_with_caching_off_switches_jax_off(tmp_path):
    work = tmp_path / "stranger"
    work.mkdir()
    (work / "Snakefile").write_text(STRANGER)
    env = clean_environ(GPU_CACHE_ROOT="none")
    result = run_snakemake(work, "--profile", PROFILE, "--cores", "1", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = (work / "env.txt").read_text()
    assert "JAX_COMPILATION_CACHE_DIR" not in seen
    assert "JAX_ENABLE_COMPILATION_CACHE=false" in seen
    assert "caching is turned off" in result.stderr

