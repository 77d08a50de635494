"""Cache entries of every kind behind one shape, for pruning and statistics."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpu_cache import jax_cache

#: Kinds whose entries gpu-cache can list and prune.
PRUNABLE_KINDS = ("jax", "triton")
#: Prefix of Triton's own temporary folders (``tmp.pid_<pid>_<uuid>``), left by killed writers.
TRITON_TMP_PREFIX = "tmp."
#: Where a removed Triton entry is renamed before it is deleted; never a Triton key.
TRASH_PREFIX = ".gpu-cache-trash-"


@dataclass
class Entry:
    """One whole cache entry. ``problem`` is set for a broken one (pruning removes it)."""

    kind: str
    key: str
    name: str
    size: int
    last_use: float
    problem: str | None
    source: object  # the kind's own record of the entry, for removal


def _triton_scan(folder: Path, grace_seconds: float) -> list[Entry]:
    entries = []
    try:
        listing = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    now = time.time()
    for item in listing:
        if not item.is_dir(follow_symlinks=False):
            continue
        size, last_use, groups = 0, 0.0, []
        try:
            last_use = item.stat(follow_symlinks=False).st_mtime
            for child in os.scandir(item.path):
                info = child.stat(follow_symlinks=False)
                size += info.st_size
                last_use = max(last_use, info.st_mtime)
                if child.name.startswith("__grp__") and child.name.endswith(".json"):
                    groups.append(child.name[len("__grp__"):-len(".json")])
        except OSError:
            continue
        problem = None
        if item.name.startswith(TRASH_PREFIX):
            problem = "left over from an interrupted removal"
        elif item.name.startswith(TRITON_TMP_PREFIX):
            if now - last_use < grace_seconds:
                continue  # a writer may still be at work
            problem = "stale temporary folder of a killed writer"
        name = groups[0] if groups else "(no manifest)"
        entries.append(Entry("triton", item.name, name, size, last_use, problem, Path(item.path)))
    return entries


def scan(kind: str, folder: Path, grace_seconds: float = 3600.0) -> list[Entry]:
    """Every entry of ``kind`` in ``folder``; temporary files younger than the grace period
    are left out, since a writer may still own them."""
    if kind == "jax":
        return [Entry("jax", e.key, e.name, e.size, e.last_use, e.problem, e)
                for e in jax_cache.scan(folder)]
    if kind == "triton":
        return _triton_scan(folder, grace_seconds)
    raise ValueError(f"kind {kind!r} has no entry scanner")


def remove(kind: str, folder: Path, entry: Entry) -> None:
    """Remove one whole entry so that no reader ever sees part of it.

    Triton entries are renamed out of the way (atomic on one filesystem) and then deleted,
    so a reader finds either the whole group or none of it.

    Raises:
        OSError: the entry could not be removed.
    """
    if kind == "jax":
        assert isinstance(entry.source, jax_cache.JaxEntry)
        jax_cache.remove(folder, entry.source)
        return
    path = Path(str(entry.source))
    if not path.name.startswith(TRASH_PREFIX):
        trash = folder / f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        path = trash
    shutil.rmtree(path, ignore_errors=False)


def snapshot(cache_root: Path | None) -> dict[str, set[str]]:
    """The keys present per prunable kind (temporary folders included), to diff before/after."""
    if cache_root is None:
        return {kind: set() for kind in PRUNABLE_KINDS}
    return {kind: {e.key for e in scan(kind, cache_root / kind, grace_seconds=0.0)}
            for kind in PRUNABLE_KINDS}
