"""Where a warm jax-triton process's lowering goes (issue 34): a profile, for the H200.

    python tests/benchmarks/jax_triton_profile.py [--shape 1024] [--out FILE]

Fills an empty root with the built-in ``jax-triton`` workload under ``gpu-cache env`` (ptxas
shim on where this tree has it), then runs it warm again under ``cProfile`` and prints the
functions with the most cumulative time (the lowering is where a warm process spends most of
its wall: ``tests/benchmarks/jax_triton_gpu.py``). Writes the top lines as text to ``--out``.
``--who-imports torch`` also prints the stack that first imports that module in the warm process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "benchmarks"))

import jax_triton_gpu  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--who-imports", default=None, help="print the stack that first imports this module")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpu-cache-profile-")) / "root"
    environ = jax_triton_gpu.job_environ(root, True if jax_triton_gpu._ptxas_kind() else None)
    workload = ["-m", "gpu_cache.workloads.jax_triton_kernels", "--shape", str(args.shape)]
    subprocess.run([sys.executable, *workload], env=environ, check=True, capture_output=True)
    if args.who_imports:
        probe = (f"import sys, traceback, runpy\n"
                 f"class Probe:\n"
                 f"    def find_spec(self, name, path=None, target=None):\n"
                 f"        if name == {args.who_imports!r}:\n"
                 f"            traceback.print_stack(limit=30)\n"
                 f"            sys.meta_path.remove(self)\n"
                 f"sys.meta_path.insert(0, Probe())\n"
                 f"sys.argv = ['jax-triton', '--shape', '{args.shape}']\n"
                 f"runpy.run_module('gpu_cache.workloads.jax_triton_kernels', run_name='__main__')\n")
        seen = subprocess.run([sys.executable, "-c", probe], env=environ, capture_output=True, text=True)
        print(f"who imports {args.who_imports}:\n{seen.stderr[-6000:]}")
    stats = root.parent / "warm.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), *workload], env=environ,
                          capture_output=True, text=True)
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:])
    import io
    import pstats

    text = io.StringIO()
    pstats.Stats(str(stats), stream=text).sort_stats("cumulative").print_stats(60)
    print(text.getvalue())
    if args.out:
        args.out.write_text(text.getvalue())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
