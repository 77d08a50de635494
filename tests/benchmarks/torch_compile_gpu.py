"""torch.compile fan-outs (issue 31), measured side by side in one run.

    python tests/benchmarks/torch_compile_gpu.py --out tests/benchmarks/results [--workers 4,8]
    python tests/benchmarks/torch_compile_gpu.py --allow-cpu --quick --out DIR   # the logic, on a CPU

Every case is fresh processes of the built-in ``torch-compile`` workload (4 transformer blocks,
forward and backward, 2 sequence lengths; ``--quick``: 1 small block, 1 length):

- ``alone``: one process on an empty root under ``gpu-cache env`` (the cold process);
- ``warm``: a process on that root again, twice, each beside a ``bare_warm`` process on the
  same folders without the startup hook: what the hook (records, single-flight) costs a
  process that hits everything;
- for each N of ``--workers``: ``storm_N``, N processes at once on an empty root with plain
  Inductor and Triton folders (no hook: every process compiles every graph), and ``flight_N``,
  N processes at once on an empty root under ``gpu-cache env`` (single-flight).

Targets (issue 31): ``flight_N`` wall at most 1.1x ``alone``; its CPU at most 1.2x one cold
process plus N-1 warm ones; a warm process's compile part at most 0.15x the cold one's (the
workload's ``compile_seconds``: first step minus second step per length). Writes
DIR/<gpu|cpu>_torch_compile.json and prints a line per case. On an H200 it takes about 5.5
minutes (one cold process ~50 s, 4 warm ~15 s each, storms and fan-outs ~50-70 s each).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_benchmark import REPO, cache_environ, machine, run_many, run_one  # noqa: E402


def command(quick: bool) -> list[str]:
    size = (["--blocks", "1", "--d-model", "32", "--heads", "2", "--batch", "2", "--shape", "16"]
            if quick else ["--blocks", "4", "--d-model", "1024", "--heads", "16", "--batch", "8",
                           "--shape", "256,512"])
    return [sys.executable, "-m", "gpu_cache.workloads.torch_compile", *size]


def plain_environ(root: Path) -> dict[str, str]:
    """A job on plain Inductor and Triton folders under ``root``: no gpu-cache, no hook."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPU_CACHE_", "TORCHINDUCTOR_", "TRITON_")) and k != "PYTHONPATH"}
    environ.update(TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"), TRITON_CACHE_DIR=str(root / "triton"),
                   PYTHONPATH=str(REPO / "scripts"), GPU_CACHE_RUN_ID="-")
    return environ


def compile_part(run: dict[str, Any]) -> float | None:
    """The workload's compile part of one process (None: it printed none)."""
    found = run.get("result", {}).get("compile_seconds")
    return float(found) if isinstance(found, (int, float)) else None


def brief(run: dict[str, Any]) -> dict[str, Any]:
    """A single run without its full output: wall, CPU, compile part, Inductor's counts."""
    out = {k: run.get(k) for k in ("wall_seconds", "cpu_seconds", "returncode")}
    out["compile_seconds"] = compile_part(run)
    out["inductor"] = (run.get("cache") or {}).get("inductor")
    return out


def alone_and_warm(cmd: list[str], scratch: Path) -> dict[str, Any]:
    root = scratch / "alone"
    cold = run_one(cmd, cache_environ(root, scratch))
    warm, bare = [], []
    for _ in range(2):  # alternated: both see the same machine state
        warm.append(run_one(cmd, cache_environ(root, scratch)))
        bare.append(run_one(cmd, plain_environ(root)))
    med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    cold_part, warm_part = compile_part(cold), statistics.median(compile_part(r) or 0.0 for r in warm)
    return {
        "alone": brief(cold), "warm": [brief(r) for r in warm], "bare_warm": [brief(r) for r in bare],
        "warm_cpu_seconds": med(warm, "cpu_seconds"),
        "ratios": {
            "warm_compile_part_vs_cold": round(warm_part / cold_part, 3) if cold_part else None,
            "hook_cost_wall_seconds": round(med(warm, "wall_seconds") - med(bare, "wall_seconds"), 3),
            "hook_cost_cpu_seconds": round(med(warm, "cpu_seconds") - med(bare, "cpu_seconds"), 3),
        },
    }


def fan_out(cmd: list[str], scratch: Path, workers: int, base: dict[str, Any]) -> dict[str, Any]:
    storm = run_many(cmd, [plain_environ(scratch / f"storm{workers}") for _ in range(workers)])
    flight = run_many(cmd, [cache_environ(scratch / f"flight{workers}", scratch) for _ in range(workers)])
    alone = base["alone"]
    floor_cpu = alone["cpu_seconds"] + (workers - 1) * base["warm_cpu_seconds"]
    return {
        "workers": workers, "storm": storm, "single_flight": flight,
        "floor_cpu_seconds": round(floor_cpu, 2),
        "ratios": {
            "single_flight_wall_vs_alone": round(flight["wall_seconds"] / alone["wall_seconds"], 3),
            "storm_wall_vs_alone": round(storm["wall_seconds"] / alone["wall_seconds"], 3),
            "single_flight_cpu_vs_floor": round(flight["cpu_seconds"] / floor_cpu, 3),
            "storm_cpu_vs_floor": round(storm["cpu_seconds"] / floor_cpu, 3),
            "single_flight_fx_misses": ((flight.get("cache") or {}).get("inductor") or {}).get("misses"),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the JSON result")
    parser.add_argument("--workers", default=None, help="fan-out sizes (default 4,8; --quick: 2,3)")
    parser.add_argument("--quick", action="store_true", help="a tiny model (to test the script)")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU")
    args = parser.parse_args()
    found = machine()
    gpu = found["device"]["gpu_type"] != "cpu"
    if not gpu and not args.allow_cpu:
        print("torch_compile_gpu: no NVIDIA GPU here; --allow-cpu runs it on the CPU")
        return 0
    workers = [int(n) for n in (args.workers or ("2,3" if args.quick else "4,8")).split(",")]
    cmd = command(args.quick)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-cache-torch-compile-"))
    started = time.perf_counter()
    try:
        base = alone_and_warm(cmd, scratch)
        alone, warm = base["alone"], [r["wall_seconds"] for r in base["warm"]]
        print(f"alone: {alone['wall_seconds']} s, {alone['cpu_seconds']} CPU-s, compile part "
              f"{alone['compile_seconds']} s; warm: {warm} s (without the hook "
              f"{[r['wall_seconds'] for r in base['bare_warm']]} s); {base['ratios']}", flush=True)
        cases = []
        for n in workers:
            case = fan_out(cmd, scratch, n, base)
            cases.append(case)
            storm = case["storm"]
            print(f"{n} at once: storm {storm['wall_seconds']} s / {storm['cpu_seconds']} CPU-s, "
                  f"single-flight {case['single_flight']['wall_seconds']} s / "
                  f"{case['single_flight']['cpu_seconds']} CPU-s; {case['ratios']}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{'gpu' if gpu else 'cpu'}_torch_compile.json"
    (out / name).write_text(json.dumps({"machine": found, "command": cmd[1:], "quick": args.quick,
                                        "seconds": round(time.perf_counter() - started, 1), **base,
                                        "fan_out": cases}, indent=1))
    print(f"wrote {out / name} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
