"""Set cache entries aside: what validation does with the entries a process was served when
its outputs differ from a fresh compile's (issue 40), so that the next job compiles them again.

This is the one place that does it, through each kind's own removal of a whole entry
(:meth:`gpu_cache.core.kinds.Kind.remove`, as prune removes one).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpu_cache.core.kinds import Kind


def set_aside(cache_root: Path, kind: Kind, keys: Iterable[str]) -> tuple[list[str], list[str]]:
    """Set aside the entries of ``kind`` under ``cache_root`` that ``keys`` name, as the
    startup hook's records name what a process hit (an entry's key, or the last part of it:
    Inductor keeps a graph's key below ``fxgraph/<shard>/``). Returns the keys of the entries
    set aside, and a line for each that could not be."""
    wanted = set(keys)
    folder = kind.folder(cache_root)
    done: list[str] = []
    failed: list[str] = []
    try:
        found = kind.scan(folder, grace_seconds=0.0)
    except (OSError, ValueError) as exc:
        return [], [f"{kind.name}: cannot list {folder}: {exc}"]
    for entry in found:
        if entry.key not in wanted and entry.key.rsplit("/", 1)[-1] not in wanted:
            continue
        try:
            kind.remove(folder, entry)
        except (OSError, ValueError) as exc:
            failed.append(f"{kind.name}: cannot set {entry.key} aside: {exc}")
            continue
        done.append(entry.key)
    return sorted(done), failed
