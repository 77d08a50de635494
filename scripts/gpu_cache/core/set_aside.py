"""Set cache entries aside: what validation does with the entries a process was served when
its outputs differ from a fresh compile's (issue 40), so that the next job compiles them again.

This is the one place that does it, through each kind's own removal of a whole entry
(:meth:`gpu_cache.core.kinds.Kind.remove`, as prune removes one). For a kind that works in the
node-local tier, the keys are also added to the root's list ``state/set-aside-<kind>.json``: the
node-local tier of every node drops its copies of them before it serves that kind again
(``_hook/gpu_cache_hook/tier/set_aside.py``), and validation usually runs where none of those copies is
(the workflow judges on the host).
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpu_cache.core import names, safe_io, safe_locks, state_files
from gpu_cache.core.kinds import Kind

#: The largest list the startup hook reads (``gpu_cache_hook.tier.set_aside.LIMIT``).
LIST_LIMIT = 16 << 20
#: The size a list is kept within (:func:`trimmed`): half of what the hook reads.
LIST_BOUND = LIST_LIMIT // 2
#: How long a validation waits for another one that adds to the lists.
LOCK_SECONDS = 60.0


def set_aside(cache_root: Path, kind: Kind, keys: Iterable[str]) -> tuple[list[str], list[str]]:
    """Set aside the entries of ``kind`` under ``cache_root`` that ``keys`` name, as the
    startup hook's records name what a process hit (an entry's key, or the last part of it:
    Inductor keeps a graph's key below ``fxgraph/<shard>/``), and tell the node-local tiers.
    Returns the keys of the entries set aside in the root, and a line for each that could not
    be."""
    wanted = set(keys)
    folder = kind.folder(cache_root)
    done: list[str] = []
    failed: list[str] = []
    try:
        found = kind.scan(folder, grace_seconds=0.0)
    except (OSError, ValueError) as exc:
        found, failed = [], [f"{kind.name}: cannot list {folder}: {exc}"]
    for entry in found:
        if entry.key not in wanted and entry.key.rsplit("/", 1)[-1] not in wanted:
            continue
        try:
            kind.remove(folder, entry)
        except (OSError, ValueError) as exc:
            failed.append(f"{kind.name}: cannot set {entry.key} aside: {exc}")
            continue
        done.append(entry.key)
    if kind.tiered and wanted:  # after the root's copies are gone: none is fetched again
        try:
            tell_tiers(cache_root, kind.name, wanted)
        except (OSError, ValueError) as exc:
            failed.append(f"{kind.name}: cannot tell the node-local tiers to drop their copies "
                          f"({list_path(cache_root, kind.name)}): {exc}")
    return sorted(done), failed


def list_path(cache_root: Path, kind: str) -> Path:
    """The root's list of the entries of ``kind`` set aside, which the node-local tiers read."""
    return cache_root / names.STATE_FOLDER / f"{names.SET_ASIDE_PREFIX}{kind}.json"


def tell_tiers(cache_root: Path, kind: str, keys: Iterable[str]) -> None:
    """Add a record of ``keys`` (with an id of its own, which each node's tier marks applied)
    to the list of ``kind``, replaced whole under a lock: a node reads it old or new, never
    half. The list is kept within :data:`LIST_BOUND` (:func:`trimmed`) without losing a key a
    node has not applied yet, but in the oldest records of a list that outgrew it.

    Raises:
        OSError: the list cannot be locked, read or written (state_files.Untrusted: the state
            folder is another account's).
        ValueError: it is not a list gpu-cache wrote.
    """
    path = list_path(cache_root, kind)
    state_files.make(cache_root)
    with safe_locks.exclusive_lock(path.with_name(f".{path.name}.lock"), timeout=LOCK_SECONDS):
        try:
            records = kept_records(json.loads(state_files.read(path, cache_root, LIST_LIMIT)))
        except (FileNotFoundError, state_files.Untrusted):
            records = []  # none yet, or one no node acts on (the hook's trust rule): ours replaces it
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a list of entries set aside ({exc})") from None
        records.append({"id": uuid.uuid4().hex, "keys": sorted(set(keys)), "time": time.time(),
                        "host": socket.gethostname()})
        safe_io.replace_file(path, (json.dumps({"records": trimmed(records)}) + "\n").encode())


def kept_records(found: object) -> list[dict[str, Any]]:
    """The records of a list as read (each an ``id`` and its ``keys``, text).

    Raises:
        ValueError: it is not a list gpu-cache wrote.
    """
    records = found.get("records") if isinstance(found, dict) else None
    if not isinstance(records, list):
        raise ValueError("not a list of entries set aside")
    return [{**r, "keys": [k for k in r["keys"] if isinstance(k, str)]} for r in records
            if isinstance(r, dict) and isinstance(r.get("id"), str) and isinstance(r.get("keys"), list)]


def trimmed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` (oldest first) within :data:`LIST_BOUND`. A key set aside again later leaves
    the earlier records: every node that has not applied an earlier record has not applied the
    later one either, and drops it then. Records left empty go. A list still over the bound
    (about 100,000 distinct keys) loses its oldest records: only a node that ran no job while
    that many other entries were set aside keeps its copies of those."""
    seen: set[str] = set()
    kept = []
    for record in reversed(records):
        keys = [key for key in record["keys"] if key not in seen]
        seen.update(keys)
        if keys:
            kept.append({**record, "keys": keys})
    kept.reverse()
    size = len(json.dumps({"records": kept}))
    while size > LIST_BOUND and len(kept) > 1:
        size -= len(json.dumps(kept.pop(0))) + 2
    return kept
