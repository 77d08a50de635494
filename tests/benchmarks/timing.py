"""What the benchmarks share: timing one fresh process."""

from __future__ import annotations

import resource
import subprocess
import time


def run(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system) of one process, and its stdout; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} failed: {done.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout
