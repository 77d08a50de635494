"""AlphaFold 3's real network across processes (issue 39): the figures, side by side in one run.

    python tests/benchmarks/alphafold3_gpu.py --python PY --site DIR \\
        --out tests/benchmarks/results/gpu_alphafold3.json [--bucket 256] [--workers 4] [--glu auto]
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
        --out $OUT/gpu_alphafold3.json

``--only gpu_cache,fan_out`` (for example) runs some groups of cases (the 600 s a device command
may take: split the groups over two calls). ``--cpu-smoke`` runs every case here on the CPU with
a tiny network (bucket 16, 1 recycle, 1 sample, 2 diffusion steps, XLA attention and GLU, 2
workers): the logic, not the figures.
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

from jax_triton_gpu import job_environ, plain_environ, run_many, run_one
from timing import publish

DRIVER = Path(__file__).resolve().parent / "alphafold3_run.py"
TARGETS = {"warm_first_vs_second_call": 1.5, "fan_out_vs_cold": 1.1}
#: Paid in every process, hit or miss: what no compile cache reaches.
UNCACHED = ("import", "parameters", "featurise", "trace", "lower")
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


def _case(environ: dict[str, str], work: Path, name: str) -> dict[str, str]:
    environ = dict(environ, AF3_BENCH_PTXAS_LOG=str(work / f"ptxas-{name}.log"))
    if (work / "bin").is_dir():
        environ["PATH"] = f"{work / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
    return environ


#: The groups of cases, in the order they run (``--only`` picks some: a group's cases need one another).
GROUPS = ("no_cache", "jax_cache", "gpu_cache", "fan_out", "fan_out_warm")


def run_cases(python: str, flags: list[str], workers: int, work: Path,
              only: tuple[str, ...]) -> dict[str, Any]:
    command = [python, str(DRIVER), *flags]
    cases: dict[str, Any] = {}
    if "no_cache" in only:
        off = dict(plain_environ(work / "unused"), JAX_ENABLE_COMPILATION_CACHE="false")
        cases["no_cache"] = run_one(command, _case(off, work, "no_cache"))
    for name in ("jax_cache_fill", "jax_cache_warm") if "jax_cache" in only else ():
        cases[name] = run_one(command, _case(plain_environ(work / "jax-only"), work, name))
    for name in ("gpu_cache_cold", "gpu_cache_warm") if "gpu_cache" in only else ():
        cases[name] = run_one(command, _case(job_environ(work / "root", None), work, name))
    if "fan_out" in only:
        fan = [_case(job_environ(work / "fan-root", None), work, f"fan_out{i}") for i in range(workers)]
        cases["fan_out"] = run_many(command, fan)
    if "fan_out_warm" in only:  # after gpu_cache: what sharing one GPU costs with nothing to compile
        fan = [_case(job_environ(work / "root", None), work, f"fan_out_warm{i}") for i in range(workers)]
        cases["fan_out_warm"] = run_many(command, fan)
    return cases


def summary(cases: dict[str, Any]) -> dict[str, Any]:
    ratios, uncached = {}, {}
    warm = cases.get("gpu_cache_warm") or {}
    result = warm.get("result") or {}
    if result.get("second_call"):
        ratios["warm_first_vs_second_call"] = round(result["first_call"] / result["second_call"], 3)
        uncached = {phase: result.get(phase) for phase in UNCACHED}
    if "fan_out" in cases and "gpu_cache_cold" in cases:
        cold = cases["gpu_cache_cold"]["wall_seconds"]
        ratios["fan_out_vs_cold"] = round(cases["fan_out"]["wall_seconds"] / cold, 3)
    if "fan_out_warm" in cases and "gpu_cache_warm" in cases:  # no target: the GPU's share
        ratios["fan_out_warm_vs_warm"] = round(cases["fan_out_warm"]["wall_seconds"]
                                               / cases["gpu_cache_warm"]["wall_seconds"], 3)
    missed = {name: ratio for name, ratio in ratios.items() if name in TARGETS and ratio > TARGETS[name]}
    share = round(sum(v or 0 for v in uncached.values()) / warm["wall_seconds"], 3) if uncached else None
    return {"ratios": ratios, "targets": TARGETS, "missed": missed, "warm_uncached_seconds": uncached,
            "warm_uncached_share": share}


def _print(report: dict[str, Any]) -> None:
    phases = ("import", "parameters", "featurise", "trace", "lower", "compile", "first_call",
              "second_call", "jax_triton", "ptxas", "tokamax_autotune", "tokamax_misses")
    print(f"{'case':16}{'wall':>8}{'cpu':>8} " + " ".join(f"{p[:10]:>10}" for p in phases))
    for name, case in report["cases"].items():
        result = case.get("result") or {}
        cells = " ".join(f"{result.get(p, '-')!s:>10}" for p in phases)
        print(f"{name:16}{case['wall_seconds']:>8}{case['cpu_seconds']:>8} {cells}")
    for name, ratio in report["summary"]["ratios"].items():
        verdict = "missed" if name in report["summary"]["missed"] else "met"
        print(f"{name}: {ratio} (target <= {TARGETS[name]}: {verdict})")
    if report["summary"]["missed"]:
        uncached = report["summary"]["warm_uncached_seconds"]
        print(f"paid in every warm process, no cache reaches it: {uncached}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="a Python 3.12 with jax (CUDA on a GPU)")
    parser.add_argument("--site", help="a folder of the carried packages, put first on PYTHONPATH")
    parser.add_argument("--bucket", type=int, default=256)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--glu", choices=("auto", "triton", "xla"), default="auto")
    parser.add_argument("--only", default=",".join(GROUPS),
                        help=f"the groups of cases to run, comma-separated (default: {','.join(GROUPS)})")
    parser.add_argument("--cpu-smoke", action="store_true", help="a tiny network on this CPU")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    only = tuple(g for g in args.only.split(",") if g)
    if not only or set(only) - set(GROUPS):
        parser.error(f"--only takes some of {', '.join(GROUPS)}")
    if args.site:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (args.site, os.environ.get("PYTHONPATH")) if p)
    if args.cpu_smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
        flags, glu, why, workers = [*SMOKE, "--glu", "xla"], "xla", "--cpu-smoke", min(args.workers, 2)
    else:
        os.environ.setdefault("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")  # AlphaFold 3's images
        glu, why = choose_glu(args.glu, args.python)
        flags, workers = ["--bucket", str(args.bucket), "--glu", glu], args.workers
    with tempfile.TemporaryDirectory(prefix="gpu-cache-af3-bench-") as scratch:
        work = Path(scratch)
        ptxas = _ptxas_wrapper(work)
        cases = run_cases(args.python, flags, workers, work, only)
    report = {"flags": flags, "glu": glu, "glu_why": why, "workers": workers,
              "ptxas_timed": ptxas is not None, "cases": cases}
    failed = [name for name, case in cases.items()
              if case.get("returncode", 0) or not case.get("all_ok", True)]
    report["failed"] = failed
    if not failed:
        report["summary"] = summary(cases)
        _print(report)
    else:
        print(f"failed: {failed}: {[cases[n].get('stderr_tail', '')[-600:] for n in failed]}")
    publish(report, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
