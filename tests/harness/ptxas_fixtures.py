"""The ptxas shim's tests share these: real PTX made on this CPU by Triton's compiler, the real
ptxas from Triton's wheel, a site's wrapper in front of it that logs each run, and the shim's
environment (issue 34)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from gpu_cache._hook.gpu_cache_hook.kinds.ptxas import shim as SHIM
from gpu_cache.core import names
from helpers import HOOK, unavailable

SHIM_DIR = HOOK / "gpu_cache_hook" / "kinds" / "ptxas" / "bin"
#: The hook's digest frame (``_hook/gpu_cache_hook/digest.py``), as the shim loaded it.
DIGEST = SHIM.frame


def triton_ptxas() -> Path:
    """Triton's own ptxas for PTX 9.x (CUDA 13: ``ptxas-blackwell``); the test is skipped (or
    fails under CI) where the wheel lacks it."""
    import triton

    found = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas-blackwell"
    if not found.is_file():
        unavailable(f"Triton's wheel has no {found}")
    return found


def older_ptxas() -> Path:
    """Triton's other ptxas (CUDA 12.9): another release, for PTX 8.x."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


PTX_SCRIPT = r'''
import sys, triton, triton.language as tl
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget

@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)

@triton.jit
def mm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :],
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :],
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.float16),
             mask=(rows[:, None] < M) & (cols[None, :] < N))

target = GPUTarget("cuda", 90, 32)
out = sys.argv[1]
k = triton.compile(ASTSource(add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                                   "BLOCK": "constexpr"}, constexprs={"BLOCK": 1024}), target=target)
open(out + "/add.ptx", "w").write(k.asm["ptx"])
sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
       "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
k = triton.compile(ASTSource(mm, sig, constexprs={"BM": 64, "BN": 64, "BK": 32}), target=target,
                   options={"num_warps": 4, "num_stages": 3})
open(out + "/mm.ptx", "w").write(k.asm["ptx"])
if sys.argv[2:] == ["big"]:
    k = triton.compile(ASTSource(mm, sig, constexprs={"BM": 128, "BN": 128, "BK": 64}), target=target,
                       options={"num_warps": 8, "num_stages": 3})
    open(out + "/mm128.ptx", "w").write(k.asm["ptx"])
'''

#: Hand-written PTX whose double-precision warnings name the input file (with
#: ``--warn-on-double-precision-use``), in PTX 8.7, which CUDA 12.9's ptxas reads too.
F64_PTX = """.version 8.7
.target sm_90a
.address_size 64
.visible .entry twice(.param .u64 p)
{
  .reg .b64 %rd<2>;
  .reg .f64 %fd<3>;
  ld.param.u64 %rd1, [p];
  ld.global.f64 %fd1, [%rd1];
  add.f64 %fd2, %fd1, %fd1;
  st.global.f64 [%rd1], %fd2;
  ret;
}
"""


def make_ptx(folder: Path, big: bool = False) -> dict[str, Path]:
    """``add.ptx`` and ``mm.ptx`` (this Triton's PTX for sm_90a: 9.4 from Triton 3.9), ``spill.ptx``
    (``mm`` held to 64 registers, so ptxas warns that registers are spilled), ``f64.ptx`` and
    ``add87.ptx`` (``add`` as PTX 8.7); with ``big``, ``mm128.ptx`` (128x128x64, 8 warps)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TRITON_CACHE_DIR=str(folder / "triton-cache"))
    script = folder / "make_ptx.py"  # Triton reads a kernel's source from its file
    script.write_text(PTX_SCRIPT)
    subprocess.run([sys.executable, str(script), str(folder), *(["big"] if big else [])], env=env, check=True,
                   capture_output=True, timeout=300)
    mm = (folder / "mm.ptx").read_text()
    (folder / "spill.ptx").write_text(mm.replace(".reqntid 128", ".reqntid 128\n.maxnreg 64", 1))
    (folder / "f64.ptx").write_text(F64_PTX)
    add = (folder / "add.ptx").read_text()
    (folder / "add87.ptx").write_text(add.replace(".version 9.4", ".version 8.7", 1))
    return {p.stem: p for p in folder.glob("*.ptx")}


def site_wrapper(folder: Path, real: Path, log: Path) -> Path:
    """A site's ``ptxas``: a shell script that logs its arguments and runs ``real`` (each line
    of ``log`` is one real run)."""
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "ptxas"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def runs(log: Path) -> int:
    """How many times the real ptxas assembled something (its ``--version`` probes left out)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(1 for line in lines if line.strip() != "--version")


def shim_environ(cache: Path, *path: Path | str, **extra: str) -> dict[str, str]:
    """The environment of a process that runs ptxas through the shim: the shim's folder first
    on PATH, then ``path``, then the system's; the cache in ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CACHE_")}
    environ["PATH"] = os.pathsep.join([str(SHIM_DIR), *map(str, path), "/usr/bin", "/bin"])
    environ[names.PTXAS_VAR] = str(cache)
    environ[names.PTXAS_PYTHON_VAR] = sys.executable
    environ.update(extra)
    return environ


def assemble(ptx: Path, out: Path, environ: dict[str, str], *options: str,
             program: str = "ptxas") -> subprocess.CompletedProcess[bytes]:
    """``ptxas <ptx> -o <out> -arch=sm_90a --warn-on-spills [options]``, as XLA and jaxlib call it,
    found on ``environ``'s PATH."""
    return subprocess.run([program, str(ptx), "-o", str(out), "-arch=sm_90a", "--warn-on-spills", *options],
                          env=environ, capture_output=True, timeout=120)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
