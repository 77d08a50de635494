"""Triton 3.1 (jax 0.4.34, jax-triton 0.2.0: the generation of AlphaFold 3.0.x images), which
has no ``triton.knobs`` (issue 37): the hook prints nothing there and its record says what it
cannot count; jax-triton 0.2.0's kernels are kept. When problems compete for the hook's one
warning line, the one that turns a cache off is printed: on Triton 3.1 and on the installed
Triton."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HOOK, REPO, clean_environ, records, unavailable
from test_jax_triton import job_env, needs_jax_triton, warnings

#: The venv .ci/install-triton31.sh makes (triton 3.1.0, jax 0.4.34, jax-triton 0.2.0).
VENV = Path(os.environ.get("GPU_CACHE_TEST_TRITON31_VENV") or REPO / ".ci-cache" / "triton31")

#: Two jax-triton kernels lowered for CUDA sm_90 (no GPU: jax-triton's Triton compile runs),
#: with the lowered module on stdout. Triton 3.1's autotuner imports torch: none here.
PROGRAM = r'''
import jax, jax.numpy as jnp, triton, triton.language as tl, jax_triton as jt

@triton.jit
def add_kernel(x_ptr, y_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))

@triton.jit
def scale_kernel(x_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(o_ptr + offs, tl.load(x_ptr + offs) * 3.0)

def f(x, y):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    s = jt.triton_call(x, y, kernel=add_kernel, out_shape=out, grid=(4,), BLOCK=64, compute_capability=90)
    return jt.triton_call(s, kernel=scale_kernel, out_shape=out, grid=(4,), BLOCK=64, compute_capability=90)

spec = jax.ShapeDtypeStruct((256,), jnp.float32)
print(jax.jit(f).trace(spec, spec).lower(lowering_platforms=("cuda",)).as_text())
'''


def python31() -> str:
    exe = VENV / "bin" / "python"
    if not exe.is_file():
        unavailable(f"no Triton 3.1 venv at {VENV} (.ci/install-triton31.sh makes it)")
    return str(exe)


def environ31(root: Path, **extra: str) -> dict[str, str]:
    """A job's environment for the Triton 3.1 venv: as ``gpu-cache env`` exports it, with the
    hook alone on PYTHONPATH (the venv has its own jaxlib plugin)."""
    needs_jax_triton()  # (the exports are computed here, with the host's software)
    return {**job_env(root), "PYTHONPATH": str(HOOK), **extra}


def run(python: str, environ: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "kernels.py"
    program.write_text(PROGRAM)
    done = subprocess.run([python, str(program)], env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_on_triton_31_the_hook_prints_nothing_and_the_record_says_what_it_cannot_count(tmp_path):
    python = python31()
    root = tmp_path / "root"
    first, second = (run(python, environ31(root), tmp_path) for _ in range(2))
    assert warnings(first) == warnings(second) == []  # it printed the knobs AttributeError
    assert first.stdout == second.stdout
    sections = records(root, "triton")
    assert {s["single_flight"]["state"] for s in sections} == \
        {"off: this triton has no triton.knobs.cache.manager_class (< 3.4)"}
    for section in sections:
        assert any(line.startswith("triton 3.1.0 has no compilation listener") and "not recorded" in line
                   for line in section["unrecorded"]), section["unrecorded"]
    kernels = records(root, "jax_triton")  # jax-triton 0.2.0's kernels are kept
    assert [(s["version"], s["state"], s["misses"], s["hits"]) for s in kernels] == \
        [("0.2.0", "on", 2, 0), ("0.2.0", "on", 0, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("triton", ["3.1", "installed"])
def test_a_cache_turned_off_is_the_one_warning_line(tmp_path, triton):
    """GPU_CACHE_JAX_TRITON at a file turns the kernel cache off: that is the line the job
    prints (on Triton 3.1 the hook's knobs error took it, and only the record said why)."""
    root = tmp_path / "root"
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    if triton == "3.1":
        done = run(python31(), environ31(root, GPU_CACHE_JAX_TRITON=str(a_file)), tmp_path)
    else:
        needs_jax_triton()
        done = run(sys.executable, job_env(root, GPU_CACHE_JAX_TRITON=str(a_file)), tmp_path)
    assert len(warnings(done)) == 1 and "(jax-triton kernel cache: " in warnings(done)[0], done.stderr
    (section,) = records(root, "jax_triton")
    assert section["state"].startswith("off: ") and "not a folder" in section["state"]


#: Problems reported to the hook's one warning line of a real process, in this order:
#: ``(what, turns a cache off)``.
ORDERS = {
    "a lesser one first": [("triton listener", False), ("jax-triton kernel cache", True)],
    "the cache first": [("jax-triton kernel cache", True), ("triton listener", False)],
    "two caches": [("ptxas cache", True), ("jax-triton kernel cache", True)],
    "a lesser one alone": [("triton listener", False)],
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_the_problem_that_turns_a_cache_off_takes_the_warning_line(tmp_path, order):
    """The hook as Python's site loads it in a job; problems reported to it in turn: one line,
    the first that turned a cache off, else (at exit) the first lesser one."""
    calls = "".join(f"hook.warn({what!r}, OSError(5, {what!r}), off={off})\n" for what, off in ORDERS[order])
    program = f"import sys\nhook = sys.modules['sitecustomize']._HOOK\n{calls}print('ran', flush=True)\n"
    done = subprocess.run([sys.executable, "-c", program], env=clean_environ(PYTHONPATH=str(HOOK)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ran\n", done.stderr
    offs = [what for what, off in ORDERS[order] if off]
    shown = offs[0] if offs else ORDERS[order][0][0]
    assert warnings(done) == [f"gpu-cache: warning: stats hook disabled part of itself ({shown}: "
                              f"OSError(5, {shown!r}))"]

