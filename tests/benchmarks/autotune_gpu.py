"""Autotuning kept per GPU type (issue 24), measured per new process on a GPU (an H200).

    PYTHONPATH=scripts python3 tests/benchmarks/autotune_gpu.py --out autotune_gpu.json

What runs (about 2-3 minutes on an H200): Triton's own autotuned kernel, a tiled matmul with
``@triton.autotune`` over 6 configurations at 2 shapes, 3 calls each, in fresh processes:

1. ``without gpu-cache``: each process with an empty Triton cache of its own (a fresh node),
   nothing kept: every process compiles and autotunes.
2. ``cold root``: the cache environment ``gpu-cache env`` exports for an empty root
   (``TRITON_CACHE_AUTOTUNING=1`` among it): the first process compiles, tunes and keeps both.
3. ``warm root``: the next processes on that root.

Per process: wall seconds, each call's seconds, compiles (new Triton kernel groups in its
cache) and autotuning misses (Triton's ``TRITON_PRINT_AUTOTUNING`` line, printed only when it
benchmarks). Targets: a warm-root process has 0 compiles and 0 autotuning misses. Each
process's first call over its later calls is reported (not a target for a kernel call of well
under a millisecond). Exit 0 when the targets hold, 1 when not; on a machine without a GPU (or
without torch and triton) it says so and exits 0.

Also tried, reported as measured or not: tokamax's autotuning (the ``autotune`` kind): a
process with gpu-cache's warm flag tunes tokamax's gated linear unit, a second one must find
it. tokamax 0.0.12 with jax 0.11.2 (the H200 image) fails to trace its Pallas-Triton GLU
(``pl.dot`` removed), so there the reason is printed instead. Not measured at all: AlphaFold 3
itself (no image, no weights here) and XLA's per-fusion autotuning (the node-local tier,
issue 23, is not built).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

from gpu_cache.config.settings import settings_from  # noqa: E402
from gpu_cache.jobenv import env  # noqa: E402

AUTOTUNE_LINE = "Triton autotuning for function"

MATMUL = r'''
import json, sys, time
import torch, triton, triton.language as tl

@triton.autotune(configs=[
    triton.Config({"BM": bm, "BN": bn, "BK": 32}, num_warps=w, num_stages=s)
    for bm, bn, w, s in ((64, 64, 4, 3), (128, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 3),
                         (64, 64, 4, 4), (128, 64, 8, 4))], key=["M", "N", "K"])
@triton.jit
def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm, rn, rk = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        ks = k + rk
        x = tl.load(a + rm[:, None] * K + ks[None, :], mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        y = tl.load(b + ks[:, None] * N + rn[None, :], mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=inside)

calls = {}
for n in (1024, 2048):
    a = torch.randn((n, n), device="cuda", dtype=torch.float16)
    b = torch.randn((n, n), device="cuda", dtype=torch.float16)
    c = torch.empty((n, n), device="cuda", dtype=torch.float16)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        matmul[lambda m: (triton.cdiv(n, m["BM"]), triton.cdiv(n, m["BN"]))](a, b, c, n, n, n)
        torch.cuda.synchronize()
        times.append(round(time.perf_counter() - start, 4))
    assert torch.allclose(c.float(), (a.float() @ b.float()), atol=1.0, rtol=0.05)
    calls[str(n)] = times
print(json.dumps({"calls": calls, "device": torch.cuda.get_device_name()}))
'''

TOKAMAX = r'''
import json, jax, jax.numpy as jnp, tokamax
x = jnp.ones((256, 512), jnp.bfloat16)
w = jnp.ones((512, 2, 1024), jnp.bfloat16)
f = jax.jit(lambda x, w: tokamax.gated_linear_unit(x, w, activation=jax.nn.swish, implementation="triton"))
f(x, w).block_until_ready()
print(json.dumps({"device": jax.devices()[0].device_kind}))
'''


def gpu_here() -> str | None:
    """Why nothing can be measured here, or None on a machine with a CUDA GPU, torch and triton."""
    if shutil.which("nvidia-smi") is None:
        return "no GPU here (nvidia-smi not found)"
    check = subprocess.run([sys.executable, "-c", "import torch, triton; assert torch.cuda.is_available()"],
                           capture_output=True, text=True, timeout=120)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        return f"torch with CUDA and triton are not usable here: {last}"
    return None


def groups(folder: Path) -> int:
    """Compiled Triton kernels in a cache folder (one group manifest each)."""
    return sum(1 for _ in folder.glob("*/__grp__*.json")) if folder.is_dir() else 0


def run_process(program: str, environ: dict[str, str], triton_dir: Path) -> dict[str, Any]:
    before = groups(triton_dir)
    started = time.perf_counter()
    # Triton's @jit reads the kernel's source from its file: a program given with -c has none.
    script = triton_dir.parent / f"program-{abs(hash(program))}.py"
    script.write_text(program)
    done = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, text=True,
                          timeout=240)
    wall = time.perf_counter() - started
    out: dict[str, Any] = {"wall_seconds": round(wall, 3), "exit_code": done.returncode,
                           "compiles": groups(triton_dir) - before,
                           "autotuning_misses": (done.stdout + done.stderr).count(AUTOTUNE_LINE)}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        out["error"] = (done.stderr.strip().splitlines() or ["no output"])[-1][-400:]
        return out
    out.update(json.loads(lines[-1]))
    return out


def base_environ(**extra: str) -> dict[str, str]:
    keep = ("PATH", "HOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "TMPDIR")
    environ = {k: os.environ[k] for k in keep if k in os.environ}
    environ.update(PYTHONPATH=str(SCRIPTS), TRITON_PRINT_AUTOTUNING="1", **extra)
    return environ


def gpu_cache_environ(root: Path, **extra: str) -> dict[str, str]:
    base = base_environ(**extra)
    return env.job_environ(env.resolve(settings_from({}, cache_root=str(root)), base), base)


def first_call_ratio(process: dict[str, Any]) -> float | None:
    """The first call's seconds over the median of the later calls, worst shape."""
    ratios = [times[0] / sorted(times[1:])[len(times[1:]) // 2]
              for times in process.get("calls", {}).values()]
    return round(max(ratios), 2) if ratios else None


def measure_triton(scratch: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"without gpu-cache": [], "cold root": [], "warm root": []}
    for i in range(2):
        own = scratch / f"plain-{i}"
        results["without gpu-cache"].append(run_process(MATMUL, base_environ(TRITON_CACHE_DIR=str(own)), own))
    root = scratch / "root"
    environ = gpu_cache_environ(root)
    triton_dir = Path(environ["TRITON_CACHE_DIR"])
    for phase in ("cold root", "warm root", "warm root"):
        results[phase].append(run_process(MATMUL, environ, triton_dir))
    results["autotune_results_kept"] = sum(1 for _ in triton_dir.glob("*/*.autotune.json"))
    for processes in (results["without gpu-cache"], results["cold root"], results["warm root"]):
        for process in processes:
            process["first_call_ratio"] = first_call_ratio(process)
    return results


def measure_tokamax(scratch: Path) -> dict[str, Any]:
    """tokamax's GLU tuned by a warm process and found by the next, where it runs at all."""
    root = scratch / "tokamax-root"
    warm = gpu_cache_environ(root, GPU_CACHE_AUTOTUNE_SAVE="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    job = gpu_cache_environ(root, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    triton_dir = Path(warm["TRITON_CACHE_DIR"])
    try:
        first = run_process(TOKAMAX, warm, triton_dir)
    except subprocess.TimeoutExpired:
        return {"measured": False, "why": "the warm process ran over 240 s"}
    if "error" in first:
        return {"measured": False, "why": first["error"]}
    second = run_process(TOKAMAX, job, triton_dir)
    records = sorted((root / "records").glob("*.json"), key=lambda p: p.stat().st_mtime)
    tuning = [json.loads(p.read_text()).get("autotune", {}).get("autotuning", {}) for p in records]
    return {"measured": True, "warm": first, "job": second, "autotuning": tuning}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    why = gpu_here()
    if why:
        print(f"autotune_gpu: nothing measured: {why}. Run it on a GPU machine (an H200): "
              "PYTHONPATH=scripts python3 tests/benchmarks/autotune_gpu.py --out autotune_gpu.json")
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-cache-autotune-") as scratch:
        results: dict[str, Any] = {"triton": measure_triton(Path(scratch))}
        try:
            import tokamax  # noqa: F401
        except ImportError:
            results["tokamax"] = {"measured": False, "why": "tokamax is not installed here"}
        else:
            results["tokamax"] = measure_tokamax(Path(scratch))
    results["not measured"] = ["AlphaFold 3 itself (no image and no weights here)",
                               "XLA's per-fusion autotuning (the node-local tier, issue 23, is not built)"]
    warm = results["triton"]["warm root"]
    # The first-call ratio is reported, not a target here: a call of this matmul takes well
    # under a millisecond, so loading its kernel from the cache dominates the first one; the
    # 1.2x target is for calls that take seconds (AlphaFold 3's seeds), not measured here.
    failed = [f"warm-root process {i}: {p.get('error') or ''} compiles {p['compiles']}, "
              f"autotuning misses {p['autotuning_misses']}"
              for i, p in enumerate(warm) if "error" in p or p["compiles"] or p["autotuning_misses"]]
    results["targets_met"] = not failed
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    for line in failed:
        print(f"autotune_gpu: target missed: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
