"""Cache entries of every kind behind one shape, for pruning and statistics."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_cache import jax_cache, triton_cache

#: Kinds whose entries gpu-cache can list and prune.
PRUNABLE_KINDS = ("jax", "triton")


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
    return out


def scan(kind: str, folder: Path, grace_seconds: float = 3600.0,
         verify_after: float | None = None) -> list[Entry]:
    """Every entry of ``kind`` in ``folder``; temporary files younger than the grace period
    are left out, since a writer may still own them. ``verify_after``: decompress the JAX
    entries written after that time to find truncated ones."""
    if kind == "jax":
        return [Entry("jax", e.key, e.name, e.size, e.last_use, e.problem, e)
                for e in jax_cache.scan(folder, verify_after)]
    if kind == "triton":
        return _triton_scan(folder, grace_seconds)
    raise ValueError(f"kind {kind!r} has no entry scanner")


def remove(kind: str, folder: Path, entry: Entry) -> None:
    """Remove one whole entry so that no reader ever sees part of it.

    Triton entries are renamed into a trash folder (atomic on one filesystem) and then
    deleted, so a reader finds either the whole group or none of it.

    Raises:
        OSError: the entry could not be removed.
    """
    if kind == "jax":
        assert isinstance(entry.source, jax_cache.JaxEntry)
        jax_cache.remove(folder, entry.source)
        return
    source = entry.source
    if isinstance(source, triton_cache.TritonEntry):
        triton_cache.remove_entry(folder, source.key)
    elif isinstance(source, triton_cache.TempDir):
        triton_cache.remove_temp_dir(source)
    else:
        triton_cache.empty_trash(folder)


def snapshot(cache_root: Path | None) -> dict[str, set[str]]:
    """The keys present per prunable kind (temporary folders included), to diff before/after."""
    if cache_root is None:
        return {kind: set() for kind in PRUNABLE_KINDS}
    return {kind: {e.key for e in scan(kind, cache_root / kind, grace_seconds=0.0)}
            for kind in PRUNABLE_KINDS}
