"""``gpu-cache pack``: the chosen entries, whole, into one archive with a manifest first."""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import socket
import stat
import tarfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpu_cache import __version__
from gpu_cache.config.units import format_size
from gpu_cache.core import kinds, owners, references, safe_io, software
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import CARRIED, Kind
from gpu_cache.core.kinds.carrying import Carried, ManifestEntry, shown
from gpu_cache.core.shown import shown_lines

from ._choose import dropped, own_records, software_section
from ._common import Progress, log
from ._format import FORMAT, FORMAT_VERSION, MANIFEST_NAME

_WRITE_MODES = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.xz": "w:xz", ".txz": "w:xz",
                ".tar.bz2": "w:bz2", ".tbz2": "w:bz2"}


@dataclass
class _Packed:
    """One entry chosen for the archive: its manifest entry and the files to add."""

    entry: ManifestEntry
    paths: dict[str, Path]


@dataclass
class PackReport:
    archive: str
    entries: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    missing: dict[str, int] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    #: Entries left out because another user could have written them (kind, key, reason).
    untrusted: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"archive": self.archive, "entries": self.entries, "bytes": self.bytes,
                "skipped": self.skipped, "untrusted": self.untrusted, "missing_from_cache": self.missing,
                "software": self.software, "device": self.device}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in safe_io.iter_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def _packed(kind: Kind, carried: Carried) -> _Packed:
    """An entry of the files of ``carried``, with each one's size and digest."""
    sizes = {name: os.lstat(path).st_size for name, path in carried.files.items()}
    digests = {name: _sha256(path) for name, path in carried.files.items()}
    return _Packed(ManifestEntry(kind, carried.key, sizes, digests,
                                 min(max(0.0, carried.last_use), time.time()), carried.name,
                                 dict(carried.fields)), carried.files)


def _archive_mode(archive: Path) -> str:
    name = archive.name.lower()
    for suffix in sorted(_WRITE_MODES, key=len, reverse=True):
        if name.endswith(suffix) and len(name) > len(suffix):
            return _WRITE_MODES[suffix]
    raise UsageError(f"archive {archive}: its name must end in one of {', '.join(_WRITE_MODES)} "
                     "(the ending chooses the compression)")


def _archive_target(archive: Path) -> Path:
    """The path the archive is written at: a symlink is followed, a folder refused."""
    try:
        info = os.stat(archive)
    except FileNotFoundError:
        return Path(os.path.realpath(archive)) if archive.is_symlink() else archive
    except OSError as exc:
        raise UsageError(f"archive {archive} cannot be written: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"archive {archive} is {safe_io.describe(info.st_mode)}; name a file")
    return Path(os.path.realpath(archive))


def check_kinds(asked: Iterable[str]) -> tuple[Kind, ...]:
    """The kinds asked for by name, each once, once each is shown to be carried.

    Raises:
        UsageError: a kind that is not carried.
    """
    chosen = tuple(dict.fromkeys(asked))
    carried = kinds.names_of(CARRIED)
    for name in chosen:
        if name not in carried:
            raise UsageError(f"cannot carry cache kind {shown(name)}; kinds: {', '.join(carried)}")
    return tuple(map(kinds.named, chosen))


def _stabilised(chosen: list[_Packed]) -> list[_Packed]:
    """The entries with nothing that moves when a job hits them (#32: a registry layer of
    unchanged entries must keep its digest): no last use (unpack stamps its arrival), no JAX
    ``-atime`` file (:meth:`Kind.volatile`), in the order of their kinds and keys, each
    one's files by name."""
    out = []
    for item in chosen:
        entry = item.entry
        names = sorted(n for n in item.paths if not entry.kind.volatile(n))
        out.append(_Packed(ManifestEntry(entry.kind, entry.key, {n: entry.files[n] for n in names},
                                         {n: entry.sha256[n] for n in names}, 0.0, entry.name,
                                         entry.fields, entry.warm),
                           {n: item.paths[n] for n in names}))
    order = {kind.name: number for number, kind in enumerate(CARRIED)}
    return sorted(out, key=lambda p: (order[p.entry.kind.name], p.entry.key))


def _stable_manifest(manifest: dict[str, Any]) -> None:
    """Leave out what differs between two packs of the same entries (the source root only
    where a kind's keys hold it), and say that the pack keeps no times."""
    del manifest["created"], manifest["host"]
    if not any(part.get("path_in_key") for part in manifest["kinds"].values()):
        del manifest["source_root"]
    manifest["times_normalised"] = True


def _written_by_others(paths: Iterable[Path], team: int | None) -> str | None:
    """Why another user may have written a file of an entry (``paths``), or the folder it is
    in, or None: the rule by which gpu-cache reads a file
    (:func:`gpu_cache.core.owners.written_by_others`; ``team``: the ``shared_group``'s id). Such
    an entry is not what a job of yours wrote, and once packed it would arrive as the unpacking
    user's own files (#37)."""
    for path in paths:
        for where in (path, path.parent):
            try:
                why = owners.written_by_others(os.lstat(where), team, where=where)
            except OSError as exc:
                why = f"cannot be inspected ({exc.strerror or exc})"
            if why is not None:
                return f"{where.name} is {why}"
    return None


def _candidates(kind: Kind, folder: Path, wanted: set[str] | None, skipped: list[dict[str, str]],
                untrusted: list[dict[str, str]], team: int | None) -> list[_Packed]:
    """The entries of ``kind`` in ``folder`` that pack takes (:meth:`Carry.entries`);
    those another user could have written go to ``untrusted``, the broken ones to ``skipped``."""
    out = []
    for carried in kind.carry.entries(folder, wanted):
        why = _written_by_others(carried.files.values(), team)
        if why is not None:
            untrusted.append({"kind": kind.name, "key": carried.key, "reason": why})
        elif carried.problem is not None:
            skipped.append({"kind": kind.name, "key": carried.key, "reason": carried.problem})
        else:
            out.append(_packed(kind, carried))
    return out


def _kind_candidates(kind: Kind, root: Path, tier: Path | None, wanted: set[str] | None,
                     skipped: list[dict[str, str]], untrusted: list[dict[str, str]],
                     team: int | None) -> list[_Packed]:
    """The entries of ``kind`` to pack (of ``wanted`` keys, when given) from the root, and, for
    a tiered kind with ``tier``, those of the local tier that the root lacks; broken ones go to
    ``skipped``, those another user could have written to ``untrusted``."""
    found = _candidates(kind, kind.folder(root), wanted, skipped, untrusted, team)
    if tier is None or not kind.tiered:
        return found
    known = {p.entry.key for p in found} | {s["key"] for s in skipped + untrusted if s["kind"] == kind.name}
    local_skipped: list[dict[str, str]] = []
    local_untrusted: list[dict[str, str]] = []
    found += [p for p in _candidates(kind, kind.folder(tier), wanted, local_skipped, local_untrusted, team)
              if p.entry.key not in known]
    skipped += [s for s in local_skipped if s["key"] not in known]
    untrusted += [s for s in local_untrusted if s["key"] not in known]
    return found


def _chosen(chosen_kinds: tuple[Kind, ...], root: Path, tier: Path | None, used: list[Any] | None,
            team: int | None
            ) -> tuple[list[_Packed], list[dict[str, str]], list[dict[str, str]], dict[str, int]]:
    """The entries of ``chosen_kinds`` to pack (those the records ``used`` name, when given),
    and those left out: broken (``skipped``), another user's (``untrusted``), and per kind how
    many the records name that are gone (``missing``)."""
    skipped: list[dict[str, str]] = []
    untrusted: list[dict[str, str]] = []
    chosen: list[_Packed] = []
    missing: dict[str, int] = {}
    for kind in chosen_kinds:
        wanted = set().union(*(kind.carry.recorded_keys(r) for r in used)) if used is not None else None
        if used is not None and any(dropped(r, kind) for r in used):
            log.warning("some records list only their first keys: a few %s entries of the "
                        "selection may be left out", kind.name)
        found = _kind_candidates(kind, root, tier, wanted, skipped, untrusted, team)
        if wanted is not None:
            missing[kind.name] = len(wanted - {p.entry.key for p in found}
                                     - {s["key"] for s in skipped + untrusted if s["kind"] == kind.name})
        chosen += found
    for item in skipped:
        log.warning("pack: left out broken %s entry %s: %s", item["kind"], shown(item["key"]), item["reason"])
    for item in untrusted:
        log.warning("pack: left out %s entry %s, which another user could have written: %s", item["kind"],
                    shown(item["key"]), shown(item["reason"]))
    return chosen, skipped, untrusted, missing


def pack(*, root: Path, archive: Path, kinds: Iterable[str] | None = None, gpu_type: str | None = None,
         workload: str | None = None, matcher: Callable[[Any], bool] | None = None,
         tier: Path | None = None, stable: bool = False, team: owners.Team | None = None) -> PackReport:
    """Write the entries of ``kinds`` (default: every carried kind) under ``root`` into
    ``archive``, with a manifest; with ``tier`` (this node's local tier of the root, issue 23),
    also its entries of tiered kinds that the root lacks (not promoted yet, or a read-only root).
    ``stable``: the same entries give the same bytes (#32; :func:`_stabilised`).

    Only entries gpu-cache would itself read go: each file, and the folder it is in, owned by
    you, root or (``shared_group``) the team, and writable by nobody else; the others are
    left out and counted (:attr:`PackReport.untrusted`).

    ``gpu_type``/``matcher`` (for ``workload``): only the entries that the warm and validate
    passes of that GPU type (and that workload) hit or wrote, as their records name them.
    Broken entries are left out (listed in the manifest's ``skipped``).

    Raises:
        UsageError: an unknown kind, no cache at ``root``, no record of the selection, a bad
            archive name.
        OSError: the cache changed while it was packed, or the archive cannot be written.
    """
    from gpu_cache.jobenv.fs import require_folder_or_missing

    chosen_kinds = CARRIED if kinds is None else check_kinds(kinds)
    team_gid = team.gid if team is not None else None
    mode = _archive_mode(archive)
    target = _archive_target(archive)
    require_folder_or_missing(root)
    if not root.is_dir():
        raise UsageError(f"no cache at {root} (pass the cache root with --cache-root)")
    selective = gpu_type is not None or matcher is not None
    used = own_records(root, gpu_type, matcher)
    if selective and not used:
        what = " and ".join(x for x in (f"GPU type {gpu_type}" if gpu_type else "",
                                        f"workload {workload}" if matcher else "") if x)
        raise UsageError(f"no warm or validate pass of {what} is recorded under {root} (the stats "
                         "hook records them; a `python -c` workload cannot be told apart); pack "
                         "without that option to take every entry")
    chosen, skipped, untrusted, missing = _chosen(chosen_kinds, root, tier, used if selective else None,
                                                  team_gid)
    chosen = _with_proof(root, tier, chosen)
    chosen = _stabilised(chosen) if stable else chosen
    entries = [item.entry for item in chosen]
    soft, dev = software_section(entries, used)
    if gpu_type is not None:
        dev["gpu_type"] = gpu_type
    by_kind: dict[str, list[ManifestEntry]] = {kind.name: [] for kind in chosen_kinds}
    for entry in entries:
        by_kind[entry.kind.name].append(entry)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gpu_cache_version": __version__,
        "created": time.time(), "host": socket.gethostname(), "source_root": str(root),
        "selection": {"kinds": list(by_kind), "gpu_type": gpu_type, "workload": workload},
        "software": soft["identity"], "software_by_kind": soft["by_kind"],
        "software_source": soft["source"], "device": dev,
        "kinds": {name: {"entries": [e.as_json() for e in items], "bytes": sum(e.size for e in items),
                         "path_in_key": soft["path_in_key"].get(name)}
                  for name, items in by_kind.items()},
        "skipped": skipped,
    }
    if stable:
        _stable_manifest(manifest)
    for kind in chosen_kinds:
        if soft["path_in_key"].get(kind.name):
            made = kind.carry.software_words(soft["by_kind"][kind.name][0])
            log.warning("the %s entries were written by %s, whose keys hold the cache folder's path: "
                        "they hit only at %s", kind.name, made, kind.folder(root))
    total = sum(e.size for e in entries)
    log.info("pack: %d entries, %s, into %s", len(chosen), format_size(total), target)
    _write_archive(target, mode, manifest, chosen, stable)
    return PackReport(str(target), {k: len(v) for k, v in by_kind.items()}, total, skipped, missing,
                      soft["identity"], dev, untrusted)


def _with_proof(root: Path, tier: Path | None, chosen: list[_Packed]) -> list[_Packed]:
    """The entries, each marked ``warm`` whose bytes a warm process compiled, as the root's
    outputs references name them (docs/outputs.md): unpack keeps that as their proof, and a warm
    there hits them without compiling them again. One whose bytes no warm compiled (compiled by
    jobs, or changed since) goes unmarked: the first warm there compiles it again."""
    known = references.proven(root)
    wanted: dict[str, set[str]] = {}
    for item in chosen:
        wanted.setdefault(item.entry.kind.name, set()).add(item.entry.key)
    here = references.digests(root, None, wanted)  # pack takes the root's copy where it has one
    local = references.digests(tier, None, wanted) if tier is not None else {}
    out = []
    for item in chosen:
        kind, key = item.entry.ident
        digest = here.get(kind, {}).get(key) or local.get(kind, {}).get(key)
        out.append(_Packed(replace(item.entry, warm=references.compiled_by_warm(known, kind, key, digest)),
                           item.paths))
    return out


def _tar_info(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, mtime, 0o644, tarfile.REGTYPE
    return info


def _write_archive(target: Path, mode: str, manifest: dict[str, Any], chosen: list[_Packed],
                   stable: bool = False) -> None:
    """Stream the archive into a temporary file beside ``target``, then rename it there: a
    reader never sees half an archive. ``stable``: every time in it 0 (the gzip header's too).

    Raises:
        OSError: a file of an entry changed or vanished meanwhile, or writing failed.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(safe_io.temp_name(target.name))
    fd = os.open(temp, safe_io.CREATE_FLAGS, 0o644)
    try:
        with ExitStack() as stack:
            raw: Any = stack.enter_context(os.fdopen(fd, "wb"))
            if stable and mode == "w:gz":  # tarfile's own gzip header holds the time and a file name
                raw = stack.enter_context(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0))
                mode = "w:"
            tar = stack.enter_context(tarfile.open(fileobj=raw, mode=mode, format=tarfile.PAX_FORMAT))
            data = json.dumps(manifest, indent=1, default=str).encode()
            tar.addfile(_tar_info(MANIFEST_NAME, len(data), 0 if stable else time.time()), io.BytesIO(data))
            progress = Progress("pack: writing", len(chosen))
            written = 0
            for number, item in enumerate(chosen, 1):
                for name, path in item.paths.items():
                    _add_file(tar, item.entry, name, path, 0 if stable else None)
                written += item.entry.size
                progress.step(number, written)
        os.replace(temp, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(temp)
        raise


class _Hashing(io.RawIOBase):
    """A file read through, its SHA-256 taken on the way (as tarfile copies it)."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self.stream, self.digest = stream, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        data = self.stream.read(size)
        self.digest.update(data)
        return data


def _add_file(tar: tarfile.TarFile, entry: ManifestEntry, name: str, path: Path,
              mtime: float | None = None) -> None:
    """Add one file, as the manifest names it (the same size and digest), with its own
    modification time or ``mtime``, or fail."""
    changed = OSError(errno.EAGAIN, "changed while it was packed; pack again", str(path))
    with safe_io.open_regular(path) as fd:
        info = os.fstat(fd)
        if info.st_size != entry.files[name]:
            raise changed
        with os.fdopen(os.dup(fd), "rb") as stream:
            hashing = _Hashing(stream)
            tar.addfile(_tar_info(entry.member(name), info.st_size,
                                  info.st_mtime if mtime is None else mtime), hashing)
    if hashing.digest.hexdigest() != entry.sha256[name]:
        raise changed


def render_pack(report: PackReport) -> str:
    counts = ", ".join(f"{kind} {n}" for kind, n in report.entries.items())
    device = report.device.get("gpu_type") or ", ".join(report.device.get("gpu_types") or []) or "?"
    device += "".join(f"; {kind} targets {', '.join(part['targets'])}" for kind, part in report.device.items()
                      if isinstance(part, dict) and part.get("targets"))
    lines = [f"packed {sum(report.entries.values())} entries ({counts}; {format_size(report.bytes)}) "
             f"into {report.archive}", f"warmed with {software.describe(report.software)}; device {device}"]
    if report.skipped:
        lines.append(f"left out {len(report.skipped)} broken entries (listed in the manifest)")
    if report.untrusted:
        lines.append(f"left out {len(report.untrusted)} entries another user could have written "
                     "(owned by another user, or writable by others: gpu-cache does not read them)")
    for kind, n in report.missing.items():
        if n:
            lines.append(f"{n} {kind} entries the records name are no longer in the cache")
    return shown_lines(lines)  # the software a record names may be any text
