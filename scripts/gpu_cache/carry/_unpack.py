"""``gpu-cache unpack``: check an archive against the target, then write its entries whole.

A first pass goes through the whole archive before anything is written: every member safe and
as the manifest says, every group file Triton's (a dry run also checks every file's digest).
The second pass writes, each entry through its kind's writer, which checks it (digests, and
as its kind reads it) before it is put in place (its kind's :meth:`Carry.writers`); an entry found
damaged in either pass is not written, and is reported.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from gpu_cache.config.units import format_size
from gpu_cache.core import references, safe_io
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import Kind, named
from gpu_cache.core.kinds.carrying import (
    Damaged,
    ManifestEntry,
    Refused,
    Writer,
    digest_problem,
    sha256,
    shown,
)
from gpu_cache.core.owners import Team
from gpu_cache.core.shown import shown_lines
from gpu_cache.jobenv import trust

from ._archive import Archive, MemberReader, open_archive
from ._common import Progress, log
from ._fit import fit_problems, target_software
from ._format import printable
from ._pack import check_kinds

#: Free space kept beyond what unpack writes.
SPACE_MARGIN = 64 << 20


class Action(Enum):
    WRITE = "write"  # absent here
    REPLACE = "replace"  # older or broken here
    KEEP = "keep"  # as new or newer here


@dataclass
class UnpackReport:
    archive: str
    cache_root: str
    dry_run: bool
    written: dict[str, int] = field(default_factory=dict)
    replaced: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    checked: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)
    #: Entries not written because they are not what was packed: kind, key, why.
    damaged: list[dict[str, str]] = field(default_factory=list)
    #: Entries written whose bytes a warm compiled where they were packed, per kind: that proof
    #: is kept here (docs/outputs.md).
    proven: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"archive": self.archive, "cache_root": self.cache_root, "dry_run": self.dry_run,
                "written": self.written, "replaced": self.replaced, "kept_newer": self.kept,
                "damaged": self.damaged, "bytes": self.bytes, "checked": self.checked,
                "notes": self.notes, "forced_past": self.forced, "proven": self.proven}

    def failures(self) -> list[str]:
        """One line per entry that was not written because it is damaged."""
        return [f"{d['kind']} entry {shown(d['key'])} is damaged in the archive: {d['reason']}; not "
                "written (the entry already here, if any, is kept)" for d in self.damaged]


def render_unpack(report: UnpackReport) -> str:
    verb = "would unpack" if report.dry_run else "unpacked"
    parts = [f"{kind}: {report.written.get(kind, 0)} new, {report.replaced.get(kind, 0)} replaced, "
             f"{report.kept.get(kind, 0)} kept (newer here)"
             + (f", {n} damaged" if (n := sum(d["kind"] == kind for d in report.damaged)) else "")
             + (f", {report.proven[kind]} a warm's compile" if report.proven.get(kind) else "")
             for kind in report.written]
    lines = [f"{verb} {report.archive} into {report.cache_root} ({format_size(report.bytes)}): "
             + "; ".join(parts)]
    lines += [f"forced past: {line}" for line in report.forced]
    return shown_lines(lines)


def _existing(kind: Kind, folder: Path) -> dict[str, Any]:
    try:
        return {e.key: e for e in kind.scan(folder, grace_seconds=3600.0)
                if e.name not in ("(temporary)", "(trash)", "(symbolic link)")}
    except OSError:
        return {}


def _plan(entries: Mapping[str, list[ManifestEntry]], root: Path) -> dict[tuple[str, str], Action]:
    """What to do with each entry (by its kind and key)."""
    actions: dict[tuple[str, str], Action] = {}
    for items in entries.values():
        here = _existing(items[0].kind, items[0].kind.folder(root)) if items else {}
        for entry in items:
            old = here.get(entry.key)
            if old is None:
                actions[entry.ident] = Action.WRITE
            elif old.problem is None and old.last_use >= entry.last_use:
                actions[entry.ident] = Action.KEEP
            else:
                actions[entry.ident] = Action.REPLACE
    return actions


def _free_space(path: Path) -> int | None:
    current = path
    while True:
        try:
            return shutil.disk_usage(current).free
        except FileNotFoundError:
            if current == current.parent:
                return None
            current = current.parent
        except OSError:
            return None


def _kind_folder_fd(root: Path, kind: Kind, team: Team | None) -> int:
    """A descriptor of the kind's folder under ``root``, made when missing: a real folder,
    never a symbolic link (which would lead the writes outside the root), and trusted.

    Raises:
        Refused: it is a link, not a folder, or not trusted.
    """
    folder = kind.folder(root)
    trust.make_folder(folder, team)
    why = trust.distrust(folder, team, trusted_above=root)
    if why:
        raise Refused(why)
    try:
        return os.open(folder, safe_io.DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{folder} is not a real folder (a symbolic link?); unpack writes only into "
                          "real folders under the cache root") from None
        raise


def member_problem(reader: MemberReader, member: tarfile.TarInfo, entry: ManifestEntry,
                   file_name: str, read_all: bool) -> str | None:
    """Why a member is not what was packed (damaged), or None: a file its kind reads whole
    always (:meth:`Carry.whole`: a Triton group file, whose paths are rewritten) is read
    and checked; with ``read_all`` (a dry run, which writes nothing to check as it goes)
    every other file too, as its kind reads it where it says, else its digest in chunks.

    Raises:
        Refused: a file, as packed, that its kind refuses (an archive made to write
            elsewhere), or one over the size it always reads whole.
    """
    kind = entry.kind
    whole = kind.carry.whole(file_name)
    if whole is not None and (whole[1] or read_all):
        limit, always = whole
        if member.size <= limit:
            data = reader.read(member.size)
            return digest_problem(entry, file_name, sha256(data)) or kind.carry.member(entry, file_name, data)
        if always:
            raise Refused(f"{kind.name} entry {shown(entry.key)}: {shown(file_name)} holds {member.size} "
                          f"bytes, more than {kind.name} writes")
    if not read_all:
        return None
    digest = hashlib.sha256()
    for chunk in iter(lambda: reader.read(safe_io.CHUNK), b""):
        digest.update(chunk)
    return digest_problem(entry, file_name, digest.hexdigest())


def _damage(opened: Archive, root: Path, todo: set[tuple[str, str]],
            read_all: bool) -> dict[tuple[str, str], str]:
    """First pass: every member safe and as the manifest says; why each entry to write is
    damaged, for those found so (``read_all``: every file read and checked, else only the
    group files: the writers check the rest as they write)."""
    damaged: dict[tuple[str, str], str] = {}
    for data, member, entry, file_name in opened.members(root):
        if entry.ident in todo and entry.ident not in damaged:
            problem = member_problem(data, member, entry, file_name, read_all)
            if problem:
                damaged[entry.ident] = problem
    return damaged


def unpack(*, root: Path | None, archive: Path, kinds: Iterable[str] | None = None,
           gpu_type: str | None = None, python: str | None = None, image: str | None = None,
           force: bool = False, dry_run: bool = False, team: Team | None = None) -> UnpackReport:
    """Check ``archive`` against the target and write its entries (of ``kinds``; default: all
    in it) under ``root``. Entries found damaged are not written (``report.damaged``).

    Raises:
        UsageError: no cache root, a bad kind, an archive that is not gpu-cache's, a Python or
            image that cannot be run.
        Refused: the archive does not fit the target (unless ``force``), is unsafe, or does
            not fit on the disk; nothing is written then.
        OSError: writing failed (the entries written until then are whole).
    """
    from gpu_cache.jobenv.fs import require_folder_or_missing

    if root is None:
        raise UsageError("unpack needs a cache root (caching is turned off)")
    require_folder_or_missing(root)
    asked = None if kinds is None else check_kinds(kinds)
    target, target_words = target_software(python, image)
    report = UnpackReport(str(archive), str(root), dry_run)
    with open_archive(archive) as opened:
        entries = opened.entries
        chosen = [kind for kind in map(named, entries) if asked is None or kind in asked]
        present = [kind for kind in chosen if entries[kind.name]]
        problems, notes = fit_problems(opened.manifest, present, target, target_words, image, gpu_type)
        notes += _path_notes(opened.manifest, present, root)
        report.checked = {"software": target_words, "kinds": [kind.name for kind in present],
                          "gpu_type": gpu_type or "not checked (no --gpu-type)"}
        report.notes = notes
        for note in notes:
            log.warning("unpack: %s", note)
        if problems and not force:
            on = f" and GPU type {gpu_type}" if gpu_type else ""
            raise Refused(f"{archive} does not fit {target_words}{on}: {'; '.join(problems)}",
                          hint="--force unpacks it anyway")
        report.forced = problems
        actions = _plan({k.name: entries[k.name] for k in chosen}, root)
        todo = {e.ident: e for k in chosen for e in entries[k.name] if actions[e.ident] != Action.KEEP}
        need = sum(e.size for e in todo.values())
        free = _free_space(root)
        if free is not None and need + SPACE_MARGIN > free:
            raise Refused(f"the archive's entries need {format_size(need)} under {root}, and only "
                          f"{format_size(free)} is free there")
        for ident, reason in _damage(opened, root, set(todo), read_all=dry_run).items():
            report.damaged.append({"kind": ident[0], "key": ident[1], "reason": reason})
            need -= todo.pop(ident).size
            del actions[ident]
        for kind in chosen:
            for name, action in (("written", Action.WRITE), ("replaced", Action.REPLACE),
                                 ("kept", Action.KEEP)):
                getattr(report, name)[kind.name] = sum(1 for e in entries[kind.name]
                                                       if actions.get(e.ident) == action)
        report.bytes = need
        if not dry_run and todo:
            with ExitStack() as stack:
                fds = {}
                for kind in chosen:
                    if any(ident[0] == kind.name for ident in todo):
                        fds[kind.name] = _kind_folder_fd(root, kind, team)
                        stack.callback(os.close, fds[kind.name])
                # a stable pack's entries (#32) are as new as their arrival here
                arrival = time.time() if opened.manifest.get("times_normalised") is True else None
                try:
                    placed = _write_entries(root, fds, opened, actions, report, arrival)
                except Refused as exc:  # the archive changed since the first pass
                    raise Refused(exc.reason, exc.hint, written=True) from None
            _keep_proof(root, archive, opened.manifest,
                        [e for items in entries.values() for e in items if e.ident in placed], report)
    return report


def _keep_proof(root: Path, archive: Path, manifest: Mapping[str, Any], placed: list[ManifestEntry],
                report: UnpackReport) -> None:
    """Keep, for the entries written here whose bytes a warm process compiled where they were
    packed (``warm``), that proof (:func:`gpu_cache.core.references.keep_carried`): a warm here
    hits them without compiling them again. A root whose state folder cannot take it only loses
    that: its first warm compiles them again (docs/outputs.md)."""
    wanted: dict[str, set[str]] = {}
    for entry in placed:
        if entry.warm:
            wanted.setdefault(entry.kind.name, set()).add(entry.key)
    if not wanted:
        return
    found = references.digests(root, None, wanted)  # their bytes here (a Triton group's paths rewritten)
    try:
        source = hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()[:24]
        references.keep_carried(root, source, archive.name, found)
    except OSError as exc:
        log.warning("unpack: the entries' proof (a warm compiled them) cannot be kept in %s (%s): the "
                    "first warm here compiles them again", root, exc.strerror or exc)
        return
    report.proven = {kind: len(keys) for kind, keys in found.items() if keys}


def _path_notes(manifest: Mapping[str, Any], present: list[Kind], root: Path) -> list[str]:
    """A note per kind whose entries hold their old folder's path in their keys
    (:meth:`Carry.path_in_key`: jax <= 0.10 with XLA caches on): they hit only there."""
    source_root = manifest.get("source_root")
    notes = []
    for kind in present:
        part = manifest["kinds"].get(kind.name) or {}
        old = Path(source_root) / kind.name if isinstance(source_root, str) else None
        if part.get("path_in_key") and old is not None and old != kind.folder(root):
            notes.append(f"its {kind.name} entries hold their old folder's path in their keys: they "
                         f"hit only at {printable(str(old))}")
    return notes


def _write_entries(root: Path, fds: dict[str, int], opened: Archive,
                   actions: dict[tuple[str, str], Action], report: UnpackReport,
                   arrival: float | None = None) -> set[tuple[str, str]]:
    """Second pass: write each entry that is to be written, whole, into its kind's folder
    (``fds``: their descriptors), with its own times or, given ``arrival``, that one. The
    entries put in place (by kind and key)."""
    writers: dict[Kind, Callable[[ManifestEntry, bool], Writer]] = {}
    todo = {ident for ident, action in actions.items() if action != Action.KEEP}
    placed: set[tuple[str, str]] = set()
    progress = Progress("unpack", len(todo))
    writer: Writer | None = None
    done = written_bytes = 0
    try:
        for data, member, entry, file_name in opened.members(root):
            if entry.ident not in todo:
                continue
            action = actions[entry.ident]
            kind = entry.kind
            if arrival is not None:
                member.mtime = entry.last_use = arrival
            if writer is None or writer.entry is not entry:
                if kind not in writers:
                    writers[kind] = kind.carry.writers(kind.folder(root), fds[kind.name])
                writer = writers[kind](entry, action == Action.REPLACE)
            counted = report.written if action == Action.WRITE else report.replaced
            try:
                writer.add(file_name, data, member)
                if writer.pending:
                    continue
                if writer.finish():
                    placed.add(entry.ident)
                else:  # a process wrote a newer one meanwhile: it stays
                    counted[kind.name] -= 1
                    report.kept[kind.name] += 1
            except Damaged as exc:
                counted[kind.name] -= 1
                report.damaged.append({"kind": kind.name, "key": entry.key, "reason": str(exc)})
                todo.discard(entry.ident)  # its other files are passed over
            writer.abandon()
            writer = None
            done += 1
            written_bytes += entry.size
            progress.step(done, written_bytes)
    finally:
        if writer is not None:
            writer.abandon()
    return placed
