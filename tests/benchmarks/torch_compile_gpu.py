"""torch.compile fan-outs (issue 31), measured side by side in one run.

    python tests/benchmarks/torch_compile_gpu.py --out tests/benchmarks/results [--workers 4,8]
    python tests/benchmarks/torch_compile_gpu.py --allow-cpu --quick --out DIR   # the logic, on a CPU
    python tests/benchmarks/torch_compile_gpu.py --exit [--repeats 3] --out DIR  # warm exits only

Every case is fresh processes of the built-in ``torch-compile`` workload (4 transformer blocks,
forward and backward, 2 sequence lengths; ``--quick``: 1 small block, 1 length):

- ``alone``: one process on an empty root under ``gpu-cache env`` (the cold process);
- ``warm``: a process on that root again; ``records``: what the records cost the processes
  (the hook's own seconds in each, and each record's bytes);
- ``carry``: a warm process on a fresh root at another path, fed from the cold process by
  copying its Inductor and Triton folders, or by torch's Mega-Cache (the cold process saved
  ``torch.compiler.save_cache_artifacts()``, this one loads it before its first compile);
- for each N of ``--workers``: ``storm_N``, N processes at once on an empty root with plain
  Inductor and Triton folders (no hook: every process compiles every graph), and ``flight_N``,
  N processes at once on an empty root under ``gpu-cache env`` (single-flight).

``--exit`` measures only how long a warm process takes to exit after its last line (issue 37),
side by side: plain Inductor and Triton folders without gpu-cache; the same with one compile
thread (torch starts no compile workers); gpu-cache; gpu-cache without records; gpu-cache
with the node-local tier on and its exit trim due; and a fan-out of the first ``--workers``
warm processes at once, plain and under gpu-cache. Each run goes through ``exit_trace.py``,
which times every exit handler (torch's compile-worker shutdown, the hook's record and tier
work) and the interpreter's finalization after them; medians of ``--repeats`` rounds, written
to DIR/<gpu|cpu>_torch_compile_exit.json and printed after each round (columns: the last
line, the exit, the time between, torch's compile-worker shutdown, gpu-cache's handlers, all
handlers, the finalization; seconds from the start). Each round is 5 warm processes and two
fan-outs, after 2 cold and 2 warm first runs.

Targets (issue 31): ``flight_N`` wall at most 1.1x ``alone``; its CPU at most 1.2x one cold
process plus N-1 warm ones; a warm process's compile part at most 0.15x the cold one's (the
workload's ``compile_seconds``: first step minus second step per length). Writes
DIR/<gpu|cpu>_torch_compile.json (after each case) and prints a line per case. On an H200 it
takes about 5.5 minutes (one cold process ~50 s, 3 warm ones ~20 s each, the storms and
fan-outs of 4 and 8 ~50-70 s each).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_benchmark import REPO, cache_environ, machine, run_many, run_one  # noqa: E402
from tier_gpu import tier_environ  # noqa: E402

from gpu_cache.core.names import TIER_VAR, TRIM_STAMP  # noqa: E402


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


def record_cost(root: Path) -> dict[str, Any]:
    """What the records cost the processes on ``root``: the hook's own seconds (key parts,
    the record's section) and each record's bytes."""
    found = [json.loads(p.read_text()) for p in (root / "records").glob("*.json")]
    sections = [r["inductor"] for r in found if "inductor" in r]
    return {"processes": len(sections),
            "states": sorted({f"{s.get('torch')}: {s.get('state')}; single-flight "
                              f"{(s.get('single_flight') or {}).get('state')}" for s in sections}),
            "hook_seconds": [s.get("hook_seconds") for s in sections],
            "record_bytes": sorted(p.stat().st_size for p in (root / "records").glob("*.json"))}


def alone_and_warm(cmd: list[str], scratch: Path) -> dict[str, Any]:
    """One cold process (it also saves its Mega-Cache artifacts), one warm one on its root."""
    root = scratch / "alone"
    cold = run_one([*cmd, "--save-artifacts", str(scratch / "mega.bin")], cache_environ(root, scratch))
    warm = run_one(cmd, cache_environ(root, scratch))
    cold_part, warm_part = compile_part(cold), compile_part(warm)
    return {
        "alone": brief(cold), "warm": brief(warm), "warm_cpu_seconds": warm["cpu_seconds"],
        "records": record_cost(root),
        "ratios": {"warm_compile_part_vs_cold": round(warm_part / cold_part, 3)
                   if cold_part and warm_part is not None else None},
    }


def carry(cmd: list[str], scratch: Path) -> dict[str, Any]:
    """A warm process on a fresh root at another path, fed two ways from the cold process: its
    Inductor and Triton folders copied there, or torch's Mega-Cache artifacts loaded before the
    first compile into an empty root."""
    source = scratch / "alone"
    folders = scratch / "carried-folders"
    for kind in ("inductor", "triton"):
        if (source / kind).is_dir():
            shutil.copytree(source / kind, folders / kind, symlinks=True)
    by_folders = run_one(cmd, cache_environ(folders, scratch))
    mega = scratch / "mega.bin"
    by_mega = run_one([*cmd, "--load-artifacts", str(mega)], cache_environ(scratch / "carried-mega", scratch))
    size = sum(p.stat().st_size for kind in ("inductor", "triton") for p in (source / kind).rglob("*")
               if p.is_file() and not p.is_symlink())
    return {"folders": {**brief(by_folders), "bytes": size},
            "mega_cache": {**brief(by_mega), "bytes": mega.stat().st_size if mega.exists() else None,
                           "load_seconds": by_mega.get("result", {}).get("artifacts_load_seconds")}}


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


EXIT_TRACE = HERE / "exit_trace.py"
#: The startup hook's exit handlers (exit_trace.py names each ``module.qualname``).
OURS = ("sitecustomize.", "gpu_cache_")
WORKERS_SHUTDOWN = "torch._inductor.async_compile.shutdown_compile_workers"


def traced_exit(command: list[str], environs: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Start ``command`` (``python -m MODULE ...``) under exit_trace.py once per environment,
    all at once; per process: when its last line came and when it ended (seconds from the
    start), and what its exit spent (exit_trace.py's lines)."""
    traced = [command[0], str(EXIT_TRACE), *command[2:]]
    started = time.time()
    runs: list[dict[str, Any]] = [{} for _ in environs]

    def one(environ: dict[str, str], run: dict[str, Any]) -> None:
        with tempfile.TemporaryFile("w+") as err:
            process = subprocess.Popen(traced, env=environ, stdout=subprocess.PIPE, stderr=err, text=True)
            assert process.stdout is not None
            for _line in process.stdout:
                run["last_line"] = time.time() - started
            _pid, status, _usage = os.wait4(process.pid, 0)
            ended = time.time()
            err.seek(0)
            marks = [line.split() for line in err if line.startswith("EXIT-TRACE ")]
        run.update(exit=round(ended - started, 3), returncode=os.waitstatus_to_exitcode(status))
        when = {m[1]: float(m[-1]) for m in marks if len(m) == 3}
        handlers = {m[2]: float(m[3]) for m in marks if len(m) == 5 and m[1] == "handler"}
        done = when.get("main-done", ended)
        run["after_last_line"] = round(ended - started - run.get("last_line", ended - started), 3)
        run["compile_workers_shutdown"] = handlers.get(WORKERS_SHUTDOWN, 0.0)
        run["gpu_cache_handlers"] = round(sum(v for k, v in handlers.items() if k.startswith(OURS)), 4)
        run["all_handlers"] = round(when.get("atexit-done", done) - done, 3)
        run["finalization"] = round(ended - when.get("atexit-done", ended), 3)
        run["handlers"] = {k: v for k, v in handlers.items() if v >= 0.001}

    threads = [threading.Thread(target=one, args=pair) for pair in zip(environs, runs, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return runs


FIGURES = ("last_line", "exit", "after_last_line", "compile_workers_shutdown", "gpu_cache_handlers",
           "all_handlers", "finalization")


def exit_cases(cmd: list[str], scratch: Path, repeats: int, workers: int,
               done: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Warm processes' exits, side by side (see the module's ``--exit``): a first run of each
    case that makes a root or a tier (compiled, or copied in, once), then ``repeats`` rounds of
    every case; ``done`` gets the table so far after each round."""
    plain, ours = scratch / "exit-plain", scratch / "exit-gpu-cache"
    local = scratch / "exit-tier"
    cases: dict[str, Callable[[], list[dict[str, str]]]] = {
        "plain": lambda: [plain_environ(plain)],
        "plain, 1 compile thread": lambda: [dict(plain_environ(plain), TORCHINDUCTOR_COMPILE_THREADS="1")],
        "gpu-cache": lambda: [cache_environ(ours, scratch)],
        "gpu-cache, no records": lambda: [dict(cache_environ(ours, scratch), GPU_CACHE_RECORDS="")],
        "gpu-cache, tier on, trim due": lambda: [tier_environ(ours, local)],
        f"plain, {workers} at once": lambda: [plain_environ(plain) for _ in range(workers)],
        f"gpu-cache, {workers} at once": lambda: [cache_environ(ours, scratch) for _ in range(workers)],
    }
    for name in ("plain", "plain, 1 compile thread", "gpu-cache", "gpu-cache, tier on, trim due"):
        traced_exit(cmd, cases[name]())  # (one compile thread may key Inductor's graphs apart)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    found: dict[str, Any] = {}
    for _round in range(repeats):
        for name, make in cases.items():
            environs = make()
            for tier in {e[TIER_VAR] for e in environs if e.get(TIER_VAR)}:
                (Path(tier) / TRIM_STAMP).unlink(missing_ok=True)  # the trim is due at this exit
            runs[name] += traced_exit(cmd, environs)
        found = {"repeats": _round + 1, "cases": {
            name: {"processes": len(ran), "failed": sum(1 for r in ran if r["returncode"]),
                   **{figure: round(statistics.median(r[figure] for r in ran), 3) for figure in FIGURES},
                   "slowest_exit": max(r["exit"] for r in ran), "handlers": ran[-1]["handlers"]}
            for name, ran in runs.items()}}
        done(found)
    return found


def print_exits(found: dict[str, Any]) -> None:
    print(f"{'case':<28} {'last line':>9} {'exit':>7} {'after':>7} {'workers':>8} {'ours':>7} "
          f"{'handlers':>8} {'finalize':>8}   (seconds, median of {found['repeats']})", flush=True)
    for name, row in found["cases"].items():
        print(f"{name:<28} {row['last_line']:>9} {row['exit']:>7} {row['after_last_line']:>7} "
              f"{row['compile_workers_shutdown']:>8} {row['gpu_cache_handlers']:>7} "
              f"{row['all_handlers']:>8} {row['finalization']:>8}"
              + (f"   {row['failed']} FAILED" if row["failed"] else ""), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the JSON result")
    parser.add_argument("--workers", default=None, help="fan-out sizes (default 4,8; --quick: 2,3)")
    parser.add_argument("--quick", action="store_true", help="a tiny model (to test the script)")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU")
    parser.add_argument("--exit", action="store_true",
                        help="only the warm processes' exits, side by side (issue 37)")
    parser.add_argument("--repeats", type=int, default=3, help="with --exit: rounds of every case")
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
    if args.exit:
        path = Path(args.out) / f"{'gpu' if gpu else 'cpu'}_torch_compile_exit.json"
        path.parent.mkdir(parents=True, exist_ok=True)

        def done(exits: dict[str, Any]) -> None:  # after each round: a run cut short keeps them
            path.write_text(json.dumps({"machine": found, "command": cmd[1:], "quick": args.quick,
                                        "seconds": round(time.perf_counter() - started, 1), **exits},
                                       indent=1) + "\n")
            print_exits(exits)

        try:
            exit_cases(cmd, scratch, args.repeats, workers[0], done)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"wrote {path} ({time.perf_counter() - started:.0f} s)")
        return 0
    try:
        base = alone_and_warm(cmd, scratch)
        alone, warm = base["alone"], base["warm"]
        print(f"alone: {alone['wall_seconds']} s, {alone['cpu_seconds']} CPU-s, compile part "
              f"{alone['compile_seconds']} s; warm: {warm['wall_seconds']} s, compile part "
              f"{warm['compile_seconds']} s; {base['ratios']}; records {base['records']}", flush=True)
        base["carry"] = carry(cmd, scratch)
        print(f"carried: {base['carry']}", flush=True)
        save(args.out, gpu, found, cmd, args.quick, started, base, [])
        cases = []
        for n in workers:
            case = fan_out(cmd, scratch, n, base)
            cases.append(case)
            save(args.out, gpu, found, cmd, args.quick, started, base, cases)
            storm = case["storm"]
            print(f"{n} at once: storm {storm['wall_seconds']} s / {storm['cpu_seconds']} CPU-s, "
                  f"single-flight {case['single_flight']['wall_seconds']} s / "
                  f"{case['single_flight']['cpu_seconds']} CPU-s; {case['ratios']}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {save(args.out, gpu, found, cmd, args.quick, started, base, cases)} "
          f"({time.perf_counter() - started:.0f} s)")
    return 0


def save(folder: str, gpu: bool, found: dict[str, Any], cmd: list[str], quick: bool, started: float,
         base: dict[str, Any], cases: list[dict[str, Any]]) -> Path:
    """Write what was measured so far (a run cut short keeps its finished cases)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{'gpu' if gpu else 'cpu'}_torch_compile.json"
    path.write_text(json.dumps({"machine": found, "command": cmd[1:], "quick": quick,
                                "seconds": round(time.perf_counter() - started, 1), **base,
                                "fan_out": cases}, indent=1) + "\n")
    return path


if __name__ == "__main__":
    raise SystemExit(main())
