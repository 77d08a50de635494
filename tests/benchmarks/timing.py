"""What the benchmarks share: timing one fresh process, a table of rows, the report printed and kept."""

from __future__ import annotations

import json
import resource
import subprocess
import time
from pathlib import Path
from typing import Any


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


def table(rows: list[dict], head: tuple[str, ...], width: int = 14) -> str:
    """``rows`` as aligned text columns, the ``head`` fields of each."""
    lines = ["  ".join(f"{h:>{width}}" for h in head)]
    lines += ["  ".join(f"{row[h]!s:>{width}}" for h in head) for row in rows]
    return "\n".join(lines)


def publish(report: Any, out: Path | None) -> None:
    """Print ``report`` as JSON, and write it to ``out`` too when given."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
