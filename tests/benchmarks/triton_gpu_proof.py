"""Proof that a Triton cache filled ahead of time on a CPU-only machine is hit on a real GPU.

Two steps, each a subcommand:

``prefill`` (on the CPU machine, with the same Python and triton wheel as the GPU machine)::

    PYTHONPATH=scripts python tests/benchmarks/triton_gpu_proof.py prefill \
        --cache /tmp/gpu-cache-proof/triton --shapes 1024,4096 --targets sm_90 --out prefill.json

``gpu`` (on the GPU machine, with the prefilled cache copied to the SAME absolute path, because the
group manifests name absolute paths)::

    PYTHONPATH=scripts python3 tests/benchmarks/triton_gpu_proof.py gpu \
        --cache /tmp/gpu-cache-proof/triton --prefill prefill.json --out results.json

The ``gpu`` step runs the built-in workload (``gpu_cache.workloads.triton_kernels``, jit mode:
``kernel[grid](...)`` on real tensors, results checked) in fresh processes:

1. ``prefilled``: against the carried cache; every kernel must be a listener ``cache_hit=True``.
2. ``cold``: against an empty cache (every kernel compiles on the GPU machine).
3. ``warm``: again against the cache the cold run filled (steady state, launcher modules included).

and writes per-kernel hit/miss and first-call seconds, process wall seconds, and new cache entries.
Exit code 0 when the prefilled run had only hits, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_cache.core.kinds import triton_format as triton_cache

WORKLOAD_MODULE = "gpu_cache.workloads.triton_kernels"


def key_components() -> dict[str, Any]:
    """The parts of Triton's cache key that do not depend on the kernel, for this process."""
    import hashlib

    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key

    backend = make_backend(GPUTarget("cuda", 90, 32))
    return {
        "triton": triton.__version__,
        "python": platform.python_version(),
        "triton_key_sha256": hashlib.sha256(triton_key().encode()).hexdigest(),
        "backend_hash_sm_90": backend.hash(),
        "cache_invalidating_env": dict(sorted(get_cache_invalidating_env_vars().items())),
    }


def run_workload(shape: int, cache: Path, extra: Sequence[str], env_extra: dict[str, str]) -> dict[str, Any]:
    """Run the workload in a fresh process; return its summary plus wall seconds.

    Raises:
        RuntimeError: the workload exited non-zero.
    """
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache), **env_extra)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", WORKLOAD_MODULE, "--shape", str(shape), *extra],
                          env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"workload --shape {shape} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["process_wall_seconds"] = round(wall, 3)
    return summary


def entry_keys(cache: Path) -> dict[str, str]:
    """Key directory name -> kind, for every entry of the cache."""
    return {e.key: f"{e.kind}:{e.kernel}" for e in triton_cache.scan(cache).entries}


def prefill(args: argparse.Namespace) -> int:
    """Fill the cache ahead of time (aot mode) for every shape and write what was done."""
    cache = Path(args.cache).absolute()
    if cache.exists():
        shutil.rmtree(cache)
    shapes = [int(s) for s in args.shapes.split(",")]
    runs = [run_workload(n, cache, ["--mode", "aot", "--targets", args.targets], {}) for n in shapes]
    inv = triton_cache.scan(cache)
    result = {
        "host": platform.node(),
        "machine": "CPU only",
        "cache_dir": str(cache),
        "shapes": shapes,
        "targets": args.targets.split(","),
        "key_components": key_components(),
        "runs": runs,
        "entries": len(inv.entries),
        "kernel_entries_complete": sum(1 for e in inv.kernels if e.complete and not e.points_outside),
        "bytes": sum(e.bytes for e in inv.entries),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("cache_dir", "shapes", "entries", "bytes")}))
    return 0


def _device_name() -> str:
    try:
        import torch
    except ImportError:
        return f"{platform.node()} (no torch: plumbing check only)"
    if not torch.cuda.is_available():
        return f"{platform.node()} (no CUDA GPU: plumbing check only)"
    return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"


def gpu(args: argparse.Namespace) -> int:
    """Run prefilled / cold / warm on the GPU and write the proof."""
    cache = Path(args.cache).absolute()
    cold_cache = cache.parent / "cold"
    if cold_cache.exists():
        shutil.rmtree(cold_cache)
    pre = json.loads(Path(args.prefill).read_text())
    if pre["cache_dir"] != str(cache):
        raise SystemExit(f"the cache must be at {pre['cache_dir']} (where it was built), not {cache}")
    carried = triton_cache.scan(cache)
    carried_check = {
        "entries": len(carried.entries),
        "complete": sum(1 for e in carried.kernels if e.complete),
        "points_outside": sum(1 for e in carried.kernels if e.points_outside),
    }
    shapes: list[int] = pre["shapes"]
    # Warm the OS page cache for torch/triton imports so that process times compare compile work.
    jit = ["--mode", args.workload_mode]
    if args.workload_mode == "jit":
        subprocess.run([sys.executable, "-c", "import torch, triton; torch.zeros(1, device='cuda')"],
                       check=True)
    runs: dict[str, list[dict[str, Any]]] = {"prefilled": [], "cold": [], "warm": []}
    new_entries: dict[str, dict[str, str]] = {}
    errors: list[str] = []
    for label, target_cache in (("prefilled", cache), ("cold", cold_cache), ("warm", cold_cache)):
        before = entry_keys(target_cache) if target_cache.exists() else {}
        for n in shapes:
            try:
                runs[label].append(run_workload(n, target_cache, jit, {}))
            except RuntimeError as exc:
                errors.append(f"{label}: {exc}")
        after = entry_keys(target_cache) if target_cache.exists() else {}
        new_entries[label] = {k: v for k, v in after.items() if k not in before}
    if errors:
        failed = {"device": _device_name(), "errors": errors, "runs": runs,
                  "carried_cache_check": carried_check, "gpu_side_key_components": key_components(),
                  "cpu_side_prefill": pre}
        Path(args.out).write_text(json.dumps(failed, indent=2) + "\n")
        print("\n".join(errors), file=sys.stderr)
        return 1
    per_kernel = _per_kernel(shapes, runs)
    hits = sum(1 for k in per_kernel if k["prefilled_cache_hit"] is True)
    misses = sum(1 for k in per_kernel if k["prefilled_cache_hit"] is False)
    result = {
        "device": _device_name(),
        "gpu_side_key_components": key_components(),
        "cpu_side_prefill": pre,
        "carried_cache_check": carried_check,
        "verdict": {
            "passed": misses == 0 and hits == len(per_kernel),
            "kernels": len(per_kernel),
            "hits": hits,
            "misses": misses,
            "new_kernel_entries_on_gpu": sum(
                1 for v in new_entries["prefilled"].values() if v.startswith("kernel")),
            "new_other_entries_on_gpu": sorted(new_entries["prefilled"].values()),
        },
        "seconds": _seconds(runs),
        "new_entries": new_entries,
        "per_kernel": per_kernel,
        "runs": runs,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"verdict": result["verdict"], "seconds": result["seconds"]}))
    return 0 if result["verdict"]["passed"] else 1


def _per_kernel(shapes: list[int], runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each kernel of each shape: its hit and first-call seconds in the prefilled, cold and warm runs."""
    per_kernel = []
    for i, n in enumerate(shapes):
        for j, ev in enumerate(runs["prefilled"][i]["events"]):
            per_kernel.append({
                "shape": n, "case": ev["case"], "target": ev["target"],
                "prefilled_cache_hit": ev["cache_hit"],
                "prefilled_first_call_s": ev["seconds"],
                "cold_cache_hit": runs["cold"][i]["events"][j]["cache_hit"],
                "cold_first_call_s": runs["cold"][i]["events"][j]["seconds"],
                "warm_cache_hit": runs["warm"][i]["events"][j]["cache_hit"],
                "warm_first_call_s": runs["warm"][i]["events"][j]["seconds"],
            })
    return per_kernel


def _seconds(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """The first calls' and the processes' seconds, summed over the shapes of each run."""
    def total(label: str, key: str) -> float:
        return round(sum(r[key] for r in runs[label]), 3)

    return {
        "cold_first_calls": total("cold", "seconds"),
        "prefilled_first_calls": total("prefilled", "seconds"),
        "warm_first_calls": total("warm", "seconds"),
        "cold_process_wall": total("cold", "process_wall_seconds"),
        "prefilled_process_wall": total("prefilled", "process_wall_seconds"),
        "warm_process_wall": total("warm", "process_wall_seconds"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``prefill`` on the CPU machine, ``gpu`` on the GPU machine."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prefill")
    p.add_argument("--cache", default="/tmp/gpu-cache-proof/triton")
    p.add_argument("--shapes", default="1000,4096")
    p.add_argument("--targets", default="sm_90")
    p.add_argument("--out", required=True)
    g = sub.add_parser("gpu")
    g.add_argument("--cache", default="/tmp/gpu-cache-proof/triton")
    g.add_argument("--prefill", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--workload-mode", choices=("jit", "aot"), default="jit",
                   help="aot only checks this script's plumbing on a machine without a GPU")
    args = parser.parse_args(argv)
    return prefill(args) if args.step == "prefill" else gpu(args)


if __name__ == "__main__":
    sys.exit(main())
