"""The tokamax fix (issue 20): tokamax 0.0.12 makes a JAX user context at its first
autotuning-cache lookup, inside the first trace, and every jitted function then compiles twice
in a process. The startup hook makes that context when ``tokamax._src.ops.op`` is imported.

Real tokamax 0.0.12 and real JAX on CPU; the function traced does what tokamax's Pallas-Triton
GLU does while AlphaFold 3 traces (``op.bind(...).cached_autotuning_data``: the GLU's own
kernels need a GPU). A small tokamax package on PYTHONPATH stands for other versions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HOOK, SCRIPTS, clean_environ
from hook_jobs import fake_jax, gpu_cache_env, real_tokamax, records_of, warnings_in

#: Three calls of one jitted function whose trace looks up tokamax's autotuning cache; prints
#: how often it was traced and how many executables jax holds for it.
GLU_PROGRAM = """
import json
import jax, jax.numpy as jnp
from tokamax._src.ops.gated_linear_unit import pallas_triton

glu = pallas_triton.PallasTritonGatedLinearUnit()
traces = []

@jax.jit
def glu_step(x, w):
    traces.append(1)
    glu.bind(x, w, activation=jax.nn.swish).cached_autotuning_data
    return jax.nn.swish(x @ w[:, 0]) * (x @ w[:, 1])

x, w = jnp.ones((8, 16)), jnp.ones((16, 2, 32))
for _ in range(3):
    glu_step(x, w).block_until_ready()
print(json.dumps({"traces": len(traces), "compiled": glu_step._cache_size()}))
"""


def run_glu(environ: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", GLU_PROGRAM], env=environ, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not warnings_in(done.stderr), done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def fix_of(record: dict) -> dict:
    """The fix's part of a record's tokamax part (without the autotuning results' part)."""
    return {k: v for k, v in record["autotune"].items() if k != "autotuning"}


def glu_requests(record: dict) -> tuple[int, int]:
    """(misses, hits) of the persistent cache for ``glu_step`` in a record."""
    jax_part = record["jax"]
    misses = sum(m["name"] == "jit_glu_step" for m in jax_part["missed"])
    return misses, sum(key.startswith("jit_glu_step-") for key in jax_part["hit_keys"])


@pytest.mark.slow
def test_tokamax_0_0_12_compiles_once_in_three_calls_and_not_at_all_in_the_next_process(tmp_path):
    real_tokamax()
    root = tmp_path / "root"
    environ = gpu_cache_env(root)
    assert environ["PYTHONPATH"].split(os.pathsep)[0] == str(HOOK)
    assert run_glu(environ) == {"traces": 1, "compiled": 1}
    assert run_glu(environ) == {"traces": 1, "compiled": 1}
    first, second = sorted(records_of(root), key=lambda r: r["time"])
    assert fix_of(first) == {"fix": "applied", "thread": "MainThread", "main_thread": True}
    # Nothing was tuned for this root: each process's one trace missed (tests/test_autotune.py).
    assert first["autotune"]["autotuning"]["misses"] == second["autotune"]["autotuning"]["misses"] == 1
    assert glu_requests(first) == (1, 0)
    assert second["jax"]["misses"] == 0 and glu_requests(second) == (0, 1)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["without gpu-cache", "switched off"])
def test_without_the_fix_tokamax_0_0_12_compiles_twice(tmp_path, how):
    real_tokamax()
    root = tmp_path / "root"
    if how == "without gpu-cache":
        environ = clean_environ(JAX_PLATFORMS="cpu")
    else:
        environ = gpu_cache_env(root, GPU_CACHE_TOKAMAX_FIX="0")
    assert run_glu(environ) == {"traces": 2, "compiled": 2}
    if how == "switched off":
        (record,) = records_of(root)
        assert fix_of(record) == {"fix": "off: GPU_CACHE_TOKAMAX_FIX switches it off"}
        assert glu_requests(record) == (1, 1)  # the second trace reads its own entry again


#: tokamax/_src/ops/op.py of a small tokamax package: ``{function}`` is put in its place.
FAKE_OP = """
import threading
import jax  # as tokamax does; here a fake jax, for a record

_STATE = threading.local()
CALLS = []
{function}
def lookup():
    return getattr(_STATE, "made_in", None)
"""
#: A tokamax 0.0.12-like function: per thread, records the thread that made its state.
FUNCTION_0_0_12 = """
def get_autotuning_cache_overlay_state():
    CALLS.append(threading.current_thread().name)
    if not hasattr(_STATE, "made_in"):
        _STATE.made_in = threading.current_thread().name
    return _STATE
"""
#: One that fails.
FUNCTION_RAISES = """
def get_autotuning_cache_overlay_state():
    CALLS.append(threading.current_thread().name)
    raise RuntimeError("no backend")
"""
#: What the job reports: which threads made tokamax's state, and the module's own names.
FAKE_PROGRAM = """
import json, threading
def load():
    from tokamax._src.ops import op
    STATE["names"] = sorted(vars(op))
    STATE["calls"] = list(op.CALLS)
    STATE["main"] = op.lookup()
STATE = {}
if IN_THREAD:
    thread = threading.Thread(target=load, name="loader")
    thread.start()
    thread.join()
else:
    load()
print(json.dumps(STATE, sort_keys=True))
"""


def fake_tokamax(tmp_path: Path, function: str) -> Path:
    folder = tmp_path / "fake-tokamax"
    for name in ("tokamax/__init__.py", "tokamax/_src/__init__.py", "tokamax/_src/ops/__init__.py"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("")
    (folder / "tokamax" / "_src" / "ops" / "op.py").write_text(FAKE_OP.format(function=function))
    return folder


def run_fake(tmp_path: Path, function: str, in_thread: bool = False,
             **extra: str) -> tuple[dict, dict, subprocess.CompletedProcess[str]]:
    """The fake job without the hook and with it: (without, with, the hooked run)."""
    folders = [str(fake_tokamax(tmp_path, function)), str(fake_jax(tmp_path)), str(SCRIPTS)]
    code = f"IN_THREAD = {in_thread}\n{FAKE_PROGRAM}"
    outs = []
    for hooked in (False, True):
        path = [str(HOOK), *folders] if hooked else folders
        environ = clean_environ(PYTHONPATH=os.pathsep.join(path), **extra)
        if hooked:
            environ["GPU_CACHE_RECORDS"] = str(tmp_path / "root" / "records")
        done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        outs.append((json.loads(done.stdout), done))
    return outs[0][0], outs[1][0], outs[1][1]


def test_a_tokamax_without_the_function_is_left_alone(tmp_path):
    plain, hooked, done = run_fake(tmp_path, "")
    assert hooked == plain and done.stderr == ""
    (record,) = records_of(tmp_path / "root")
    assert record["autotune"] == {"fix": "not needed: this tokamax has no get_autotuning_cache_overlay_state"}


@pytest.mark.parametrize("in_thread", [False, True])
def test_the_fix_makes_the_state_in_the_importing_thread_and_says_which(tmp_path, in_thread):
    plain, hooked, done = run_fake(tmp_path, FUNCTION_0_0_12, in_thread)
    thread = "loader" if in_thread else "MainThread"
    assert (plain["calls"], plain["main"]) == ([], None)
    assert (hooked["calls"], hooked["main"]) == ([thread], thread)
    assert hooked["names"] == plain["names"] and done.stderr == ""
    (record,) = records_of(tmp_path / "root")
    assert record["autotune"] == {"fix": "applied", "thread": thread, "main_thread": not in_thread}


def test_a_fix_that_fails_never_fails_the_job(tmp_path):
    plain, hooked, done = run_fake(tmp_path, FUNCTION_RAISES)
    assert hooked == plain | {"calls": ["MainThread"]}
    (warning,) = warnings_in(done.stderr)
    assert "tokamax fix" in warning and "no backend" in warning
    (record,) = records_of(tmp_path / "root")
    assert record["autotune"]["fix"].startswith("failed: RuntimeError('no backend')")


@pytest.mark.parametrize("raised", ["SystemExit(3)", "KeyboardInterrupt()"])
def test_a_fix_whose_function_exits_never_changes_the_jobs_exit(tmp_path, raised):
    function = FUNCTION_RAISES.replace('RuntimeError("no backend")', raised)
    plain, hooked, done = run_fake(tmp_path, function)  # both runs exit 0 and print their state
    assert hooked == plain | {"calls": ["MainThread"]}
    (warning,) = warnings_in(done.stderr)
    assert "tokamax fix" in warning and raised.split("(")[0] in warning
    (record,) = records_of(tmp_path / "root")
    assert record["autotune"]["fix"].startswith(f"failed: {raised.split('(')[0]}")


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_the_switch_turns_the_fix_off(tmp_path, value):
    plain, hooked, done = run_fake(tmp_path, FUNCTION_0_0_12, GPU_CACHE_TOKAMAX_FIX=value)
    assert hooked == plain and done.stderr == ""
    (record,) = records_of(tmp_path / "root")
    assert record["autotune"] == {"fix": "off: GPU_CACHE_TOKAMAX_FIX switches it off"}
