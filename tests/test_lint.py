"""The linters as tests: ruff on the Python, snakefmt and `snakemake --lint` on the workflow and the
example host. Each runs as a real subprocess and a failure shows what it said."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import MODULE, REPO, clean_environ, host_copy, run_snakemake

#: What ruff checks; its configuration is [tool.ruff] in pyproject.toml.
RUFF_PATHS = ("scripts", "tests")
#: Snakefiles and .smk files; snakefmt's configuration is [tool.snakefmt] in pyproject.toml.
SNAKEFMT_PATHS = ("workflow", "tests/example_host", "tests/aps_host")


def run_tool(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, env=clean_environ(), capture_output=True, text=True,
                          timeout=300)


def tool(name: str) -> str:
    """The linter's executable next to this Python (the `test` extra installs it), else on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


@pytest.mark.parametrize("path", RUFF_PATHS)
def test_ruff_finds_nothing(path):
    result = run_tool(tool("ruff"), "check", "--no-cache", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_snakefmt_would_change_nothing():
    result = run_tool(tool("snakefmt"), "--check", "--diff", *SNAKEFMT_PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_snakemake_lint_finds_nothing_in_the_workflow(tmp_path):
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    ours = run_snakemake(REPO, "--lint", env=env)
    assert ours.returncode == 0, ours.stdout + ours.stderr


@pytest.mark.slow
def test_snakemake_lint_finds_nothing_in_the_host_with_the_module(tmp_path):
    work = host_copy(tmp_path)
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    host = run_snakemake(work, "--lint", "--config", MODULE, env=env)
    assert host.returncode == 0, host.stdout + host.stderr
