"""AlphaFold 3's real network across processes (issues 39, 50, 51): the figures, side by side in one run.

    python tests/benchmarks/alphafold3_gpu.py --python PY --site DIR \\
        --out tests/benchmarks/results/gpu_alphafold3.json [--bucket 256] [--workers 4] [--glu auto]
    python tests/benchmarks/alphafold3_gpu.py --per-gpu [--workers N] ...   # one worker per GPU
    python tests/benchmarks/alphafold3_gpu.py --cpu-smoke --python .ci-cache/py312-af3/bin/python \\
        --out tests/benchmarks/results/cpu_alphafold3_smoke.json

Each case is a fresh process of tests/benchmarks/alphafold3_run.py (ColabFold's wheel of
AlphaFold 3's model code, a poly-glycine chain filling ``--bucket``, random parameters of the real
shapes; wall and CPU seconds from ``wait4``), run with ``--python`` and ``--site`` first on
``PYTHONPATH``, with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` and, on a GPU, AlphaFold 3's
``XLA_FLAGS=--xla_gpu_enable_triton_gemm=false``:

* ``no_cache``: JAX's cache off (``JAX_ENABLE_COMPILATION_CACHE=false``);
* ``jax_cache_fill`` then ``jax_cache_warm``: JAX's cache alone, by hand
  (``JAX_COMPILATION_CACHE_DIR``, ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``);
* ``gpu_cache_cold`` then ``gpu_cache_warm``: ``gpu-cache env`` on an empty root, then again;
* ``fan_out``: ``--workers`` processes at once under ``gpu-cache env`` on another empty root;
* ``fan_out_warm``: as many at once on ``gpu_cache``'s warm root (nothing left to compile: what
  sharing one GPU costs; each worker's phases are in ``worker_results``).

``--per-gpu`` (issue 51): each fan-out worker sees one GPU of its own (``CUDA_VISIBLE_DEVICES=i``),
and the single processes GPU 0; ``--workers`` defaults to the GPUs ``nvidia-smi -L`` lists (more
workers than GPUs: an error). N cold at once, one per GPU, is then the promise as users meet it.

Where each process's wall goes (issue 50; tests/benchmarks/alphafold3_split.py): for every
process under gpu-cache (``split`` of a single case, ``splits`` of a fan-out's workers), its
start, the phases paid in every process, the waits on another process's compile (with the
longest waits' keys), its own compiles, loading entries, the rest of the compile phase,
running and its exit, from the driver's own timing and the startup hook's record of that
process (matched by pid); the residue (wall minus the phases) must stay within 5% of the wall.
``fan_out_minus_sharing_vs_cold`` is the fan-out's wall less what sharing costs (``fan_out_warm``
minus one warm process), over one cold process: issue 50's target, 1.1. ``checks`` says whether
the fan-out compiled each program once (its JAX misses are the cold process's, its hits N-1
times as many) and whether every split held.

Each process reports where its time goes (alphafold3_run.py: import, parameters, featurise, trace,
lower, compile, first call, second call; jax-triton, ptxas through ``PATH``, tokamax autotuning
and its cache misses), and the gpu-cache cases what the startup hook's records count. Targets
(issue 39), each printed with its ratio: a warm process's first call at most 1.5x its second
call; the fan-out at most 1.1x one cold process's wall. A missed target names the phases no cache
reaches (import, parameters, featurise, trace, lower: paid in every process).

Kernels (``--glu``): the network's default kernels are tokamax's Pallas-Triton attention (inside
JAX's cache) and tokamax's Triton GLU through jax-triton 0.4.1. That GLU lowers only on a Triton
that can unpack its tuple constants (measured here: 3.9.0 can; 3.6.0, the H100/H200 image's, and
3.7.1 fail with "cannot convert (128, 1) of type <class 'tuple'> to tensor"), so ``--glu auto``
takes ``triton`` where the Python's Triton is >= 3.9 and tokamax's XLA GLU otherwise (the JSON
says which, and why); the driver sets ``TMA_TF32`` in Triton's NVIDIA driver module first where it
is missing (jax-triton 0.4.1 imports it with the backend; Triton 3.6.0 lacks it).

The carry for the GPU machine (jax 0.11.2 and triton 3.6.0 are in its image):
``bash tests/benchmarks/alphafold3_wheels.sh`` builds ``.carry/af3`` here (48 MB of cp312 wheels
pinned by .ci/af3-constraints.txt, the chemical components built from biotite's with AlphaFold 3's
parser, and a stand-in ``xprof``: tokamax imports it only for its own benchmarking tools). Then
on the device (``run`` with ``carry: [".carry/af3"]``, about 50 MiB):

    pip install -q --no-index --no-deps --target /tmp/site .carry/af3/wheels/*.whl && \\
      cp .carry/af3/dictionary/* /tmp/site/alphafold3/constants/converters/ && \\
      cp -r .carry/af3/stub/xprof /tmp/site/ && \\
      python3 tests/benchmarks/alphafold3_gpu.py --site /tmp/site --bucket 256 \\
        --only gpu_cache,fan_out,fan_out_warm --out $OUT/gpu_alphafold3.json

On a host of several GPUs (issue 51) the same command with ``--per-gpu`` (one worker per GPU
``nvidia-smi -L`` lists). ``--only`` runs some groups of cases (a device command may take
600 s): on an H100 the groups took about 46 s (``no_cache``), 70 s (``jax_cache``), 71 s
(``gpu_cache``) and 79 s (``fan_out``, 4 workers); ``fan_out_warm`` needs ``gpu_cache`` in the
same call (its warm root). ``--cpu-smoke`` runs every case here on the CPU with a tiny network (bucket 16, 1
recycle, 1 sample, 2 diffusion steps, XLA attention and GLU, 2 workers): the logic, not the
figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alphafold3_split import TOLERANCE, UNCACHED, splits, table
from flight_costs import flight_costs
from jax_triton_gpu import job_environ, plain_environ, run_many, run_one
from timing import publish

from gpu_cache.core import hook_records

DRIVER = Path(__file__).resolve().parent / "alphafold3_run.py"
TARGETS = {"warm_first_vs_second_call": 1.5, "fan_out_vs_cold": 1.1, "fan_out_minus_sharing_vs_cold": 1.1}
SMOKE = ["--bucket", "16", "--recycles", "1", "--samples", "1", "--steps", "2", "--attention", "xla"]


def _triton_version(python: str) -> str | None:
    done = subprocess.run([python, "-c", "import triton; print(triton.__version__)"], capture_output=True,
                          text=True, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else None


def choose_glu(asked: str, python: str) -> tuple[str, str]:
    """(the GLU, why)."""
    if asked != "auto":
        return asked, "asked for"
    version = _triton_version(python)
    parts = tuple(int(p) for p in (version or "0").split(".")[:2] if p.isdigit())
    if parts >= (3, 9):
        return "triton", f"triton {version} lowers tokamax's Triton GLU"
    return "xla", (f"triton {version} cannot lower tokamax 0.0.17's Triton GLU (its tuple constants); "
                   "tokamax's XLA GLU instead")


def gpu_count() -> int:
    """The NVIDIA GPUs ``nvidia-smi -L`` lists (0 where there is none)."""
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines()) if done.returncode == 0 else 0


def _ptxas_wrapper(folder: Path) -> Path | None:
    """A ``ptxas`` first on PATH that logs each call's start and end (bash's EPOCHREALTIME) and
    runs the real one; None where there is none on PATH."""
    real = shutil.which("ptxas")
    if real is None:
        return None
    (folder / "bin").mkdir()
    wrapper = folder / "bin" / "ptxas"
    wrapper.write_text(f'#!/bin/bash\ns=$EPOCHREALTIME\n"{real}" "$@"\nrc=$?\n'
                       f'echo "$s $EPOCHREALTIME" >> "$AF3_BENCH_PTXAS_LOG"\nexit $rc\n')
    wrapper.chmod(0o755)
    return folder / "bin"


def _case(environ: dict[str, str], work: Path, name: str, gpu: int | None = None) -> dict[str, str]:
    """A case's environment: its ptxas log, the timing ptxas first on PATH, and with ``gpu``
    (``--per-gpu``) that GPU alone visible."""
    environ = dict(environ, AF3_BENCH_PTXAS_LOG=str(work / f"ptxas-{name}.log"))
    if (work / "bin").is_dir():
        environ["PATH"] = f"{work / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
    if gpu is not None:
        environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return environ


#: The groups of cases, in the order they run (``--only`` picks some: a group's cases need one another).
GROUPS = ("no_cache", "jax_cache", "gpu_cache", "fan_out", "fan_out_warm")


def _single(command: list[str], environ: dict[str, str]) -> dict[str, Any]:
    """One process, with the split of its time where the hook recorded it."""
    run = run_one(command, environ)
    folder = environ.get("GPU_CACHE_RECORDS")
    if folder:
        found = list(hook_records.read(Path(folder), environ["GPU_CACHE_RUN_ID"]))
        run["split"] = splits([run], found)[0]
    return run


def _many(command: list[str], environs: list[dict[str, str]]) -> dict[str, Any]:
    """Processes at once, with each one's split."""
    run = run_many(command, environs)
    found = list(hook_records.read(Path(environs[0]["GPU_CACHE_RECORDS"]), run["run_id"]))
    runs = [dict(worker, result=result)
            for worker, result in zip(run["workers"], run["worker_results"], strict=True)]
    run["splits"] = splits(runs, found)
    run["flight_costs"] = flight_costs(found)
    return run


def run_cases(python: str, flags: list[str], workers: int, work: Path, only: tuple[str, ...],
              per_gpu: bool = False) -> dict[str, Any]:
    """The cases of the groups in ``only``; ``per_gpu``: each fan-out worker on its own GPU
    (``CUDA_VISIBLE_DEVICES=i``) and the single processes on GPU 0."""
    command = [python, str(DRIVER), *flags]
    first = 0 if per_gpu else None
    cases: dict[str, Any] = {}
    if "no_cache" in only:
        off = dict(plain_environ(work / "unused"), JAX_ENABLE_COMPILATION_CACHE="false")
        cases["no_cache"] = run_one(command, _case(off, work, "no_cache", first))
    for name in ("jax_cache_fill", "jax_cache_warm") if "jax_cache" in only else ():
        cases[name] = run_one(command, _case(plain_environ(work / "jax-only"), work, name, first))
    for name in ("gpu_cache_cold", "gpu_cache_warm") if "gpu_cache" in only else ():
        cases[name] = _single(command, _case(job_environ(work / "root", None), work, name, first))
    for name, root in (("fan_out", "fan-root"), ("fan_out_warm", "root")):  # warm: gpu_cache's root
        if name in only:
            cases[name] = _many(command, [_case(job_environ(work / root, None), work, f"{name}{i}",
                                                i if per_gpu else None) for i in range(workers)])
    return cases


def _jax_counts(case: dict[str, Any]) -> tuple[int, int]:
    jax = (case.get("cache") or {}).get("jax") or {}
    return jax.get("hits", 0), jax.get("misses", 0)


def summary(cases: dict[str, Any], workers: int) -> dict[str, Any]:
    ratios, uncached, checks = {}, {}, {}
    warm = cases.get("gpu_cache_warm") or {}
    result = warm.get("result") or {}
    wall = {name: case["wall_seconds"] for name, case in cases.items()}
    if result.get("second_call"):
        ratios["warm_first_vs_second_call"] = round(result["first_call"] / result["second_call"], 3)
        uncached = {phase: result.get(phase) for phase in UNCACHED}
    if "fan_out" in cases and "gpu_cache_cold" in cases:
        ratios["fan_out_vs_cold"] = round(wall["fan_out"] / wall["gpu_cache_cold"], 3)
        programs = _jax_counts(cases["gpu_cache_cold"])[1]
        checks["fan_out_compiled_each_program_once"] = \
            _jax_counts(cases["fan_out"]) == ((workers - 1) * programs, programs)
    if "fan_out_warm" in cases and "gpu_cache_warm" in cases:  # no target: the GPU's share
        ratios["fan_out_warm_vs_warm"] = round(wall["fan_out_warm"] / wall["gpu_cache_warm"], 3)
        if "fan_out_vs_cold" in ratios:
            sharing = wall["fan_out_warm"] - wall["gpu_cache_warm"]
            ratios["fan_out_minus_sharing_vs_cold"] = round((wall["fan_out"] - sharing)
                                                            / wall["gpu_cache_cold"], 3)
    parts = [p for case in cases.values() for p in [case.get("split"), *case.get("splits", [])] if p]
    checks["splits_within_tolerance"] = all(p["within_tolerance"] for p in parts)
    checks["largest_residue_share"] = max((p["residue_share"] for p in parts), default=None)
    missed = {name: ratio for name, ratio in ratios.items() if name in TARGETS and ratio > TARGETS[name]}
    share = round(sum(v or 0 for v in uncached.values()) / warm["wall_seconds"], 3) if uncached else None
    return {"ratios": ratios, "targets": TARGETS, "missed": missed, "checks": checks,
            "warm_uncached_seconds": uncached, "warm_uncached_share": share}


def _print(report: dict[str, Any]) -> None:
    phases = ("import", "parameters", "featurise", "trace", "lower", "compile", "first_call",
              "second_call", "jax_triton", "ptxas", "tokamax_autotune", "tokamax_misses")
    print(f"{'case':16}{'wall':>8}{'cpu':>8} " + " ".join(f"{p[:10]:>10}" for p in phases))
    for name, case in report["cases"].items():
        result = case.get("result") or {}
        cells = " ".join(f"{result.get(p, '-')!s:>10}" for p in phases)
        print(f"{name:16}{case['wall_seconds']:>8}{case['cpu_seconds']:>8} {cells}")
    rows = [(name, case["split"]) for name, case in report["cases"].items() if case.get("split")]
    rows += [(f"{name}[{i}]", part) for name, case in report["cases"].items()
             for i, part in enumerate(case.get("splits") or []) if part]
    if rows:
        print(f"where each process's wall goes (seconds; residue within {TOLERANCE:.0%} of the wall):")
        print(table(rows))
    for name, case in report["cases"].items():
        for row in (case.get("flight_costs") or [])[:3]:
            print(f"{name}: waited up to {row['longest_wait']} s for {row['key'][:60]}, which its leader "
                  f"compiled in {row['leader_compile']} s (over by {row['over']} s)")
    for name, ratio in report["summary"]["ratios"].items():
        verdict = "missed" if name in report["summary"]["missed"] else "met"
        print(f"{name}: {ratio}" + (f" (target <= {TARGETS[name]}: {verdict})" if name in TARGETS else ""))
    print(f"checks: {report['summary']['checks']}")
    if report["summary"]["missed"]:
        uncached = report["summary"]["warm_uncached_seconds"]
        print(f"paid in every warm process, no cache reaches it: {uncached}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="a Python 3.12 with jax (CUDA on a GPU)")
    parser.add_argument("--site", help="a folder of the carried packages, put first on PYTHONPATH")
    parser.add_argument("--bucket", type=int, default=256)
    parser.add_argument("--workers", type=int,
                        help="processes of a fan-out (default 4; with --per-gpu, one per GPU)")
    parser.add_argument("--per-gpu", action="store_true",
                        help="each fan-out worker on a GPU of its own (CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--glu", choices=("auto", "triton", "xla"), default="auto")
    parser.add_argument("--only", default=",".join(GROUPS),
                        help=f"the groups of cases to run, comma-separated (default: {','.join(GROUPS)})")
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny network on this CPU")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    only = tuple(g for g in args.only.split(",") if g)
    if not only or set(only) - set(GROUPS):
        parser.error(f"--only takes some of {', '.join(GROUPS)}")
    if args.workers is not None and args.workers < 1:
        parser.error("--workers takes a whole number of at least 1")
    gpus = None if args.cpu_smoke or not args.per_gpu else gpu_count()
    if gpus is not None and gpus < (args.workers or 1):
        parser.error(f"--per-gpu: {args.workers or 1} worker(s) need a GPU each; nvidia-smi -L lists {gpus}")
    if args.site:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (args.site, os.environ.get("PYTHONPATH")) if p)
    if args.cpu_smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
        flags, glu, why, workers = [*SMOKE, "--glu", "xla"], "xla", "--cpu-smoke", min(args.workers or 2, 2)
    else:
        os.environ.setdefault("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")  # AlphaFold 3's images
        glu, why = choose_glu(args.glu, args.python)
        flags, workers = ["--bucket", str(args.bucket), "--glu", glu], args.workers or gpus or 4
    with tempfile.TemporaryDirectory(prefix="gpu-cache-af3-bench-") as scratch:
        work = Path(scratch)
        ptxas = _ptxas_wrapper(work)
        cases = run_cases(args.python, flags, workers, work, only, per_gpu=args.per_gpu)
    report = {"flags": flags, "glu": glu, "glu_why": why, "workers": workers, "per_gpu": args.per_gpu,
              "gpus": gpus, "ptxas_timed": ptxas is not None, "cases": cases}
    failed = [name for name, case in cases.items()
              if case.get("returncode", 0) or not case.get("all_ok", True)]
    report["failed"] = failed
    if not failed:
        report["summary"] = summary(cases, workers)
        _print(report)
    else:
        print(f"failed: {failed}: {[cases[n].get('stderr_tail', '')[-600:] for n in failed]}")
    publish(report, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
