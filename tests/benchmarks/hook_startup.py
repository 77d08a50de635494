"""Benchmark: what the startup hook costs a process, with and without bytecode.

    python tests/benchmarks/hook_startup.py [--repeats 60] [--jax-repeats 20] [--out FILE]

Every Python process of a job with gpu-cache's environment loads the hook's
``sitecustomize``; a process that imports jax loads the hook's JAX piece too and writes a
record at exit. Where bytecode is cached (pip compiles it at install), loading costs little;
where it is not (``PYTHONDONTWRITEBYTECODE=1``, which many images set, or a read-only
install) the source is compiled in every process. This times, interleaved:

- ``python -c pass`` and a process that imports jax and runs one jit, without the hook;
- the same with the hook (records on, as the profile exports it), from a copy of the hook
  folder with its bytecode compiled, and from a copy without bytecode run with
  ``PYTHONDONTWRITEBYTECODE=1`` (the baseline then runs with it too);
- for ``python -c pass``, the same for the hook as one file, before it was split
  (``tests/fixtures/hook-before-split``);
- with ``--before REV``, the same (both programs) for the hook folder as it was at git revision
  ``REV`` of this checkout (``before_*``), side by side with this checkout's (``split_*``).

Also, for ``python -c pass``, what ``python -X importtime`` says the ``sitecustomize`` import
itself took (measured inside the process: less moved by other load on the machine than wall
time). Prints medians and writes the samples, medians and differences to the baseline as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HOOKS = {"split": REPO / "scripts" / "gpu_cache" / "_hook",
         "whole": REPO / "tests" / "fixtures" / "hook-before-split"}
PROGRAMS = {"pass": "pass",
            "jax": "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2)(jnp.ones(3)).block_until_ready()"}


def base_environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_CACHE_", "JAX_", "TRITON_", "PYTHON"))}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def run(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one process; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or done.stderr:
        raise RuntimeError(f"{' '.join(command[:4])} failed or warned: {done.stderr[-800:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def sitecustomize_us(env: dict[str, str]) -> int:
    """Microseconds ``python -X importtime`` gives the import of sitecustomize (cumulative)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env,
                          capture_output=True, text=True, check=True)
    fields = next(f for f in (line.split("|") for line in done.stderr.splitlines())
                  if len(f) == 3 and f[2].strip() == "sitecustomize")
    return int(fields[1])


def hook_at(revision: str, work: Path) -> Path:
    """The hook folder as it was at ``revision`` of this checkout, extracted into ``work``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "scripts/gpu_cache/_hook"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    return work / "scripts" / "gpu_cache" / "_hook"


def cases(work: Path, hooks: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Environment of each case: ``<hook>_<bytecode>`` and the two baselines."""
    out = {"none_bytecode": base_environ(),
           "none_no_bytecode": base_environ() | {"PYTHONDONTWRITEBYTECODE": "1"}}
    for name, source in hooks.items():
        for bytecode in ("bytecode", "no_bytecode"):
            folder = work / f"{name}-{bytecode}"
            shutil.copytree(source, folder, ignore=shutil.ignore_patterns("__pycache__"))
            env = base_environ() | {"PYTHONPATH": str(folder),
                                    "GPU_CACHE_RECORDS": str(work / "records")}
            if bytecode == "bytecode":
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder)], check=True)
            else:
                env["PYTHONDONTWRITEBYTECODE"] = "1"
            out[f"{name}_{bytecode}"] = env
    return out


def measure(repeats: dict[str, int], before: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpu-cache-hook-startup-") as scratch:
        hooks = dict(HOOKS)
        if before:
            (Path(scratch) / "before").mkdir()
            hooks["before"] = hook_at(before, Path(scratch) / "before")
        envs = cases(Path(scratch), hooks)
        samples: dict[str, dict[str, list[tuple[float, float]]]] = {program: {} for program in PROGRAMS}
        for program, code in PROGRAMS.items():
            if not repeats[program]:
                continue
            mine = {case: env for case, env in envs.items()
                    if program == "pass" or not case.startswith("whole")}
            for env in mine.values():  # once unmeasured: the page cache warm
                run([sys.executable, "-c", code], env)
            for _ in range(repeats[program]):
                for case, env in mine.items():
                    samples[program].setdefault(case, []).append(run([sys.executable, "-c", code], env))
        imports = {case: [sitecustomize_us(env) for _ in range(repeats["pass"])]
                   for case, env in envs.items() if not case.startswith("none")}
        records = len(list((Path(scratch) / "records").glob("*.json")))
    result: dict[str, Any] = {"records_written": records, "sitecustomize_import_us": {
        case: {"median": statistics.median(v), "min": min(v)} for case, v in imports.items()}}
    for program, by_case in samples.items():
        if not by_case:
            continue
        median = {case: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
                  for case, v in by_case.items()}
        over = {}
        for case in by_case:
            hook, _, bytecode = case.partition("_")
            if hook != "none":
                base = median[f"none_{bytecode}"]
                over[case] = {"wall_ms": round(1000 * (median[case][0] - base[0]), 2),
                              "cpu_ms": round(1000 * (median[case][1] - base[1]), 2)}
        result[program] = {
            "repeats": repeats[program],
            "median_ms": {case: {"wall": round(1000 * w, 2), "cpu": round(1000 * c, 2)}
                          for case, (w, c) in median.items()},
            "hook_over_baseline_ms": over,
            "samples_ms": {case: [[round(1000 * w, 2), round(1000 * c, 2)] for w, c in v]
                           for case, v in by_case.items()},
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60, help="runs of each `pass` case")
    parser.add_argument("--jax-repeats", type=int, default=20, help="runs of each jax case")
    parser.add_argument("--before", metavar="REV", help="also time the hook folder of this git revision")
    parser.add_argument("--out", type=Path,
                        default=REPO / "tests" / "benchmarks" / "results" / "hook_startup.json")
    args = parser.parse_args()
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(), "load_average_at_start": os.getloadavg(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "before": args.before,
        **measure({"pass": args.repeats, "jax": args.jax_repeats}, args.before),
        "load_average_at_end": os.getloadavg(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("sitecustomize import (us)", json.dumps(result["sitecustomize_import_us"]))
    for program in (p for p in PROGRAMS if p in result):
        print(program, json.dumps(result[program]["median_ms"]))
        print(program, "hook over baseline", json.dumps(result[program]["hook_over_baseline_ms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
