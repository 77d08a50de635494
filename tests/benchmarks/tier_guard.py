"""Benchmark: what judging the node-local tier on the node adds to each process's start.

    python tests/benchmarks/tier_guard.py [--repeats 200] [--out FILE]

Every Python process of a job with the tier on runs the startup hook's guard before any tool
reads the tier: it makes the tier's folders that are missing (0700) and judges the tier, every
folder above it and its kind folders by the trust rule (``gpu_cache_hook.trust.guard``).
This times, interleaved, the hook's ``sitecustomize`` import as ``python -X importtime`` reports
it (measured inside the process, so other load on the machine moves it less than wall time)
with the hook's environment without the tier and with it, for ``python -c pass``; and the
wall time of both. Prints medians and the difference, and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "scripts" / "gpu_cache" / "_hook"


def environs(base: Path) -> dict[str, dict[str, str]]:
    ours = ("GPU_CACHE_", "JAX_", "TRITON_", "PYTHON")
    plain = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    tier = Path("/tmp") / f"gpu-cache-{os.getuid()}" / "tier" / "benchmark0000000"
    hooked = plain | {"PYTHONPATH": str(HOOK), "GPU_CACHE_RECORDS": str(base / "records")}
    with_tier = hooked | {"GPU_CACHE_TIER": str(tier), "GPU_CACHE_SHARED": str(base / "root"),
                          "JAX_COMPILATION_CACHE_DIR": str(tier / "jax"),
                          "TRITON_CACHE_DIR": str(tier / "triton")}
    return {"hook, no tier": hooked, "hook, tier": with_tier}


def one(env: dict[str, str]) -> tuple[float, float]:
    """(sitecustomize import microseconds, wall seconds) of ``python -X importtime -c pass``."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env, capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - started
    if "gpu-cache:" in done.stderr:
        raise SystemExit(f"the hook warned: {done.stderr}")
    for line in done.stderr.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) == 3 and fields[2] == "sitecustomize":
            return float(fields[1]), wall
    raise SystemExit("no sitecustomize in -X importtime's output")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path,
                        default=REPO / "tests" / "benchmarks" / "results" / "tier_guard.json")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpu-cache-guard-"))
    cases = environs(base)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for env in cases.values():
        one(env)  # warm up (bytecode, the tier's folders made once)
    for _ in range(args.repeats):
        for name, env in cases.items():
            samples[name].append(one(env))
    medians = {name: {"sitecustomize_us": statistics.median(s[0] for s in got),
                      "wall_ms": 1000 * statistics.median(s[1] for s in got)}
               for name, got in samples.items()}
    extra = medians["hook, tier"]["sitecustomize_us"] - medians["hook, no tier"]["sitecustomize_us"]
    for name, median in medians.items():
        print(f"{name:>14}: sitecustomize {median['sitecustomize_us']:7.0f} us, "
              f"wall {median['wall_ms']:6.1f} ms")
    print(f"the guard adds {extra:.0f} us to each process's start (median of {args.repeats})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"repeats": args.repeats, "medians": medians, "guard_us": extra,
                                    "python": sys.version.split()[0]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
