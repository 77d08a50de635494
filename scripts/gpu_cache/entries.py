"""Cache entries of every kind behind one shape, for pruning and statistics.

Each inventoried kind has a ``scan_<kind>`` and a ``remove_<kind>`` here; the registry in
:mod:`gpu_cache.kinds` says which kind uses which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_cache import jax_cache, triton_cache


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


def scan_jax(folder: Path, grace_seconds: float, verify_after: float | None) -> list[Entry]:
    """JAX entries; ``verify_after``: decompress those written after that time. Temporary
    files of an interrupted prune older than ``grace_seconds`` come as broken entries."""
    return [Entry("jax", e.key, e.name, e.size, e.last_use, e.problem, e)
            for e in jax_cache.scan(folder, verify_after, temp_grace=grace_seconds)]


def remove_jax(folder: Path, entry: Entry) -> None:
    """Remove a JAX entry: ``-cache`` first, then ``-atime``.

    Raises:
        OSError: a file could not be removed.
    """
    assert isinstance(entry.source, jax_cache.JaxEntry)
    jax_cache.remove(folder, entry.source)


def scan_triton(folder: Path, grace_seconds: float, verify_after: float | None = None) -> list[Entry]:
    """Triton key folders, stale writers' temporary folders, and trash left by a removal."""
    try:
        inventory = triton_cache.scan(folder)
    except triton_cache.TritonCacheError:
        return []  # not a folder: doctor and env report it
    now = inventory.scanned_at
    out = []
    for item in inventory.entries:
        problem = None
        if not item.complete or item.points_outside:
            # Triton writes the group manifest last: a young incomplete group may be mid-write.
            if now - item.mtime < grace_seconds:
                continue
            problem = "; ".join(item.problems) or "incomplete group"
        out.append(Entry("triton", item.key, item.kernel or item.kind, item.bytes, item.mtime,
                         problem, item))
    for temp in inventory.temp_dirs:
        if temp.age_seconds >= grace_seconds:
            out.append(Entry("triton", f"{temp.key}/{temp.path.name}", "(temporary)", temp.bytes,
                             now - temp.age_seconds, "stale temporary folder of a killed writer", temp))
    for other in inventory.others:
        if other.kind == "trash":
            out.append(Entry("triton", other.path.name, "(trash)", other.bytes, 0.0,
                             "left over from an interrupted removal", other))
        elif other.kind == "symlink":
            # Triton writes real folders only; a link would make it load (or write) elsewhere.
            out.append(Entry("triton", other.path.name, "(symbolic link)", 0, 0.0,
                             "a symbolic link in the cache folder (never followed; prune removes "
                             "the link itself)", other))
    return out


def remove_triton(folder: Path, entry: Entry) -> None:
    """Remove a Triton entry: a key folder is renamed into a trash folder (atomic on one
    filesystem) and then deleted, so a reader finds either the whole group or none of it.

    Raises:
        OSError: the entry could not be removed.
    """
    source = entry.source
    if isinstance(source, triton_cache.TritonEntry):
        triton_cache.remove_entry(folder, source.key)
    elif isinstance(source, triton_cache.TempDir):
        triton_cache.remove_temp_dir(source)
    elif isinstance(source, triton_cache.OtherPath) and source.kind == "symlink":
        if source.path.is_symlink():  # (a trash link is replaced by a folder on first use)
            try:
                source.path.unlink()  # the link itself, never what it points to
            except FileNotFoundError:
                pass
    else:
        triton_cache.empty_trash(folder)
