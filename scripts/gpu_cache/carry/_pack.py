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
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from gpu_cache import __version__
from gpu_cache.config.units import format_size
from gpu_cache.core import safe_io, software
from gpu_cache.core.caches import autotune as autotune_cache
from gpu_cache.core.caches import inductor as inductor_cache
from gpu_cache.core.caches import jax as jax_cache
from gpu_cache.core.caches import jax_frames
from gpu_cache.core.caches import jax_triton as kernel_cache
from gpu_cache.core.caches import triton as triton_cache
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import CARRIED, KINDS, scan
from gpu_cache.core.shown import shown_lines

from ._choose import dropped, keys_of, own_records, software_section
from ._common import Progress, log
from ._format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_SMALL_JSON,
    ManifestEntry,
    plain_name,
    shown,
)

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

    def as_dict(self) -> dict[str, Any]:
        return {"archive": self.archive, "entries": self.entries, "bytes": self.bytes,
                "skipped": self.skipped, "missing_from_cache": self.missing,
                "software": self.software, "device": self.device}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in safe_io.iter_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def _packed(kind: str, key: str, paths: dict[str, Path], last_use: float, **more: Any) -> _Packed:
    """An entry of the files at ``paths``, with each one's size and digest."""
    sizes = {name: os.lstat(path).st_size for name, path in paths.items()}
    digests = {name: _sha256(path) for name, path in paths.items()}
    return _Packed(ManifestEntry(kind, key, sizes, digests, min(max(0.0, last_use), time.time()),
                                 **more), paths)


def _jax_candidates(folder: Path, wanted: set[str] | None, skipped: list[dict[str, str]]) -> list[_Packed]:
    entries = [e for e in scan("jax", folder, grace_seconds=3600.0) if e.name != "(temporary)"]
    if wanted is not None:
        entries = [e for e in entries if e.key in wanted]
    out = []
    progress = Progress("pack: checking JAX entries", len(entries))
    for number, entry in enumerate(entries, 1):
        source = entry.source
        assert isinstance(source, jax_cache.JaxEntry)
        problem = entry.problem
        if problem is None and source.cache_path is not None:
            problem = jax_frames.undecompressable(source.cache_path)  # truncated, a bomb
        progress.step(number, 0)
        if problem is not None or source.cache_path is None:
            skipped.append({"kind": "jax", "key": entry.key, "reason": problem or "no -cache file"})
            continue
        paths = {p.name: p for p in (source.cache_path, source.atime_path) if p is not None}
        out.append(_packed("jax", entry.key, paths, entry.last_use, name=entry.name))
    return out


def _regular_files(folder: Path) -> dict[str, Path]:
    """The regular files directly in ``folder`` (a writer's temporary folder is not part of
    the entry)."""
    out = {}
    with os.scandir(folder) as listing:
        for item in listing:
            if item.is_file(follow_symlinks=False) and plain_name(item.name):
                out[item.name] = Path(item.path)
    return out


def _target_of(metadata: Any) -> str | None:
    """``sm_90`` from a Triton kernel's metadata (``target: {backend: cuda, arch: 90}``)."""
    target = metadata.get("target") if isinstance(metadata, dict) else None
    if not isinstance(target, dict):
        return None
    backend, arch = target.get("backend"), target.get("arch")
    if backend == "cuda" and isinstance(arch, int):
        return f"sm_{arch}"
    return f"{backend}:{arch}" if isinstance(backend, str) and isinstance(arch, (int, str)) else None


def _triton_candidates(folder: Path, wanted: set[str] | None,
                       skipped: list[dict[str, str]]) -> list[_Packed]:
    """Triton's complete key folders: kernels (also those whose group file names another
    path: a copied cache, rewritten on unpack) and autotune results."""
    try:
        inventory = triton_cache.scan(folder)
    except triton_cache.TritonCacheError:
        return []
    out = []
    for source in inventory.entries:
        if wanted is not None and source.key not in wanted:
            continue
        if source.kind == triton_cache.KIND_MODULE:
            skipped.append({"kind": "triton", "key": source.key,
                            "reason": f"native module {source.kernel} (built by this machine's C "
                                      "compiler for its Python; Triton rebuilds it in seconds)"})
            continue
        if source.kind not in (triton_cache.KIND_KERNEL, triton_cache.KIND_AUTOTUNE) or not source.complete:
            skipped.append({"kind": "triton", "key": source.key,
                            "reason": "; ".join(source.problems) or f"{source.kind} entry"})
            continue
        files = _regular_files(source.path)
        target = None
        if source.kernel and f"{source.kernel}.json" in files:
            try:
                target = _target_of(json.loads(safe_io.read_bounded(files[f"{source.kernel}.json"],
                                                                    MAX_SMALL_JSON)))
            except (OSError, ValueError, RecursionError):
                pass
        out.append(_packed("triton", source.key, files, source.mtime, name=source.kernel,
                           triton_kind=source.kind, target=target))
    return out


def _autotune_candidates(folder: Path, wanted: set[str] | None,
                         skipped: list[dict[str, str]]) -> list[_Packed]:
    """tokamax's autotuning results, each one file with the versions its wrapper names."""
    out = []
    for entry in scan("autotune", folder, grace_seconds=3600.0):
        if wanted is not None and entry.key not in wanted:
            continue
        source = entry.source
        assert isinstance(source, autotune_cache.AutotuneEntry)
        problem = entry.problem
        if problem is None and not autotune_cache.KEY_RE.fullmatch(entry.key):
            problem = "a name gpu-cache does not give a result"
        if problem is None:
            try:
                wrapper = json.loads(safe_io.read_bounded(source.path, autotune_cache.RESULT_LIMIT))
                problem = autotune_cache.problem_of(wrapper, entry.key)
            except (OSError, ValueError, RecursionError) as exc:
                problem = f"unreadable result ({exc.__class__.__name__})"
        if problem is not None:
            skipped.append({"kind": "autotune", "key": entry.key, "reason": problem})
            continue
        path = Path(source.path)
        out.append(_packed("autotune", entry.key, {path.name: path}, entry.last_use, name=entry.name,
                           versions=(str(wrapper["tokamax"]), str(wrapper["jax"]))))
    return out


def _inductor_candidates(folder: Path, wanted: set[str] | None,
                         skipped: list[dict[str, str]]) -> list[_Packed]:
    """Inductor's FX graph and AOTAutograd key folders and its code entries (each C++ library
    checked whole); not its locks, temporaries, Triton folder or other files (a process remakes
    them). ``wanted`` (the records' graphs) selects FX graphs; the AOTAutograd entries and code
    they may name all go."""
    out = []
    for entry in scan("inductor", folder, grace_seconds=3600.0, verify_after=0.0):
        source = entry.source
        assert isinstance(source, inductor_cache.InductorEntry)
        if source.what not in ("code", "fxgraph", "aotautograd"):
            continue
        if wanted is not None and source.what == "fxgraph" and entry.key not in wanted:
            continue
        if entry.problem is not None:
            skipped.append({"kind": "inductor", "key": entry.key, "reason": entry.problem})
            continue
        if source.what == "code":
            files = {Path(p).name: Path(p) for p in source.paths if p != source.lock}
        else:
            files = _regular_files(Path(source.paths[0]))
        if files:
            out.append(_packed("inductor", entry.key, files, entry.last_use, name=entry.name))
    return out


def _kernel_candidates(folder: Path, wanted: set[str] | None,
                       skipped: list[dict[str, str]]) -> list[_Packed]:
    """jax-triton's kernels (issue 34), each one file, read whole and checked."""
    out = []
    for entry in scan("jax_triton", folder, grace_seconds=3600.0):
        if wanted is not None and entry.key not in wanted:
            continue
        source = entry.source
        assert isinstance(source, kernel_cache.KernelEntry)
        problem, target = entry.problem, None
        if problem is None:
            try:
                data = json.loads(safe_io.read_bounded(source.path, kernel_cache.ENTRY_LIMIT))
                problem = kernel_cache.problem_of(data, entry.key)
                target = data.get("target") if problem is None else None
            except (OSError, ValueError, RecursionError) as exc:
                problem = f"unreadable entry ({exc.__class__.__name__})"
        if problem is not None:
            skipped.append({"kind": "jax_triton", "key": entry.key, "reason": problem})
            continue
        path = Path(source.path)
        out.append(_packed("jax_triton", entry.key, {path.name: path}, entry.last_use, name=entry.name,
                           target=target))
    return out


def _folder_candidates(kind: str, folder: Path, wanted: set[str] | None,
                       skipped: list[dict[str, str]]) -> list[_Packed]:
    """Any other carried kind's key folders, each whole (checked by the kind's scan) with its
    plain files."""
    out = []
    for entry in KINDS[kind].scan(folder, grace_seconds=3600.0, verify_after=0.0):
        if (wanted is not None and entry.key not in wanted) or not KINDS[kind].carried_key(entry.key):
            continue
        if entry.problem is not None or entry.path is None:
            skipped.append({"kind": kind, "key": entry.key, "reason": entry.problem or "no folder"})
            continue
        out.append(_packed(kind, entry.key, _regular_files(Path(entry.path)), entry.last_use,
                           name=entry.name))
    return out


_CANDIDATES = {"jax": _jax_candidates, "triton": _triton_candidates, "autotune": _autotune_candidates,
               "inductor": _inductor_candidates, "jax_triton": _kernel_candidates}


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


def check_kinds(asked: Iterable[str]) -> tuple[str, ...]:
    """The kinds asked for, each once, once each is shown to be carried.

    Raises:
        UsageError: a kind that is not carried.
    """
    chosen = tuple(dict.fromkeys(asked))
    for kind in chosen:
        if kind not in CARRIED:
            raise UsageError(f"cannot carry cache kind {shown(kind)}; kinds: {', '.join(CARRIED)}")
    return chosen


def _stabilised(chosen: list[_Packed]) -> list[_Packed]:
    """The entries with nothing that moves when a job hits them (#32: a registry layer of
    unchanged entries must keep its digest): no last use (unpack stamps its arrival), no JAX
    ``-atime`` file, in the order of their kinds and keys, each one's files by name."""
    out = []
    for item in chosen:
        entry = item.entry
        names = sorted(n for n in item.paths if not (entry.kind == "jax" and n.endswith("-atime")))
        out.append(_Packed(ManifestEntry(entry.kind, entry.key, {n: entry.files[n] for n in names},
                                         {n: entry.sha256[n] for n in names}, 0.0, entry.name,
                                         entry.triton_kind, entry.target, entry.versions),
                           {n: item.paths[n] for n in names}))
    order = {kind: number for number, kind in enumerate(CARRIED)}
    return sorted(out, key=lambda p: (order[p.entry.kind], p.entry.key))


def _stable_manifest(manifest: dict[str, Any], path_in_key: bool | None) -> None:
    """Leave out what differs between two packs of the same entries (the source root only
    where the JAX keys hold it), and say that the pack keeps no times."""
    del manifest["created"], manifest["host"]
    if not path_in_key:
        del manifest["source_root"]
    manifest["times_normalised"] = True


def _kind_candidates(kind: str, root: Path, tier: Path | None, wanted: set[str] | None,
                     skipped: list[dict[str, str]]) -> list[_Packed]:
    """The entries of ``kind`` to pack (of ``wanted`` keys, when given) from the root, and, for
    a tiered kind with ``tier``, those of the local tier that the root lacks; broken ones go to
    ``skipped``."""
    candidates = _CANDIDATES.get(kind) or partial(_folder_candidates, kind)
    found = candidates(KINDS[kind].folder(root), wanted, skipped)
    if tier is None or not KINDS[kind].tiered:
        return found
    known = {p.entry.key for p in found} | {s["key"] for s in skipped if s["kind"] == kind}
    local_skipped: list[dict[str, str]] = []
    found += [p for p in candidates(KINDS[kind].folder(tier), wanted, local_skipped)
              if p.entry.key not in known]
    skipped += [s for s in local_skipped if s["key"] not in known]
    return found


def pack(*, root: Path, archive: Path, kinds: Iterable[str] | None = None, gpu_type: str | None = None,
         workload: str | None = None, matcher: Callable[[Any], bool] | None = None,
         tier: Path | None = None, stable: bool = False) -> PackReport:
    """Write the entries of ``kinds`` (default: every carried kind) under ``root`` into
    ``archive``, with a manifest; with ``tier`` (this node's local tier of the root, issue 23),
    also its entries of tiered kinds that the root lacks (not promoted yet, or a read-only root).
    ``stable``: the same entries give the same bytes (#32; :func:`_stabilised`).

    ``gpu_type``/``matcher`` (for ``workload``): only the entries that the warm and validate
    passes of that GPU type (and that workload) hit or wrote, as their records name them.
    Broken entries are left out (listed in the manifest's ``skipped``).

    Raises:
        UsageError: an unknown kind, no cache at ``root``, no record of the selection, a bad
            archive name.
        OSError: the cache changed while it was packed, or the archive cannot be written.
    """
    from gpu_cache.jobenv.fs import require_folder_or_missing

    chosen_kinds = check_kinds(CARRIED if kinds is None else kinds)
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
    skipped: list[dict[str, str]] = []
    chosen: list[_Packed] = []
    missing: dict[str, int] = {}
    for kind in chosen_kinds:
        wanted = set().union(*(keys_of(r, kind) for r in used)) if selective else None
        if selective and any(dropped(r, kind) for r in used):
            log.warning("some records list only their first keys: a few %s entries of the "
                        "selection may be left out", kind)
        found = _kind_candidates(kind, root, tier, wanted, skipped)
        if wanted is not None:
            missing[kind] = len(wanted - {p.entry.key for p in found}
                                - {s["key"] for s in skipped if s["kind"] == kind})
        chosen += found
    chosen = _stabilised(chosen) if stable else chosen
    entries = [item.entry for item in chosen]
    soft, dev = software_section(entries, used)
    if gpu_type is not None:
        dev["gpu_type"] = gpu_type
    by_kind: dict[str, list[ManifestEntry]] = {kind: [] for kind in chosen_kinds}
    for entry in entries:
        by_kind[entry.kind].append(entry)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gpu_cache_version": __version__,
        "created": time.time(), "host": socket.gethostname(), "source_root": str(root),
        "selection": {"kinds": list(chosen_kinds), "gpu_type": gpu_type, "workload": workload},
        "software": soft["identity"], "software_by_kind": soft["by_kind"],
        "software_source": soft["source"], "jax_path_in_key": soft["jax_path_in_key"],
        "device": dev,
        "kinds": {kind: {"entries": [e.as_json() for e in items], "bytes": sum(e.size for e in items)}
                  for kind, items in by_kind.items()},
        "skipped": skipped,
    }
    if stable:
        _stable_manifest(manifest, soft["jax_path_in_key"])
    if soft["jax_path_in_key"]:
        log.warning("the JAX entries were written by jax %s with XLA caches in the cache folder: "
                    "their keys hold the folder's path, so they hit only at %s",
                    soft["identity"].get("jax"), KINDS["jax"].folder(root))
    for item in skipped:
        log.warning("pack: left out broken %s entry %s: %s", item["kind"], shown(item["key"]), item["reason"])
    total = sum(e.size for e in entries)
    log.info("pack: %d entries, %s, into %s", len(chosen), format_size(total), target)
    _write_archive(target, mode, manifest, chosen, stable)
    return PackReport(str(target), {k: len(v) for k, v in by_kind.items()}, total, skipped, missing,
                      soft["identity"], dev)


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
    lines = [f"packed {sum(report.entries.values())} entries ({counts}; {format_size(report.bytes)}) "
             f"into {report.archive}",
             f"warmed with {software.describe(report.software)}; device "
             f"{report.device.get('gpu_type') or ', '.join(report.device.get('gpu_types') or []) or '?'}"
             + (f"; Triton targets {', '.join(report.device['triton']['targets'])}"
                if report.device.get("triton", {}).get("targets") else "")]
    if report.skipped:
        lines.append(f"left out {len(report.skipped)} broken entries (listed in the manifest)")
    for kind, n in report.missing.items():
        if n:
            lines.append(f"{n} {kind} entries the records name are no longer in the cache")
    return shown_lines(lines)  # the software a record names may be any text
