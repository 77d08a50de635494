"""The verdict proves that the warm cache computes what a fresh compile computes (issue 40):
a well-formed but wrong entry in a trusted root fails validation, is named and set aside,
and the next warm and validate pass; a program that is not deterministic run to run passes
"within run-to-run noise". Real JAX compiles on the CPU, real processes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import clean_environ, read_json, run_cli, write_config

#: ``jit(plus_one)(ones(3))``, its outputs written to the file named by the first argument.
PLUS_ONE = ("import sys, jax, jax.numpy as jnp, numpy as np\n"
            "def plus_one(x):\n"
            "    return x + 1\n"
            "np.save(sys.argv[1], np.asarray(jax.jit(plus_one)(jnp.ones(3, jnp.float32))))\n")
#: Another function of the same signature: its executable is well formed, and wrong for plus_one.
HUNDRED = ("import jax, jax.numpy as jnp\n"
           "def hundred(x):\n"
           "    return x * 0 + 100\n"
           "print(jax.jit(hundred)(jnp.ones(3, jnp.float32)))\n")


def plus_one_config(tmp_path: Path) -> Path:
    program = tmp_path / "plus_one.py"
    program.write_text(PLUS_ONE)
    out = tmp_path / "out"
    out.mkdir()
    return write_config(tmp_path / "c.yaml", {
        "workloads": {"plus": {"command": f"{{python}} {program} {out}/{{shape}}.npy", "shapes": [3],
                               "outputs": f"{out}/{{shape}}.npy"}},
        "default_workloads": ["plus"]})


def plant(jax_folder: Path, name: str, program: str, other: str, scratch: Path) -> str:
    """Copy the executable of ``other`` that ``program`` compiles over the entry of ``name`` in
    ``jax_folder`` (a torn write or a bad promotion would leave such an entry): the key it
    replaced."""
    (target,) = jax_folder.glob(f"{name}-*-cache")
    env = clean_environ(JAX_COMPILATION_CACHE_DIR=str(scratch),
                        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wrong,) = scratch.glob(f"{other}-*-cache")
    shutil.copyfile(wrong, target)
    return target.name[:-len("-cache")]


@pytest.mark.slow
def test_another_functions_executable_under_the_key_fails_is_named_and_set_aside(cache_root, tmp_path):
    config = plus_one_config(tmp_path)
    common = ("--config", str(config), "--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    first = run_cli("validate", *common, "--output", str(tmp_path / "v1.json"))
    assert first.returncode == 0, first.stderr[-3000:]
    verdict = read_json(tmp_path / "v1.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["outputs"]["shapes"][0]["outcome"] == "identical", verdict["outputs"]

    key = plant(cache_root / "jax", "jit_plus_one", HUNDRED, "jit_hundred", tmp_path / "scratch")
    planted = run_cli("validate", *common, "--output", str(tmp_path / "v2.json"))
    assert planted.returncode == 0, planted.stderr[-3000:]
    verdict = read_json(tmp_path / "v2.json")
    assert verdict["hits"] >= 1 and verdict["misses"] == 0  # what today's verdict saw, and passed
    assert verdict["passed"] is False
    (problem,) = [p for p in verdict["problems"] if "outputs differ" in p]
    assert "plus shape 3" in problem and f"jax {key}" in problem, problem
    assert key in verdict["outputs"]["set_aside"]["jax"]
    assert not list((cache_root / "jax").glob(f"{key}-*")), "the wrong entry is still served"
    assert "outputs differ" in planted.stderr

    # The next warm compiles it again, and the next validation passes.
    assert run_cli("warm", *common, "--output", str(tmp_path / "w2.json")).returncode == 0
    again = run_cli("validate", *common, "--output", str(tmp_path / "v3.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    verdict = read_json(tmp_path / "v3.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["outputs"]["shapes"][0]["outcome"] == "identical"
