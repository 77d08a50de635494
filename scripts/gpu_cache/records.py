"""Per-process records written by the startup hook (``_hook/sitecustomize.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator


def records_dir(cache_root: Path) -> Path:
    """Where the hook writes its records under a cache root."""
    return cache_root / "records"


def read(folder: Path, run_id: str | None = None) -> Iterator[dict[str, Any]]:
    """Each record in ``folder`` (optionally of one run); unreadable files are skipped."""
    try:
        listing = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return
    for item in listing:
        if not item.name.endswith(".json") or item.name.startswith("."):
            continue
        try:
            with open(item.path) as stream:
                record = json.load(stream)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and (run_id is None or record.get("run_id") == run_id):
            yield record


def totals(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Hits, misses and compile seconds per kind summed over records, with missed names."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ("jax", "triton"):
        seen = [r[kind] for r in records if isinstance(r.get(kind), dict)]
        out[kind] = {
            "processes": len(seen),
            "hits": sum(int(s.get("hits", 0)) for s in seen),
            "misses": sum(int(s.get("misses", 0)) for s in seen),
            "compile_seconds": round(sum(float(s.get("compile_seconds", 0.0)) for s in seen), 3),
            "saved_seconds": round(sum(float(s.get("saved_seconds", 0.0)) for s in seen), 3),
            "missed": [m for s in seen for m in s.get("missed", [])],
        }
    return out
