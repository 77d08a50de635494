"""Per-process records written by the startup hook (``_hook/gpu_cache_hook/records.py``): how
they are read, and the fields every reader relies on.

A record is whatever a process left in the records folder, so every field is checked as it is
read: a value of the wrong type counts as absent. A leaf: it reads records for the kinds
(``core/kinds``), which say what their sections mean, and imports none of them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_cache.core import owners, safe_io
from gpu_cache.core.reports import Missed

#: A record larger than this is not one the hook wrote.
MAX_RECORD_BYTES = 16 << 20
#: Top-level fields that must be text (or absent) for a record to be read as one.
_TEXT_FIELDS = ("host", "rule", "wildcards", "gpu_type", "run_id", "slurm_job_id")
#: The record's own top-level fields beside those: any other is a kind's section, a mapping.
_OWN_FIELDS = ("version", "time", "pid", "argv", "env", "libraries", "device", "software", "fallbacks")


def read(folder: Path | None, run_id: str | None = None) -> Iterator[dict[str, Any]]:
    """Each record in ``folder`` (optionally of one run), cleaned by :func:`clean`; files
    that are not regular, too large or not JSON objects are skipped, and so is a file another
    user could have written (:func:`gpu_cache.core.owners.written_by_others`). No folder: none."""
    if folder is None:
        return
    try:
        team = owners.team_of(os.stat(folder))
        listing = list(os.scandir(folder))
    except OSError:
        return
    for item in listing:
        if not item.name.endswith(".json") or item.name.startswith("."):
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except OSError:
            continue
        if owners.written_by_others(info, team, where=item.path) is not None:
            continue  # another user's word on what your jobs compiled (the replay imports it)
        record = clean(_load(item.path, info))
        if record is not None and (run_id is None or record.get("run_id") == run_id):
            yield record


def _load(path: str, info: os.stat_result) -> Any:
    """The JSON in a regular file of at most :data:`MAX_RECORD_BYTES` (``info``: its
    ``lstat``; never blocking on a FIFO nor following a link); None otherwise."""
    try:
        return json.loads(safe_io.read_known(path, MAX_RECORD_BYTES, info))
    except (OSError, ValueError, RecursionError):  # gone, not regular, too large, not JSON
        return None


def clean(record: Any) -> dict[str, Any] | None:
    """``record`` with every field a reader relies on made safe: ``time`` a finite number,
    the text fields text or None, each kind's section a mapping or absent. None when it is
    not a JSON object at all."""
    if not isinstance(record, dict):
        return None
    record["time"] = seconds(record.get("time"))
    for name in _TEXT_FIELDS:
        if not isinstance(record.get(name), (str, type(None))):
            record[name] = None
    for name in [name for name in record if name not in _TEXT_FIELDS + _OWN_FIELDS]:
        if not isinstance(record[name], dict):
            del record[name]  # (a kind's section, by the name the hook writes it under)
    for name in ("env", "device"):
        if not isinstance(record.get(name), dict):
            record[name] = {}
    return record


def count(value: Any) -> int:
    """A non-negative whole count from a record's field; anything else is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        return 0
    return max(0, int(value))


def seconds(value: Any) -> float:
    """Non-negative seconds from a record's field; anything else is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        return 0.0
    return max(0.0, float(value))


def _finite(value: float) -> bool:
    """Whether a number is finite as a float: an integer of 400 digits is not (#21)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def part(record: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The record's section for one kind, when it has a valid one."""
    section = record.get(kind)
    return section if isinstance(section, dict) else None


def missed_of(section: dict[str, Any], kind: str) -> list[Missed]:
    """The missed computations a record's section names."""
    missed = section.get("missed")
    if not isinstance(missed, list):
        return []
    return [Missed(kind, str(m.get("name", "?")), str(m.get("key", "")))
            for m in missed if isinstance(m, dict)]


def runs(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorded runs (processes sharing a run id: a warm or validate pass), latest first:
    run id, when it ended, its rule and GPU type, and how many processes recorded."""
    by_id: dict[str, dict[str, Any]] = {}
    for record in found:
        run_id = record.get("run_id")
        if not run_id:
            continue
        run = by_id.setdefault(run_id, {"run_id": run_id, "time": 0.0, "rule": record.get("rule"),
                                         "gpu_type": record.get("gpu_type"), "processes": 0})
        run["time"] = max(run["time"], record["time"])
        run["processes"] += 1
    return sorted(by_id.values(), key=lambda run: -run["time"])
