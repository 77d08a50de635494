"""Benchmark: one workload in fresh processes with no cache, an empty cache, and a warm cache.

    python tests/benchmarks/warm_start.py [--workload jax-transformer] [--repeats 3] [--out FILE]

Each repeat uses a new cache root; the three cases run side by side in one invocation, so
their ratios compare like with like. Prints a table and writes the raw figures as JSON,
with the machine and package versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from gpu_cache.config.settings import settings_from
from gpu_cache.config.workloads import python_for, resolve_workload, run_command
from gpu_cache.core import device, software
from gpu_cache.jobenv import env


def measure(workload_name: str, repeats: int, shapes: list[str] | None) -> dict:
    config = {"workloads": {workload_name: {"shapes": shapes}}} if shapes else {}
    results: dict[str, list[float]] = {"no_cache": [], "cold_cache": [], "warm_cache": []}
    with open(os.devnull, "w") as log:
        for repeat in range(repeats):
            with tempfile.TemporaryDirectory(prefix="gpu-cache-bench-") as scratch:
                for case in ("no_cache", "cold_cache", "warm_cache"):
                    root = "none" if case == "no_cache" else str(Path(scratch) / "cache")
                    settings = settings_from(config, cache_root=root)
                    workload = resolve_workload(settings, workload_name)
                    environ = env.job_environ(env.resolve(settings))
                    if case == "no_cache":
                        environ["TRITON_CACHE_DIR"] = str(Path(scratch) / f"throwaway-{repeat}")
                    total = 0.0
                    for shape, command in workload.commands(python_for(settings), "bench"):
                        run = run_command(workload, shape, command, environ, log)
                        if not run.ok:
                            raise SystemExit(
                            f"benchmark: {workload_name} shape {shape} failed ({run.returncode})")
                        total += run.seconds
                    results[case].append(total)
                    print(f"repeat {repeat + 1}/{repeats} {case}: {total:.2f} s", file=sys.stderr)
    medians = {case: statistics.median(values) for case, values in results.items()}
    return {
        "workload": workload_name,
        "shapes": list(workload.shapes),
        "repeats": repeats,
        "seconds": results,
        "median_seconds": medians,
        "speedup_warm_vs_no_cache": round(medians["no_cache"] / medians["warm_cache"], 2),
        "machine": {"device": device.detect().as_dict(), "platform": platform.platform(),
                    "python": platform.python_version(), "processor": platform.processor(),
                    "versions": software.identity()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="jax-transformer")
    parser.add_argument("--shapes", help="comma-separated shapes (default: the workload's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write the JSON here")
    args = parser.parse_args()
    result = measure(args.workload, args.repeats, args.shapes.split(",") if args.shapes else None)
    m = result["median_seconds"]
    print(f"{result['workload']} shapes {result['shapes']} on {result['machine']['device']['name']}, "
          f"median of {args.repeats}, all shapes, whole processes:")
    print(f"  no cache   {m['no_cache']:6.2f} s")
    print(f"  cold cache {m['cold_cache']:6.2f} s  ({m['cold_cache'] / m['no_cache']:.2f}x of no cache)")
    speedup = result["speedup_warm_vs_no_cache"]
    print(f"  warm cache {m['warm_cache']:6.2f} s  ({speedup:.2f}x faster than no cache)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
