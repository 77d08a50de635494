"""Peak host memory of one process of AlphaFold 3's real network per token bucket (issue 49): what a
warm or check job of the ``alphafold3`` workload needs for each run it makes at once, and the
figures behind ``gpu_cache.config.memory``.

    python tests/benchmarks/alphafold3_memory.py --python .ci-cache/py312-af3/bin/python --cpu \\
        --buckets 64,128,256 --out tests/benchmarks/results/cpu_alphafold3_memory.json
    python tests/benchmarks/alphafold3_memory.py --python .ci-cache/py312-af3/bin/python --cpu \\
        --buckets 128,256,512,768,1024 --stop-after compile \\
        --out tests/benchmarks/results/cpu_alphafold3_memory_compile.json

Each bucket is a fresh process of tests/benchmarks/alphafold3_run.py (ColabFold's wheel of AlphaFold 3's
model code, a poly-glycine chain filling the bucket, random parameters of the real shapes) on an
empty cache root under ``gpu-cache env``, as a warm run compiles it. Reported per bucket: the
process's peak resident memory (``ru_maxrss`` from ``wait4``) and its peak at the end of each phase
(``VmHWM``: import, parameters, featurise, trace, lower, compile, first and second call), wall
and CPU seconds. ``--stop-after compile`` ends each process after its compile: on a GPU that is
the host's part (the network's activations are on the device); on a CPU (``--cpu``: XLA attention
and GLU, ``JAX_PLATFORMS=cpu``) the calls' activations are host memory too. ``--reduced`` (1
recycle, 1 diffusion sample, 2 steps) keeps the CPU's calls short; on a GPU run the real network
(10 recycles, 5 samples, 200 steps, the defaults).

On the H200, with the carry of tests/benchmarks/alphafold3_gpu.py (``bash
tests/benchmarks/alphafold3_wheels.sh``, then ``run`` with ``carry: [".carry/af3"]``):

    pip install -q --no-index --no-deps --target /tmp/site .carry/af3/wheels/*.whl && \\
      cp .carry/af3/dictionary/* /tmp/site/alphafold3/constants/converters/ && \\
      cp -r .carry/af3/stub/xprof /tmp/site/ && \\
      python3 tests/benchmarks/alphafold3_memory.py --site /tmp/site \\
        --buckets 128,256,512,768,1024 --out $OUT/gpu_alphafold3_memory.json

(if the five buckets do not fit one call's 600 s, run ``--buckets 128,256,512`` and
``--buckets 768,1024`` in two calls: each bucket is a process of its own.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alphafold3_gpu import choose_glu
from jax_triton_gpu import job_environ, run_one
from timing import publish

DRIVER = Path(__file__).resolve().parent / "alphafold3_run.py"
#: The network's defaults are the jobs' (10 recycles, 5 samples, 200 steps); --reduced on a CPU.
REDUCED = ["--recycles", "1", "--samples", "1", "--steps", "2"]


def measure(python: str, bucket: int, flags: list[str], root: Path) -> dict[str, Any]:
    """One process of the network at ``bucket`` on an empty cache root under ``gpu-cache env``."""
    case = run_one([python, str(DRIVER), "--bucket", str(bucket), *flags], job_environ(root, None))
    result = case.get("result") or {}
    return {"bucket": bucket, "peak_rss_mb": case.get("peak_rss_mb"),
            "phase_peak_rss_mb": result.get("peak_rss_mb"), "wall_seconds": case["wall_seconds"],
            "cpu_seconds": case["cpu_seconds"], "returncode": case["returncode"],
            "device": result.get("device"), "stderr_tail": case.get("stderr_tail", "")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="a Python 3.12 with jax (CUDA on a GPU)")
    parser.add_argument("--site", help="a folder of the carried packages, put first on PYTHONPATH")
    parser.add_argument("--buckets", default="128,256,512,768,1024")
    parser.add_argument("--cpu", action="store_true", help="on this CPU: XLA attention and GLU")
    parser.add_argument("--reduced", action="store_true", help="1 recycle, 1 sample, 2 diffusion steps")
    parser.add_argument("--stop-after", default="second_call",
                        help="the last phase each process runs (compile: no call)")
    parser.add_argument("--glu", choices=("auto", "triton", "xla"), default="auto")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.site:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (args.site, os.environ.get("PYTHONPATH")) if p)
    flags = ["--stop-after", args.stop_after] + (REDUCED if args.reduced else [])
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
        glu, why = "xla", "--cpu"
        flags += ["--attention", "xla"]
    else:
        os.environ.setdefault("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")  # AlphaFold 3's images
        glu, why = choose_glu(args.glu, args.python)
    flags += ["--glu", glu]
    runs = []
    for bucket in (int(b) for b in args.buckets.split(",") if b):
        with tempfile.TemporaryDirectory(prefix="gpu-cache-af3-memory-") as scratch:
            runs.append(measure(args.python, bucket, flags, Path(scratch) / "root"))
        run = runs[-1]
        print(f"bucket {bucket:>5}: peak {run['peak_rss_mb']} MB, {run['wall_seconds']} s "
              f"(exit {run['returncode']}); by phase {run['phase_peak_rss_mb']}", flush=True)
    report = {"flags": flags, "glu": glu, "glu_why": why, "runs": runs,
              "failed": [run["bucket"] for run in runs if run["returncode"]]}
    publish(report, args.out)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
