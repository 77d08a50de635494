"""`gpu-cache doctor --explain`: each cause it names is produced for real with two JAX runs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import jax_job_env, run_cli, unavailable

pytestmark = pytest.mark.slow  # every test here runs JAX or Snakemake for seconds

# Uses an integer constant, so JAX_ENABLE_X64 changes the program's dtypes.
PROGRAM = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: jnp.sin(x) + jnp.arange(4))(jnp.ones(4)))"


def run_jax(cache_root: Path, jax_dir: Path | None = None, extra_path: str = "", **env: str) -> None:
    """One real JAX process with the stats hook and the persistent cache."""
    environ = jax_job_env(jax_dir or cache_root / "jax", records=cache_root / "records",
                          extra_path=[extra_path], **env)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=environ, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def explain(cache_root: Path) -> list[dict]:
    result = run_cli("doctor", "--explain", "--json", "--cache-root", str(cache_root))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found, "the second run missed, so there is something to explain"
    return found


def lambda_of(explanations: list[dict]) -> dict:
    return next(e for e in explanations if e["name"] == "jit__lambda")


def test_a_changed_xla_flag_is_named(cache_root):
    run_jax(cache_root)
    run_jax(cache_root, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    item = lambda_of(explain(cache_root))
    assert item["changed"] == ["XLA flags"]
    assert "XLA_FLAGS changed from None to '--xla_cpu_enable_fast_math=false'" in item["causes"][0]


def test_jax_enable_x64_changes_the_computation(cache_root):
    run_jax(cache_root)
    run_jax(cache_root, JAX_ENABLE_X64="1")
    item = lambda_of(explain(cache_root))
    assert item["changed"] == ["computation"]
    assert "JAX_ENABLE_X64 changed" in item["causes"][0]


def test_the_cache_path_in_the_key_with_xla_caches_on(cache_root):
    # jax 0.10.x puts the XLA cache folders (inside the cache dir) into the compile options.
    run_jax(cache_root, jax_dir=cache_root / "one", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="all")
    run_jax(cache_root, jax_dir=cache_root / "two", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="all")
    item = lambda_of(explain(cache_root))
    assert item["changed"] == ["compile_options"]
    assert "cache folder's path is in the key" in item["causes"][0]
    assert str(cache_root / "one") in item["causes"][0] and str(cache_root / "two") in item["causes"][0]


def test_the_cache_path_is_not_in_the_key_with_xla_caches_none(cache_root):
    run_jax(cache_root, jax_dir=cache_root / "one", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="none")
    run_jax(cache_root, jax_dir=cache_root / "two", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="none")
    item = lambda_of(explain(cache_root))
    assert item["changed"] == [] and item["compared_with"]["key"] == item["key"]
    assert "same key was computed before" in item["causes"][0]


@pytest.fixture(scope="session")
def zstandard_path(tmp_path_factory) -> str:
    """A folder that makes zstandard importable: "" when it is installed already, else a
    pip --target install (the `test` extra installs it, so CI needs no network here)."""
    if importlib.util.find_spec("zstandard") is not None:
        return ""
    target = tmp_path_factory.mktemp("zstd")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target",
                           str(target), "zstandard"], capture_output=True, text=True)
    if done.returncode != 0:
        unavailable(f"zstandard is not installed and cannot be: {done.stderr[-300:]}")
    return str(target)


def test_zstandard_in_one_environment_only(cache_root, tmp_path, zstandard_path):
    run_jax(cache_root, extra_path=zstandard_path)
    # The other environment lacks a working zstandard: its import fails, as when not installed.
    blocked = tmp_path / "no-zstd" / "zstandard"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('zstandard is not installed here')\n")
    run_jax(cache_root, extra_path=str(blocked.parent))
    item = lambda_of(explain(cache_root))
    assert item["changed"] == ["compression"]
    assert "compression changed from zstandard to zlib" in item["causes"][0]


def test_a_computation_never_seen_before_is_a_first_compile(cache_root):
    run_jax(cache_root)
    item = lambda_of(explain(cache_root))
    assert item["compared_with"] is None and "no earlier run computed jit__lambda" in item["causes"][0]
