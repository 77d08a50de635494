"""Benchmark: what `gpu-cache env` costs a job script, and what its parts cost.

    python tests/benchmarks/env_startup.py [--repeats 40] [--out FILE]

`eval "$(gpu-cache env)"` runs at the start of a job script; the profile and the workflow
call the same code inside Snakemake's process (which has loaded logging, yaml and jsonschema
already). This times, interleaved so that load drifts hit every case alike, median wall and
CPU seconds of fresh processes:

- ``python -c pass`` (the floor);
- ``gpu-cache env`` without a config (the built-in defaults: no yaml, no schema) and with the
  embedded config/config.yaml (read and checked against the schema);
- both again from a copy of the package without bytecode, with ``PYTHONDONTWRITEBYTECODE=1``
  (what images that set it, or read-only installs, pay);
- the parts: importing logging, building every subcommand's parser, importing yaml and
  jsonschema.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import run  # tests/benchmarks/timing.py

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config" / "config.yaml"


def cases(scripts: Path, bare: Path, root: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_CACHE_", "PYTHON"))}
    site = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []  # carried packages
    if site:
        base["PYTHONPATH"] = site[0]
    compiled = {**base, "PYTHONPATH": os.pathsep.join([str(scripts), *site])}
    plain = {**base, "PYTHONPATH": os.pathsep.join([str(bare), *site]), "PYTHONDONTWRITEBYTECODE": "1"}
    env = [sys.executable, "-m", "gpu_cache", "env", "--cache-root", str(root)]
    with_config = [*env, "--config", str(CONFIG)]
    python = [sys.executable, "-c"]
    return {
        "pass": ([*python, "pass"], base),
        "env": (env, compiled),
        "env --config": (with_config, compiled),
        "env, no bytecode": (env, plain),
        "env --config, no bytecode": (with_config, plain),
        "pass, no bytecode": ([*python, "pass"], {**base, "PYTHONDONTWRITEBYTECODE": "1"}),
        "import logging": ([*python, "import logging"], base),
        "import gpu_cache.cli": ([*python, "import gpu_cache.cli"], compiled),
        "build the env parser": ([*python, "import gpu_cache.cli as c; c.build_parser('env')"], compiled),
        "import yaml, jsonschema": ([*python, "import yaml, jsonschema"], base),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scripts, bare = Path(tmp) / "compiled", Path(tmp) / "bare"
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / "scripts", scripts, ignore=ignore)
        shutil.copytree(REPO / "scripts", bare, ignore=ignore)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(scripts)], check=True)
        table = cases(scripts, bare, Path(tmp) / "root")
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in table}
        for command, env in table.values():
            run(command, env)  # warm the page cache once
        for _ in range(args.repeats):
            for name, (command, env) in table.items():
                samples[name].append(run(command, env)[:2])
    medians = {name: {"wall_ms": round(1000 * statistics.median(w for w, _c in runs), 1),
                      "cpu_ms": round(1000 * statistics.median(c for _w, c in runs), 1)}
               for name, runs in samples.items()}
    floor = medians["pass"]["wall_ms"]
    for name, figures in medians.items():
        print(f"{name:28} {figures['wall_ms']:7.1f} ms wall ({figures['wall_ms'] - floor:+6.1f} over pass)"
              f" {figures['cpu_ms']:7.1f} ms CPU")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "benchmark": "env_startup", "repeats": args.repeats, "medians": medians,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                        "node": platform.node()}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
