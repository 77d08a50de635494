"""Single-flight of Triton's launcher library and autotune results (issue 26), side by side.

    python tests/benchmarks/flight_triton_files.py [--processes 4] [--rounds 3] [--bench-seconds 2]
        [--python PYTHON]

N processes (tests/fixtures/triton_files.py) lined up on one empty cache root that all need
the same file, with single-flight off and on (a fresh root each round):

- ``launcher``: what Triton's CUDA driver builds with the C compiler at a process's first
  launch, through ``triton.runtime.build``: its utils library (``CudaUtils``) and, on Triton
  <= 3.6, the launcher of a kernel signature (one here; a real job has one per signature).
  Linked against and loaded with a stub libcuda (no GPU here). Counted: C compiler calls.
- ``autotune``: Triton's ``Autotuner.check_disk_cache`` for one ``cache_results`` kernel, with
  a benchmark that sleeps ``--bench-seconds`` in place of the GPU's. Counted: benchmark runs.

Per case, the median over the rounds: the count, the wall seconds from the go signal until
the last process is done, and the CPU seconds of all N processes (their imports included, the
same in both columns). ``--python``: the interpreter of the jobs (e.g. a venv with another
Triton; the hook and gpu-cache's scripts need Python 3.9+). Runs on a CPU (gcc and Python's
headers needed); about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "scripts"), str(REPO / "tests" / "fixtures")]

import triton_files  # noqa: E402

from gpu_cache.config.settings import settings_from  # noqa: E402
from gpu_cache.jobenv import env  # noqa: E402

COUNTED = {"launcher": "C compiles", "autotune": "benchmarks"}


def job_env(root: Path, tools: Path, single_flight: bool) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("TRITON_", "GPU_CACHE_", "JAX_", "PYTHONPATH"))}
    base.update(triton_files.prepare(tools), PYTHONPATH=str(REPO / "scripts"))
    settings = settings_from({"single_flight": {"enabled": single_flight, "timeout": "5m"}},
                             cache_root=str(root))
    return env.job_environ(env.resolve(settings, base), base)


def one_round(work: Path, what: str, single_flight: bool, n: int, bench_seconds: float, python: str) -> dict:
    root, tools, sync = work / "root", work / "tools", work / "sync"
    for folder in (root, tools, sync):
        shutil.rmtree(folder, ignore_errors=True)
    sync.mkdir(parents=True)
    environ = job_env(root, tools, single_flight)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = [subprocess.Popen([python, str(triton_files.__file__), str(sync / f"ready{i}"),
                               str(sync / "go"), what, str(tools), str(bench_seconds)],
                              env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    while len(list(sync.glob("ready*"))) < n:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(procs[0].communicate()[1][-2000:])
        time.sleep(0.01)
    (sync / "go").touch()
    started = time.monotonic()
    outs = [p.communicate() for p in procs]
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    for proc, (_out, err) in zip(procs, outs, strict=True):
        if proc.returncode:
            raise RuntimeError(err[-2000:])
    answers = [json.loads(out.strip().splitlines()[-1]) for out, _err in outs]
    return {"count": triton_files.calls(tools, "cc" if what == "launcher" else "bench"),
            "wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "slowest": max(a["seconds"] for a in answers)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench-seconds", type=float, default=2.0)
    parser.add_argument("--python", default=sys.executable, help="the jobs' interpreter")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="triton-files-") as tmp:
        for what in COUNTED:
            for single_flight in (False, True):
                rounds = [one_round(Path(tmp), what, single_flight, args.processes, args.bench_seconds,
                                    args.python) for _ in range(args.rounds)]
                results[(what, single_flight)] = {k: statistics.median(r[k] for r in rounds)
                                                  for k in rounds[0]}
    version = subprocess.run([args.python, "-c", "import triton; print(triton.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    print(f"{args.processes} processes on an empty root, triton {version}, median of {args.rounds} rounds "
          f"(autotune benchmark: {args.bench_seconds:g} s, in place of the GPU's)")
    print(f"{'case':<10} {'counted':<11} {'storm':>6} {'single-flight':>14}   "
          "wall s (storm / single-flight)   CPU s (storm / single-flight)")
    for what, counted in COUNTED.items():
        off, on = results[(what, False)], results[(what, True)]
        print(f"{what:<10} {counted:<11} {off['count']:>6g} {on['count']:>14g}   "
              f"{off['wall']:>14.2f} / {on['wall']:<15.2f} {off['cpu']:>13.2f} / {on['cpu']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({f"{w}/{'single-flight' if sf else 'storm'}": r
                                         for (w, sf), r in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
