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

from gpu_cache.core import names, safe_io, safe_locks
from gpu_cache.core.kinds import Kind

#: The largest list the startup hook reads (``gpu_cache_hook.tier.set_aside.LIMIT``).
LIST_LIMIT = 16 << 20
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
    half. Records are kept: a node whose tier has not run a job since still holds the copies.

    Raises:
        OSError: the list cannot be locked, read or written.
        ValueError: it is not a list gpu-cache wrote.
    """
    path = list_path(cache_root, kind)
    path.parent.mkdir(exist_ok=True)
    with safe_locks.exclusive_lock(path.with_name(f".{path.name}.lock"), timeout=LOCK_SECONDS):
        try:
            records = json.loads(safe_io.read_bounded(path, LIST_LIMIT))["records"]
        except FileNotFoundError:
            records = []
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a list of entries set aside ({exc})") from None
        if not isinstance(records, list):
            raise ValueError("not a list of entries set aside")
        records.append({"id": uuid.uuid4().hex, "keys": sorted(keys), "time": time.time(),
                        "host": socket.gethostname()})
        safe_io.replace_file(path, (json.dumps({"records": records}) + "\n").encode())
