"""Pruning: broken entries, then entries unused for too long, then least recently used
ones until each kind fits its size cap. Whole entries only, under a lock."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_cache import entries as entries_mod
from gpu_cache import jax_cache
from gpu_cache.errors import UsageError
from gpu_cache.fs import require_folder_or_missing
from gpu_cache.settings import Settings
from gpu_cache.units import format_size

LOCK_NAME = ".prune.lock"


@dataclass
class KindReport:
    """What pruning did (or, in a dry run, would do) to one cache kind."""

    entries_before: int = 0
    bytes_before: int = 0
    entries_removed: int = 0
    bytes_removed: int = 0
    bytes_after: int = 0
    dry_run: bool = False
    repaired: int = 0
    removed: list[dict[str, object]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def plan(entries: list[entries_mod.Entry], max_size: int, max_age: float, now: float
         ) -> list[tuple[entries_mod.Entry, str]]:
    """Which entries go and why, in removal order: broken, then too old, then LRU over the cap."""
    doomed: list[tuple[entries_mod.Entry, str]] = []
    kept = []
    for entry in entries:
        if entry.problem:
            doomed.append((entry, f"broken: {entry.problem}"))
        elif now - entry.last_use > max_age:
            doomed.append((entry, "unused longer than max_age"))
        else:
            kept.append(entry)
    total = sum(e.size for e in kept)
    for entry in sorted(kept, key=lambda e: (e.last_use, e.key)):
        if total <= max_size:
            break
        doomed.append((entry, "least recently used over max_size"))
        total -= entry.size
    return doomed


def prune_kind(kind: str, folder: Path, max_size: int, max_age: float, dry_run: bool,
               now: float | None = None, grace_seconds: float = 3600.0,
               verify_all: bool = False) -> KindReport:
    """Prune one kind's folder; the caller holds the prune lock. JAX entries written since
    the last prune (all of them with ``verify_all``) are decompressed to find broken ones."""
    now = time.time() if now is None else now
    started = time.time()
    verify_after = 0.0 if verify_all or kind != "jax" else jax_cache.verified_until(folder)
    found = entries_mod.scan(kind, folder, grace_seconds, verify_after)
    report = KindReport(entries_before=len(found), bytes_before=sum(e.size for e in found),
                        dry_run=dry_run)
    if kind == "jax" and not dry_run:
        for entry in found:
            if entry.source.needs_atime:
                try:
                    jax_cache.write_atime(folder, entry.source)
                    report.repaired += 1
                except OSError as exc:
                    report.errors.append(f"{entry.key}: cannot write its -atime: {exc.strerror or exc}")
    for entry, reason in plan(found, max_size, max_age, now):
        if not dry_run:
            try:
                entries_mod.remove(kind, folder, entry)
            except OSError as exc:
                report.errors.append(f"{entry.key}: {exc.strerror or exc}")
                continue
        report.entries_removed += 1
        report.bytes_removed += entry.size
        report.removed.append({"key": entry.key, "name": entry.name, "bytes": entry.size,
                               "last_use": entry.last_use, "reason": reason})
    report.bytes_after = report.bytes_before - report.bytes_removed
    if kind == "jax" and not dry_run and folder.is_dir() and not report.errors:
        try:
            # Younger entries were skipped (maybe mid-write): the next prune verifies them.
            jax_cache.mark_verified(folder, started - jax_cache.WRITE_GRACE_SECONDS)
        except OSError as exc:
            report.errors.append(f"cannot record the verification: {exc.strerror or exc}")
    return report


def repair(settings: Settings) -> dict[str, object]:
    """Remove broken entries only (empty, truncated, orphan halves, stale temporaries) and
    give lone ``-cache`` files of a capped cache their ``-atime``: ``doctor --fix``.

    Raises:
        UsageError: the root is a file or a broken link.
    """
    return prune(settings, max_size=sys.maxsize, max_age=float("inf"), dry_run=False,
                 verify_all=True)


def prune(settings: Settings, max_size: int, max_age: float, dry_run: bool,
          kinds: tuple[str, ...] = entries_mod.PRUNABLE_KINDS, lock_timeout: float = 600.0,
          verify_all: bool = False, strict_root: bool = True) -> dict[str, object]:
    """Prune every kind under the cache root and return the report (the prune.json content).

    Two prunes of one cache serialize on ``<root>/.prune.lock``. With caching off, a
    missing root, or a root that cannot be locked, nothing is touched and the report says
    why. ``verify_all``: decompress every JAX entry, not only those since the last prune.
    ``strict_root``: a root that is a file or a broken link raises; otherwise it is only
    reported (the workflow's prune must never fail a run because of the cache).

    Raises:
        UsageError: an unknown kind was asked for, or (``strict_root``) the root is a file
            or a broken link.
    """
    for kind in kinds:
        if kind not in entries_mod.PRUNABLE_KINDS:
            raise UsageError(f"cannot prune kind {kind!r}; prunable kinds: "
                             f"{', '.join(entries_mod.PRUNABLE_KINDS)}")
    result: dict[str, object] = {"cache_root": str(settings.cache_root), "dry_run": dry_run,
                                 "max_size": max_size, "max_age_seconds": max_age, "problems": []}
    empty = {kind: KindReport(dry_run=dry_run).as_dict() for kind in kinds}
    root = settings.cache_root
    if root is None:
        result["problems"] = ["caching is turned off; nothing to prune"]
        return result | empty
    try:
        require_folder_or_missing(root)
    except UsageError as exc:
        if strict_root:
            raise
        result["problems"] = [f"{exc}; nothing pruned"]
        return result | empty
    if not root.is_dir():
        result["problems"] = [f"cache root {root} does not exist; nothing to prune"]
        return result | empty
    import filelock

    lock = filelock.FileLock(str(root / LOCK_NAME), timeout=lock_timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        result["problems"] = [f"another prune held {root / LOCK_NAME} for {lock_timeout:.0f} s; skipped"]
        return result | empty
    except OSError as exc:
        # A read-only root cannot take the lock; a dry run can still report.
        if not dry_run:
            result["problems"] = [f"cannot lock {root / LOCK_NAME} ({exc.strerror}); nothing pruned"]
            return result | empty
        lock = None
    try:
        for kind in kinds:
            report = prune_kind(kind, root / kind, max_size, max_age, dry_run,
                                verify_all=verify_all)
            result[kind] = report.as_dict()
            verb = "would remove" if dry_run else "removed"
            print(f"gpu-cache prune: {kind}: {verb} {report.entries_removed} of "
                  f"{report.entries_before} entries, {format_size(report.bytes_removed)} of "
                  f"{format_size(report.bytes_before)}", file=sys.stderr)
            result["problems"] += [f"{kind}: cannot remove {e}" for e in report.errors]
    finally:
        if lock is not None:
            lock.release()
    return result
