"""Pruning: broken entries, then entries unused for too long, then least recently used
ones until each kind fits its size cap. Whole entries only, under a lock. Then the outputs
proof's references no validation needs (issue 40), and this node's local tier (issue 23), to
its own bound."""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
import time
from contextlib import ExitStack
from operator import attrgetter
from pathlib import Path

from gpu_cache.commands import common
from gpu_cache.config.settings import Settings
from gpu_cache.config.units import format_size, parse_age, parse_size
from gpu_cache.core import (
    kinds,
    names,
    owners,
    references,
    runner,
    safe_io,
    safe_locks,
    state_files,
    verified,
)
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import Entry, Kind, integrity
from gpu_cache.core.shown import shown_lines
from gpu_cache.jobenv.fs import require_folder_or_missing
from gpu_cache.reports import KindPruneReport, PruneReport

log = logging.getLogger(__name__)

LOCK_NAME = ".prune.lock"
#: A last use further ahead of the clock than this (a clock that was wrong, a file dated ahead
#: by hand) says nothing: the entry counts as the least recently used.
FUTURE_SLACK = 86400.0


def plan(entries: list[Entry], max_size: int, max_age: float, now: float
         ) -> list[tuple[Entry, str]]:
    """Which entries go and why, in removal order: broken, then too old, then LRU over the cap.
    Entries that are not ``removable`` are never planned (nor counted against the cap); one
    dated far in the future is the oldest (it would otherwise stay for ever)."""
    broken: list[tuple[Entry, str]] = []
    old: list[tuple[Entry, str]] = []
    kept = []
    for entry in entries:
        if not entry.removable:
            continue
        if entry.problem:
            broken.append((entry, f"broken: {entry.problem}"))
        elif entry.last_use > now + FUTURE_SLACK:
            entry.last_use = 0.0
            old.append((entry, "its last use is dated ahead of the clock: counted as the oldest"))
        elif now - entry.last_use > max_age:
            old.append((entry, "unused longer than max_age"))
        else:
            kept.append(entry)
    doomed = broken + old
    total = sum(e.size for e in kept)
    if total <= max_size:
        return doomed  # (no need to sort a million entries)
    for entry in sorted(kept, key=attrgetter("last_use", "key")):
        if total <= max_size:
            break
        doomed.append((entry, "least recently used over max_size"))
        total -= entry.size
    return doomed


def prune_kind(kind: Kind, folder: Path, max_size: int, max_age: float, dry_run: bool,
               now: float | None = None, grace_seconds: float = 3600.0,
               verify_all: bool = False) -> KindPruneReport:
    """Prune one kind's folder; the caller holds the prune lock. Entries not verified before
    (all of them with ``verify_all``) are verified to find broken ones, by the kind's own
    check (JAX entries are decompressed, Inductor's kernel libraries checked). What was
    verified is recorded beside the entries (:mod:`gpu_cache.core.verified`; by a dry run too:
    that changes nothing that a cache reads), so the next prune or dry run checks nothing it
    verified already; it only reads some entries again, in turn, for damage that keeps their
    size."""
    now = time.time() if now is None else now
    found, report, record = _survey(kind, folder, dry_run, grace_seconds, verify_all)
    _remove(plan(found, max_size, max_age, now), {kind: folder}, {kind.name: report}, dry_run,
            {kind: record})
    return report


def _survey(kind: Kind, folder: Path, dry_run: bool, grace_seconds: float,
            verify_all: bool) -> tuple[list[Entry], KindPruneReport, verified.Record | None]:
    """Scan (and verify) one kind's folder, and repair what needs no removal
    (:meth:`Kind.repair`) unless ``dry_run``: its entries, its report so far and its
    verification record (saved now: a removal drops seals and saves it again)."""
    record = verified.Record.load(folder, recheck_all=verify_all) if kind.verifies else None
    found = kind.scan(folder, grace_seconds, 0.0, record)
    if record is not None:
        record.save()
    report = KindPruneReport(entries_before=len(found), bytes_before=sum(e.size for e in found),
                             dry_run=dry_run)
    report.bytes_after = report.bytes_before
    if not dry_run:
        report.repaired, report.errors = kind.repair(folder, found)
    return found, report, record


def _remove(doomed: list[tuple[Entry, str]], folders: dict[Kind, Path],
            reports: dict[str, KindPruneReport], dry_run: bool,
            records: dict[Kind, verified.Record | None]) -> None:
    """Remove the planned entries (each from its kind's folder; none in a dry run) and count
    them in their kind's report. The seals of what is removed leave its kind's record: where
    the filesystem keeps no inode generation, a later file given an inode of theirs had the
    path, inode and size of a DAMAGED seal (integrity.forget)."""
    for entry, reason in doomed:
        report = reports[entry.kind.name]
        if not dry_run:
            record = records.get(entry.kind)
            if record is not None:
                integrity.forget(record, folders[entry.kind], entry.kind.files(entry))
            try:
                entry.kind.remove(folders[entry.kind], entry)
            except OSError as exc:
                report.errors.append(f"{entry.key}: {exc.strerror or exc}")
                continue
        report.count_removed(entry.key, entry.name, entry.size, entry.last_use, reason)
    for record in records.values() if not dry_run else ():
        if record is not None:
            record.save()


def prune_tier(settings: Settings, max_age: float, dry_run: bool, result: PruneReport,
               only: tuple[Kind, ...] = kinds.TIERED, lock_timeout: float = 600.0,
               verify_all: bool = False, max_size: int | None = None) -> None:
    """Prune this node's local tier of the cache root (issue 23) into ``result``: its tiered
    kinds together to ``max_size`` (default ``local_tier.max_size``; least recently used whole
    entries first, promoted or not: the root keeps what was promoted), entries unused longer
    than ``max_age``, broken ones and stale temporaries. A tier that does not exist on this node
    is left alone; one that is not trusted is not touched (the problem says why)."""
    from gpu_cache.jobenv import tier

    wanted = [kind for kind in only if kind.tiered]
    here = tier.on_this_node(settings) if wanted else None
    if here is None:
        return
    local = here.folder
    max_size = settings.local_tier.max_size if max_size is None else max_size
    result.tier_folder, result.tier_max_size = str(local), max_size
    if here.problem:
        result.problems.append(f"local tier: {here.problem}; not pruned")
        return
    with ExitStack() as held:
        try:
            held.enter_context(safe_locks.exclusive_lock(local / LOCK_NAME, timeout=lock_timeout,
                                                      replace=not dry_run))
        except safe_locks.LockTimeout:
            result.problems.append(f"local tier: another prune held {local / LOCK_NAME} for "
                                   f"{lock_timeout:.0f} s; skipped")
            return
        except OSError as exc:
            if not dry_run:
                result.problems.append(f"local tier: cannot lock {local / LOCK_NAME} "
                                       f"({exc.strerror or exc}); nothing pruned there")
                return
        folders: dict[Kind, Path] = {}
        records: dict[Kind, verified.Record | None] = {}
        found: list[Entry] = []
        for kind in wanted:
            try:
                folders[kind] = safe_io.within(kind.folder(local), local)
                entries, result.tier[kind.name], records[kind] = _survey(kind, folders[kind], dry_run, 3600.0,
                                                                         verify_all)
            except safe_io.Outside as exc:
                result.problems.append(f"local tier: {kind.name}: {exc.filename} is a link to {exc.real}, "
                                       "outside the tier; not pruned")
                continue
            except OSError as exc:
                result.problems.append(f"local tier: {kind.name}: cannot prune {exc.filename or ''}: "
                                       f"{exc.strerror or exc}")
                continue
            found += entries
        _remove(plan(found, max_size, max_age, time.time()), folders, result.tier, dry_run, records)
    for kind, report in result.tier.items():
        log.info("prune: local tier %s: %s %d of %d entries, %s of %s", kind,
                 "would remove" if dry_run else "removed", report.entries_removed,
                 report.entries_before, format_size(report.bytes_removed),
                 format_size(report.bytes_before))
        result.problems += [f"local tier: {kind}: cannot remove {e}" for e in report.errors]


def prune_references(root: Path, max_age: float, dry_run: bool, now: float | None = None,
                     grace_seconds: float = 3600.0, max_size: int = sys.maxsize) -> KindPruneReport:
    """Prune the outputs proof's references (``state/outputs-*``, docs/outputs.md); the caller
    holds the prune lock. One used within ``grace_seconds`` (a pass may be keeping or comparing
    with it now) is kept whatever its age, and so is the one last used of each GPU type while
    they fit ``max_size`` (a kind's bound: up to 3 x 256 MiB a shape were never counted); the
    others go when they hold no reference gpu-cache may read (an older gpu-cache's cold outputs
    alone, or another account's), when a later one of the same GPU type, workloads and shapes
    has other inputs (other software or device), or when unused longer than ``max_age``; then
    the least recently used while they hold more than ``max_size``."""
    now = time.time() if now is None else now
    state = root / names.STATE_FOLDER
    found = references.listed(root)
    report = KindPruneReport(entries_before=len(found), bytes_before=sum(r.size for r in found),
                             dry_run=dry_run)
    report.bytes_after = report.bytes_before
    for ref, reason in _references_doomed(found, max_age, now, grace_seconds, max_size):
        if not dry_run:
            try:
                with safe_io.open_dir(state) as fd:
                    away = safe_io.temp_name(ref.name)
                    os.rename(ref.name, away, src_dir_fd=fd, dst_dir_fd=fd)  # whole or not at all
                    safe_io.delete_in(fd, away)
            except OSError as exc:
                report.errors.append(f"{ref.name}: {exc.strerror or exc}")
                continue
        report.count_removed(ref.name, ref.inputs[0] if ref.inputs else "-", ref.size, ref.last_use, reason)
    return report


def _references_doomed(found: list[references.Reference], max_age: float, now: float, grace_seconds: float,
                       max_size: int) -> list[tuple[references.Reference, str]]:
    """Which references :func:`prune_references` removes and why, in removal order."""
    by_type: dict[str, references.Reference] = {}  # the one last used of each GPU type
    by_runs: dict[tuple[str, tuple[tuple[str, str], ...]], references.Reference] = {}  # ... and its runs
    for ref in sorted(found, key=attrgetter("last_use")):
        if ref.inputs is not None:
            by_type[ref.inputs[0]] = by_runs[ref.inputs] = ref
    doomed, kept = [], []
    for ref in found:
        if now - ref.last_use < grace_seconds or (ref.inputs is not None and by_type[ref.inputs[0]] is ref):
            kept.append(ref)
        elif ref.inputs is None:
            doomed.append((ref, "it holds no reference gpu-cache may read (an older gpu-cache's, or "
                                "another account's)"))
        elif by_runs[ref.inputs].fingerprint != ref.fingerprint:
            doomed.append((ref, f"superseded: {ref.inputs[0]}'s workloads and shapes were warmed since "
                                "with other software or another device"))
        elif now - ref.last_use > max_age:
            doomed.append((ref, "unused longer than max_age"))
        else:
            kept.append(ref)
    total = sum(ref.size for ref in kept)
    for ref in sorted(kept, key=attrgetter("last_use", "name")):
        if total <= max_size:
            break
        if now - ref.last_use >= grace_seconds:  # (one in use now stays)
            doomed.append((ref, "least recently used over max_size"))
            total -= ref.size
    return doomed


def prune_markers(root: Path, max_age: float, dry_run: bool, now: float | None = None,
                  grace_seconds: float = 3600.0) -> KindPruneReport:
    """Prune the markers of passed validations (``state/passed-*.json``, ``state/plan-*.json``:
    what the next warm step of the same inputs checks before it only re-checks; 100,000 of them
    were never pruned); the caller holds the prune lock. One written within ``grace_seconds`` of
    now stays; one unused longer than ``max_age`` (a passed validation writes its own anew),
    dated more than a day ahead of the clock, or that gpu-cache would not read (not a file, or
    one another account may have written) goes."""
    now = time.time() if now is None else now
    prefixes = tuple(f"{what}-" for what in (runner.PASSED, runner.PLANNED))
    team = state_files.team(root)
    found = [(name, path, info) for name, path, info in safe_io.listing(state_files.folder(root))
             if name.startswith(prefixes) and name.endswith(".json")]
    report = KindPruneReport(entries_before=len(found), bytes_before=sum(i.st_size for _n, _p, i in found),
                             dry_run=dry_run)
    report.bytes_after = report.bytes_before
    for name, path, info in found:
        age = now - info.st_mtime
        if not stat.S_ISREG(info.st_mode) or owners.written_by_others(info, team, where=path) is not None:
            reason = "gpu-cache would not read it (not a file of its own)"
        elif age > max_age:
            reason = "unused longer than max_age (a passed validation writes it anew)"
        elif age < -FUTURE_SLACK:
            reason = "dated ahead of the clock"
        else:
            continue
        if not dry_run:
            try:
                with safe_io.open_dir(state_files.folder(root)) as fd:
                    safe_io.delete_in(fd, name)
            except OSError as exc:
                report.errors.append(f"{name}: {exc.strerror or exc}")
                continue
        report.count_removed(name, name.split("-", 1)[0], info.st_size, info.st_mtime, reason)
    return report


def repair(settings: Settings) -> PruneReport:
    """Remove broken entries only (empty, truncated, orphan halves, stale temporaries) and
    give lone ``-cache`` files of a capped cache their ``-atime``: ``doctor --fix``.

    Raises:
        UsageError: the root is a file or a broken link.
    """
    return prune(settings, max_size=sys.maxsize, max_age=float("inf"), dry_run=False,
                 verify_all=True, tier_max_size=sys.maxsize, references=False)


def prune(settings: Settings, max_size: int, max_age: float, dry_run: bool,
          only: tuple[Kind, ...] = kinds.PRUNABLE, lock_timeout: float = 600.0,
          verify_all: bool = False, strict_root: bool = True,
          tier_max_size: int | None = None, references: bool = True) -> PruneReport:
    """Prune every kind (or the kinds in ``only``) under the cache root and return the report.

    Two prunes of one cache serialize on ``<root>/.prune.lock``. With caching off, a
    missing root, or a root that cannot be locked, nothing is touched and the report says
    why; so is a kind's folder that leads out of the root (a symbolic link): nothing outside
    the root is ever removed or written. ``verify_all``: verify every entry again (JAX:
    decompress each, and compare its bytes with those verified before).
    ``strict_root``: a root that is a file or a broken link raises; otherwise it is only
    reported (the workflow's prune must never fail a run because of the cache).
    ``tier_max_size``: this node's local tier's bound (default ``local_tier.max_size``).
    ``references``: prune the outputs proof's references too (:func:`prune_references`).

    Raises:
        UsageError: (``strict_root``) the root is a file or a broken link.
    """
    result = PruneReport(str(settings.cache_root), dry_run, max_size, max_age,
                         kinds={kind.name: KindPruneReport(dry_run=dry_run) for kind in only})
    root = settings.cache_root
    if root is None:
        result.problems = ["caching is turned off; nothing to prune"]
        return result
    try:
        require_folder_or_missing(root)
    except UsageError as exc:
        if strict_root:
            raise
        result.problems = [f"{exc}; nothing pruned"]
        return result
    if not root.is_dir():
        result.problems = [f"cache root {root} does not exist; nothing to prune"]
        return result
    from gpu_cache.commands.stats import software_mismatches

    result.software_mismatches = software_mismatches(root)
    _prune_shared(result, root, max_size, max_age, dry_run, only, lock_timeout, verify_all, references)
    # A read-only root (its lock cannot be taken) still has this node's tier to bound.
    prune_tier(settings, max_age, dry_run, result, only, lock_timeout, verify_all, tier_max_size)
    return result


def _prune_shared(result: PruneReport, root: Path, max_size: int, max_age: float, dry_run: bool,
                  only: tuple[Kind, ...], lock_timeout: float, verify_all: bool, references: bool) -> None:
    """Prune the kinds in ``only`` (and the ``references``) under the cache root into ``result``,
    under its prune lock."""
    with ExitStack() as held:
        try:
            # flock on a regular file, opened without following a symlink; a symlink, FIFO or
            # device planted as the lock file is replaced, never followed or truncated.
            held.enter_context(safe_locks.exclusive_lock(root / LOCK_NAME, timeout=lock_timeout,
                                                      replace=not dry_run))
        except safe_locks.LockTimeout:
            result.problems = [f"another prune held {root / LOCK_NAME} for {lock_timeout:.0f} s; skipped"]
            return
        except OSError as exc:
            # A read-only root cannot take the lock; a dry run can still report.
            if not dry_run:
                result.problems = [f"cannot lock {root / LOCK_NAME} ({exc.strerror or exc}); "
                                   "nothing pruned"]
                return
        for kind in only:
            try:
                folder = safe_io.within(kind.folder(root), root)
            except safe_io.Outside as exc:  # a link to the user's own files (#21): never followed
                result.problems.append(
                    f"{kind.name}: {exc.filename} is a link to {exc.real}, outside the cache root; not "
                    "pruned (gpu-cache removes nothing outside the root): move that folder under the "
                    "root, or give it a cache root of its own")
                continue
            try:
                report = prune_kind(kind, folder, max_size, max_age, dry_run, verify_all=verify_all)
            except OSError as exc:  # an unreadable folder: the other kinds are still pruned
                result.problems.append(f"{kind.name}: cannot prune {exc.filename or ''}: "
                                       f"{exc.strerror or exc}")
                continue
            result.kinds[kind.name] = report
            log.info("prune: %s: %s %d of %d entries, %s of %s", kind.name,
                     "would remove" if dry_run else "removed", report.entries_removed,
                     report.entries_before, format_size(report.bytes_removed),
                     format_size(report.bytes_before))
            result.problems += [f"{kind.name}: cannot remove {e}" for e in report.errors]
        if references:
            result.references = prune_references(root, max_age, dry_run, max_size=max_size)
            result.problems += [f"outputs reference: cannot remove {e}" for e in result.references.errors]
            result.markers = prune_markers(root, max_age, dry_run)
            result.problems += [f"passed marker: cannot remove {e}" for e in result.markers.errors]


def _kinds(asked: list[str] | None) -> tuple[Kind, ...]:
    """The kinds ``--kind`` names (none: every prunable kind).

    Raises:
        UsageError: a name that is no prunable kind.
    """
    if not asked:
        return kinds.PRUNABLE
    unknown = [name for name in asked if name not in kinds.names_of(kinds.PRUNABLE)]
    if unknown:
        raise UsageError(f"cannot prune kind {unknown[0]!r}; prunable kinds: "
                         f"{', '.join(kinds.names_of(kinds.PRUNABLE))}")
    return tuple(kinds.named(name) for name in dict.fromkeys(asked))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-size", help="largest size per kind, like 10G (default: config, 10G)")
    parser.add_argument("--max-age", help="remove entries unused for longer, like 30d (default: config, 30d)")
    parser.add_argument("--kind", action="append", metavar="KIND",
                        help=f"prune only this kind ({', '.join(kinds.names_of(kinds.PRUNABLE))}); "
                        "repeatable")
    parser.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report here")
    parser.add_argument("--no-fail", action="store_true",
                        help="a cache root that is a file or a broken link is reported in the JSON, "
                             "exit 0 (the workflow's prune rule uses this)")


def run(args: argparse.Namespace) -> int:
    with kinds.no_cyclic_gc():  # millions of objects and no cycles
        settings = common.settings(args)
        try:
            max_size = settings.prune.max_size if args.max_size is None else parse_size(args.max_size)
        except UsageError as exc:
            raise UsageError(f"--max-size: {exc}") from None
        try:
            max_age = settings.prune.max_age_seconds if args.max_age is None else parse_age(args.max_age)
        except UsageError as exc:
            raise UsageError(f"--max-age: {exc}") from None
        report = prune(settings, max_size=max_size, max_age=max_age,
                       dry_run=args.dry_run or settings.prune.dry_run,
                       only=_kinds(args.kind), strict_root=not args.no_fail,
                       references=not args.kind)
        common.emit(report.as_dict(), args.output, to_stdout=args.json, compact=True)
    if not args.json:
        sys.stdout.write(removed_lines(report))
    for line in report.problems:
        common.warn("prune: %s", line)
    for line in report.software_mismatches:
        common.warn("software mismatch: %s", line)
    return 1 if report.software_mismatches and settings.validate.strict else 0


def removed_lines(report: PruneReport, shown: int = 20) -> str:
    """What a prune removed (or would remove), an entry a line, ``shown`` per kind at most."""
    verb = "would remove" if report.dry_run else "removed"
    lines = []
    parts = [*report.kinds.items(), *((f"local tier {kind}", part) for kind, part in report.tier.items()),
             *((("outputs reference", report.references),) if report.references else ()),
             *((("passed marker", report.markers),) if report.markers else ())]
    for kind, part in parts:
        for entry in part.removed[:shown]:
            lines.append(f"{verb} {kind} {entry['key']} ({entry['name']}, "
                         f"{format_size(entry['bytes'])}): {entry['reason']}")
        if len(part.removed) > shown:
            lines.append(f"{verb} {len(part.removed) - shown} more {kind} entries (--json lists all)")
    return shown_lines(lines)  # names and GPU types from the root, one line each
