"""Benchmark: what starting the ptxas shim's Python costs each ptxas call, this checkout's hook
against the hook folder of another git revision, side by side in one run.

    python tests/benchmarks/shim_import.py --before REV [--repeats 40] [--out FILE]

Each ptxas call the shim fronts starts ``python -I -S`` and imports the shim module: with the
hook's pieces in one package (``gpu_cache_hook.kinds.ptxas.shim``) that is three package
``__init__`` files more than the flat layout's ``gpu_cache_ptxas``. This times, interleaved and
with every hook folder byte-compiled, that import for each folder and a bare ``python -I -S -c
pass``, and prints the medians and minimums in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hook_startup import REPO, hook_at

SHIM = Path("gpu_cache_hook") / "kinds" / "ptxas" / "shim.py"


def shim_import(folder: Path) -> list[str]:
    """The shim's Python start in ``folder``, as its front script runs it."""
    packaged = (folder / SHIM).is_file()
    module = "from gpu_cache_hook.kinds.ptxas import shim" if packaged else "import gpu_cache_ptxas"
    return [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(folder)!r}); {module}"]


def measure(before: str, repeats: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="gpu-cache-shim-import-") as scratch:
        work = Path(scratch)
        folders = {"this": REPO / "scripts" / "gpu_cache" / "_hook", "before": hook_at(before, work)}
        for folder in folders.values():
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder)], check=True)
        commands = {name: shim_import(folder) for name, folder in folders.items()}
        commands["bare"] = [sys.executable, "-I", "-S", "-c", "pass"]
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(repeats):
            for name, command in commands.items():
                started = time.perf_counter()
                subprocess.run(command, check=True)
                samples[name].append((time.perf_counter() - started) * 1000)
    return {name: {"median_ms": round(statistics.median(values), 2), "min_ms": round(min(values), 2)}
            for name, values in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REV", required=True, help="the git revision to compare with")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    args = parser.parse_args()
    figures = measure(args.before, args.repeats)
    report = {"before": args.before, "repeats": args.repeats, "figures": figures}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
