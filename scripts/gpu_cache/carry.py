"""Carry a warmed cache to another machine, path or image: ``gpu-cache pack`` and ``unpack``.

**The archive** is a tar file (``.tar``, or compressed: ``.tar.gz``/``.tgz``, ``.tar.xz``/``.txz``,
``.tar.bz2``/``.tbz2``), written by :func:`pack` in the POSIX (PAX) format so that file times
keep their fractions of a second. Its first member is :data:`MANIFEST_NAME`, a JSON object
(format :data:`FORMAT`, version :data:`FORMAT_VERSION`) that says what the rest is:

* ``kinds``: per kind (``jax``, ``triton``) its entries, each with ``key``, ``name`` (the
  computation or kernel), ``files`` (file name -> bytes), ``size``, ``last_use`` and, for
  Triton, the ``target`` it was compiled for (``sm_90``, from the kernel's metadata json);
* ``software``: the identity (:func:`gpu_cache.core.software.identity`) of the interpreter that
  warmed the entries: from the stats hook's records of the warm and validate passes that
  wrote or hit them, else the packing interpreter's; ``software_by_kind``: every distinct one
  per kind, newest first;
* ``device``: the GPU type and device name of those passes, and the Triton targets;
* ``selection`` (the kinds, ``--gpu-type``, ``--workload`` asked for), ``skipped`` (broken entries
  left out, with the reason), ``source_root``, ``created``, ``gpu_cache_version``.

Then one regular-file member per file of each entry, entry after entry: ``jax/<key>-cache``
(and ``jax/<key>-atime`` where JAX kept one; older jax: ``jax/<key>``) and
``triton/<key>/<file>``. Nothing else: no folders, links or devices.

**Unpack** reads the manifest first and refuses (:class:`Refused`, exit 1) before it writes
anything: a manifest that does not fit the target it is told (software, GPU type), a member
that is not a regular file or not named by the manifest, a size that differs from the
manifest's, more bytes than the disk holds; a second pass writes. Every entry is written whole:
a JAX file through a temporary file and a rename (with JAX's lock held where the cache has
one), a Triton key folder built in a temporary folder with its group file's absolute paths
rewritten to the new root, then renamed into place. An entry already there with a newer (or
the same) last use is kept; an older or broken one is replaced. Files keep their modification
times, and JAX's ``-atime`` its content, so the least-recently-used order survives.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import json
import logging
import lzma
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpu_cache import __version__
from gpu_cache.config.units import format_size
from gpu_cache.core import hook_records, kinds, safe_io, software
from gpu_cache.core.caches import jax as jax_cache
from gpu_cache.core.caches import triton as triton_cache
from gpu_cache.core.errors import UsageError
from gpu_cache.jobenv import trust

log = logging.getLogger(__name__)

FORMAT = "gpu-cache-archive"
FORMAT_VERSION = 1
MANIFEST_NAME = "gpu-cache-manifest.json"
#: The kinds an archive can carry, and those packed when none is asked for.
CARRIED = ("jax", "triton")
#: Largest manifest unpack reads (about 300 bytes per entry: some 200,000 entries).
MAX_MANIFEST = 64 << 20
#: Largest Triton metadata or group file read (a kernel's are a few KiB).
MAX_SMALL_JSON = 1 << 20
#: Most bytes read from the archive at once (a file's data is read in smaller chunks; a tar
#: header is read whole, and a real one is a few KiB).
MAX_READ = 8 << 20
#: Room left for tar headers per member, and at the end of the archive.
_HEADER_ROOM = 4096
_END_ROOM = 64 << 10
#: Free space kept beyond what unpack writes.
SPACE_MARGIN = 64 << 20
#: The rules of gpu-cache's own passes, whose records say which software warmed which keys
#: (the same as gpu_cache.commands.stats.OWN_RULES).
OWN_RULES = ("warm_cache", "validate_cache")
#: Compute capability of each GPU type name (as :func:`gpu_cache.core.device.gpu_type_of` names
#: them), to tell whether Triton entries built for a target serve a GPU type.
COMPUTE_CAPABILITY = {
    "v100": 70, "t4": 75, "a100": 80, "a800": 80, "a30": 80, "a10": 86, "a16": 86, "a40": 86,
    "rtxa6000": 86, "rtx3090": 86, "rtx3080": 86, "l4": 89, "l40": 89, "l40s": 89, "rtx4090": 89,
    "h100": 90, "h200": 90, "h800": 90, "h20": 90, "gh200": 90, "b100": 100, "b200": 100,
    "gb200": 100, "b300": 103, "rtx5090": 120,
}
_WRITE_MODES = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.xz": "w:xz", ".txz": "w:xz",
                ".tar.bz2": "w:bz2", ".tbz2": "w:bz2"}
_PROGRESS_SECONDS = 5.0
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A JAX entry's file names: ``<key>-cache``, ``<key>-atime`` or (older jax) ``<key>``.
_JAX_KEY_RE = re.compile(r"^[^/\x00]+-[0-9a-f]{64}$")


class Refused(Exception):
    """Unpack will not write this archive here (a mismatch, an unsafe member, no room): one
    line for the user, exit code 1. Nothing has been written."""


# --- small helpers -----------------------------------------------------------------------


def _plain_name(name: Any) -> bool:
    """A single, visible path component that a file of an entry may have."""
    return (isinstance(name, str) and 0 < len(name.encode("utf-8", "surrogateescape")) <= 255
            and "/" not in name and "\x00" not in name and not name.startswith(".")
            and name not in (".", ".."))


def _shown(name: str) -> str:
    """A member name as a message shows it: escaped, and cut when long."""
    text = ascii(name)
    return text if len(text) <= 120 else text[:117] + "...'"


def _minor(version: Any) -> str | None:
    """``3.11`` from ``3.11.7``."""
    return ".".join(str(version).split(".")[:2]) if version else None


def _version_tuple(version: Any) -> tuple[int, ...]:
    parts = []
    for piece in str(version or "").split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def _target_of(metadata: Mapping[str, Any]) -> str | None:
    """``sm_90`` from a Triton kernel's metadata (``target: {backend: cuda, arch: 90}``)."""
    target = metadata.get("target")
    if not isinstance(target, dict):
        return None
    backend, arch = target.get("backend"), target.get("arch")
    if backend == "cuda" and isinstance(arch, int):
        return f"sm_{arch}"
    return f"{backend}:{arch}" if backend and arch is not None else None


def target_of_gpu_type(gpu_type: str) -> str | None:
    """The Triton target of a GPU type (``h200`` -> ``sm_90``); a type written as a target
    (``sm_90``) is itself; None when unknown."""
    if re.fullmatch(r"sm_\d{2,3}", gpu_type):
        return gpu_type
    capability = COMPUTE_CAPABILITY.get(gpu_type)
    return f"sm_{capability}" if capability else None


class _Progress:
    """A log line every few seconds while a long loop runs."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total = what, total
        self.next = time.monotonic() + _PROGRESS_SECONDS

    def step(self, done: int, size: int) -> None:
        if time.monotonic() >= self.next:
            log.info("%s: %d/%d entries, %s", self.what, done, self.total, format_size(size))
            self.next = time.monotonic() + _PROGRESS_SECONDS


# --- which entries: the records of warm and validate passes -------------------------------


def _keys_of(record: Mapping[str, Any], kind: str) -> set[str]:
    """The keys a record's process hit or wrote for one kind."""
    section = hook_records.part(dict(record), kind)
    if section is None:
        return set()
    found = {k for k in section.get("hit_keys") or [] if isinstance(k, str)}
    found |= {m["key"] for m in section.get("missed") or []
              if isinstance(m, dict) and isinstance(m.get("key"), str)}
    return found


def _dropped(record: Mapping[str, Any], kind: str) -> bool:
    section = hook_records.part(dict(record), kind) or {}
    dropped = section.get("dropped")
    return isinstance(dropped, dict) and any(hook_records.count(v) for k, v in dropped.items()
                                             if k in ("hit_keys", "missed"))


def workload_matcher(settings: Any, name: str) -> Callable[[Any], bool]:
    """Whether a record's process ran workload ``name``: its script (``argv[0]``, which the
    record keeps) is the built-in workload's module file, or a script or ``-m`` module the
    workload's command names. A ``python -c`` workload cannot be told apart.

    Raises:
        UsageError: no such workload.
    """
    from gpu_cache.commands.workload import BUILTINS, resolve_workload

    workload = resolve_workload(settings, name)
    if workload.builtin:
        module = BUILTINS[name][0]
        suffix = "/" + module.replace(".", "/") + ".py"
        return lambda argv: bool(argv) and isinstance(argv, list) and isinstance(argv[0], str) \
            and argv[0].endswith(suffix)
    try:
        tokens = shlex.split(workload.command.replace("{", "").replace("}", ""))
    except ValueError:
        tokens = workload.command.split()
    modules = [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "-m"]
    scripts = {t for t in tokens if t.endswith(".py")}
    script_names = {os.path.basename(t) for t in scripts}

    def matches(argv: Any) -> bool:
        if not argv or not isinstance(argv, list) or not isinstance(argv[0], str) \
                or argv[0] in ("", "-c", "-"):
            return False
        first = argv[0]
        if first in scripts or os.path.basename(first) in script_names:
            return True
        return any(first.endswith("/" + m.replace(".", "/") + ending)
                   for m in modules for ending in (".py", "/__main__.py"))

    return matches


def _own_records(root: Path, gpu_type: str | None,
                 matcher: Callable[[Any], bool] | None) -> list[dict[str, Any]]:
    """The records of warm and validate passes (of one GPU type, of one workload), oldest first."""
    found = []
    for record in hook_records.read(hook_records.records_dir(root)):
        if record.get("rule") not in OWN_RULES:
            continue
        if gpu_type is not None and record.get("gpu_type") != gpu_type:
            continue
        if matcher is not None and not matcher(record.get("argv")):
            continue
        found.append(record)
    return sorted(found, key=lambda r: r["time"])


def _relevant(kind: str, identity: Mapping[str, Any]) -> tuple[Any, ...]:
    """The parts of a software identity that a kind's keys depend on."""
    if kind == "jax":  # jaxlib is in the key; the compression (zstandard or zlib) too
        return (identity.get("jax"), identity.get("jaxlib"), bool(identity.get("zstandard")))
    return (identity.get("triton"), _minor(identity.get("python")))  # the wheel's build and ABI


def describe_for(kind: str, identity: Mapping[str, Any]) -> str:
    """The software a kind's keys depend on, in words: ``jax 0.10.2 (jaxlib 0.10.2, zstd)``."""
    if kind == "jax":
        if not identity.get("jax"):
            return f"no jax (Python {identity.get('python') or '?'})"
        compression = "zstd" if identity.get("zstandard") else "zlib"
        return f"jax {identity['jax']} (jaxlib {identity.get('jaxlib') or '?'}, {compression})"
    if not identity.get("triton"):
        return f"no triton (Python {identity.get('python') or '?'})"
    return f"triton {identity['triton']} on Python {_minor(identity.get('python'))}"


# --- pack ------------------------------------------------------------------------------------


@dataclass
class _Packed:
    """One entry chosen for the archive: its manifest record and the files to add."""

    kind: str
    record: dict[str, Any]
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


def _regular_files(folder: Path) -> dict[str, Path]:
    """The regular files directly in ``folder`` (a writer's temporary folder is not part of
    the entry)."""
    out = {}
    with os.scandir(folder) as listing:
        for item in listing:
            if item.is_file(follow_symlinks=False) and _plain_name(item.name):
                out[item.name] = Path(item.path)
    return out


def _jax_candidates(folder: Path, wanted: set[str] | None,
                    skipped: list[dict[str, str]]) -> list[_Packed]:
    entries = [e for e in kinds.scan("jax", folder, grace_seconds=3600.0) if e.name != "(temporary)"]
    if wanted is not None:
        entries = [e for e in entries if e.key in wanted]
    out = []
    progress = _Progress("pack: checking JAX entries", len(entries))
    for number, entry in enumerate(entries, 1):
        source = entry.source
        assert isinstance(source, jax_cache.JaxEntry)
        problem = entry.problem
        if problem is None and source.cache_path is not None:
            problem = jax_cache.undecompressable(source.cache_path)  # truncated, a bomb
        progress.step(number, 0)
        if problem is not None or source.cache_path is None:
            skipped.append({"kind": "jax", "key": entry.key, "reason": problem or "no -cache file"})
            continue
        paths = {p.name: p for p in (source.cache_path, source.atime_path) if p is not None}
        sizes = {}
        for name, path in paths.items():
            info = os.lstat(path)
            sizes[name] = info.st_size
        out.append(_Packed("jax", {"key": entry.key, "name": entry.name, "files": sizes,
                                   "size": sum(sizes.values()), "last_use": entry.last_use}, paths))
    return out


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
        record: dict[str, Any] = {"key": source.key, "name": source.kernel, "kind": source.kind,
                                  "files": {n: os.lstat(p).st_size for n, p in files.items()},
                                  "last_use": source.mtime, "target": None}
        record["size"] = sum(record["files"].values())
        if source.kernel and f"{source.kernel}.json" in files:
            try:
                metadata = json.loads(safe_io.read_bounded(files[f"{source.kernel}.json"], MAX_SMALL_JSON))
                record["target"] = _target_of(metadata) if isinstance(metadata, dict) else None
            except (OSError, ValueError):
                pass
        out.append(_Packed("triton", record, files))
    return out


def _software_section(chosen: list[_Packed],
                      used: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(software, device) of the manifest, from the records that name the packed keys."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    sources: dict[str, str] = {}
    gpu_types: dict[str, set[str]] = {}
    jax_device: dict[str, set[Any]] = {"platforms": set(), "device_kinds": set(), "device_counts": set()}
    xla_caches: set[Any] = set()
    keys: dict[str, set[str]] = {}
    for item in chosen:
        keys.setdefault(item.kind, set()).add(item.record["key"])
    for kind, packed in keys.items():
        naming = [r for r in used if _keys_of(r, kind) & packed]
        identities: list[dict[str, Any]] = []
        for record in reversed(naming):  # newest first
            identity = record.get("software")
            if isinstance(identity, dict) and all(_relevant(kind, identity) != _relevant(kind, i)
                                                  for i in identities):
                identities.append(identity)
            gpu_types.setdefault(kind, set()).add(record.get("gpu_type") or "?")
            if kind == "jax":
                dev = record.get("device") or {}
                jax_device["platforms"].add(dev.get("platform"))
                found = dev.get("kinds") if isinstance(dev.get("kinds"), list) else []
                jax_device["device_kinds"].update(k for k in found if isinstance(k, str))
                jax_device["device_counts"].add(dev.get("count"))
                xla_caches.add((record.get("env") or {}).get("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"))
        if identities:
            by_kind[kind], sources[kind] = identities, "records of warm and validate passes"
        else:
            by_kind[kind] = [software.identity()]
            sources[kind] = "packing interpreter (no record names these entries)"
    newest = next((ids[0] for ids in by_kind.values() if ids), software.identity())
    path_in_key = None
    if "jax" in by_kind:
        old = _version_tuple(by_kind["jax"][0].get("jax"))
        if xla_caches:  # unknown without records
            path_in_key = bool(old) and old < (0, 11) and bool(xla_caches - {"none"})
    soft = {"identity": newest, "by_kind": by_kind, "source": sources,
            "jax_path_in_key": path_in_key}
    all_types = sorted(set().union(*gpu_types.values())) if gpu_types else []
    device_kinds = sorted(jax_device["device_kinds"])
    dev = {
        "gpu_type": all_types[0] if len(all_types) == 1 else None,
        "gpu_types": all_types,
        "name": ", ".join(device_kinds) or None,
        "jax": {"gpu_types": sorted(gpu_types.get("jax", set())),
                "platforms": sorted(p for p in jax_device["platforms"] if isinstance(p, str)),
                "device_kinds": device_kinds,
                "device_counts": sorted(c for c in jax_device["device_counts"] if isinstance(c, int))},
        "triton": {"gpu_types": sorted(gpu_types.get("triton", set())),
                   "targets": sorted({i.record["target"] for i in chosen
                                      if i.kind == "triton" and i.record.get("target")})},
    }
    return soft, dev


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


def pack(root: Path, archive: Path, kinds_asked: Iterable[str] = CARRIED, gpu_type: str | None = None,
         workload: str | None = None, matcher: Callable[[Any], bool] | None = None) -> PackReport:
    """Write the entries of ``kinds_asked`` under ``root`` into ``archive``, with a manifest.

    ``gpu_type``/``matcher`` (for ``workload``): only the entries that the warm and validate
    passes of that GPU type (and that workload) hit or wrote, as their records name them.
    Broken entries are left out (listed in the manifest's ``skipped``).

    Raises:
        UsageError: an unknown kind, no cache at ``root``, no record of the selection, a bad
            archive name.
        OSError: the cache changed while it was packed, or the archive cannot be written.
    """
    from gpu_cache.jobenv.fs import require_folder_or_missing

    chosen_kinds = tuple(dict.fromkeys(kinds_asked))
    for kind in chosen_kinds:
        if kind not in CARRIED:
            raise UsageError(f"cannot carry cache kind {kind!r}; kinds: {', '.join(CARRIED)}")
    mode = _archive_mode(archive)
    target = _archive_target(archive)
    require_folder_or_missing(root)
    if not root.is_dir():
        raise UsageError(f"no cache at {root} (pass the cache root with --cache-root)")
    selective = gpu_type is not None or matcher is not None
    used = _own_records(root, gpu_type, matcher)
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
        wanted = set().union(*(_keys_of(r, kind) for r in used)) if selective else None
        if selective and any(_dropped(r, kind) for r in used):
            log.warning("some records list only their first keys: a few %s entries of the "
                        "selection may be left out", kind)
        folder = kinds.KINDS[kind].folder(root)
        found = (_jax_candidates if kind == "jax" else _triton_candidates)(folder, wanted, skipped)
        if wanted is not None:
            missing[kind] = len(wanted - {p.record["key"] for p in found}
                                - {s["key"] for s in skipped if s["kind"] == kind})
        chosen += found
    soft, dev = _software_section(chosen, used)
    if gpu_type is not None:
        dev["gpu_type"] = gpu_type
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in chosen_kinds}
    for item in chosen:
        by_kind[item.kind].append(item.record)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gpu_cache_version": __version__,
        "created": time.time(), "host": socket.gethostname(), "source_root": str(root),
        "selection": {"kinds": list(chosen_kinds), "gpu_type": gpu_type, "workload": workload},
        "software": soft["identity"], "software_by_kind": soft["by_kind"],
        "software_source": soft["source"], "jax_path_in_key": soft["jax_path_in_key"],
        "device": dev,
        "kinds": {kind: {"entries": entries, "bytes": sum(e["size"] for e in entries)}
                  for kind, entries in by_kind.items()},
        "skipped": skipped,
    }
    if soft["jax_path_in_key"]:
        log.warning("the JAX entries were written by jax %s with XLA caches in the cache folder: "
                    "their keys hold the folder's path, so they hit only at %s",
                    soft["identity"].get("jax"), kinds.KINDS["jax"].folder(root))
    for item in skipped:
        log.warning("pack: left out broken %s entry %s: %s", item["kind"], item["key"], item["reason"])
    total = sum(item.record["size"] for item in chosen)
    log.info("pack: %d entries, %s, into %s", len(chosen), format_size(total), target)
    _write_archive(target, mode, manifest, chosen)
    return PackReport(str(target), {k: len(v) for k, v in by_kind.items()}, total, skipped, missing,
                      soft["identity"], dev)


def _tar_info(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, mtime, 0o644, tarfile.REGTYPE
    return info


def _write_archive(target: Path, mode: str, manifest: dict[str, Any], chosen: list[_Packed]) -> None:
    """Stream the archive into a temporary file beside ``target``, then rename it there: a
    reader never sees half an archive.

    Raises:
        OSError: a file of an entry changed or vanished meanwhile, or writing failed.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(safe_io.temp_name(target.name))
    fd = os.open(temp, _CREATE_FLAGS, 0o644)
    try:
        with os.fdopen(fd, "wb") as raw, \
                tarfile.open(fileobj=raw, mode=mode, format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            data = json.dumps(manifest, indent=1, default=str).encode()
            tar.addfile(_tar_info(MANIFEST_NAME, len(data), time.time()), io.BytesIO(data))
            progress = _Progress("pack: writing", len(chosen))
            written = 0
            for number, item in enumerate(chosen, 1):
                for name, path in item.paths.items():
                    _add_file(tar, f"{item.kind}/{name}" if item.kind == "jax"
                              else f"triton/{item.record['key']}/{name}", path, item.record["files"][name])
                written += item.record["size"]
                progress.step(number, written)
        os.replace(temp, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(temp)
        raise


def _add_file(tar: tarfile.TarFile, member: str, path: Path, size: int) -> None:
    with safe_io.open_regular(path) as fd:
        info = os.fstat(fd)
        if info.st_size != size:
            raise OSError(errno.EAGAIN, "changed while it was packed; pack again", str(path))
        with os.fdopen(os.dup(fd), "rb") as stream:
            tar.addfile(_tar_info(member, size, info.st_mtime), stream)


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
    return "\n".join(lines) + "\n"


# --- reading an archive safely -----------------------------------------------------------------


class _Budget(io.RawIOBase):
    """A read-only view of a (decompressed) stream that refuses to go past ``limit`` bytes: a
    tar header that claims gigabytes (a PAX header bomb), or a seek past what the manifest
    announced, raises :class:`Refused` before it is read."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__()
        self.stream, self.limit = stream, limit

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _check(self, end: int) -> None:
        if end > self.limit:
            raise Refused("the archive holds more than its manifest announces (a tar header or "
                          "member past the end); refused, nothing written")

    def read(self, size: int | None = -1) -> bytes:
        position = self.stream.tell()
        if size is None or size < 0:
            size = self.limit - position
        if size > MAX_READ:  # tarfile reads a PAX or GNU long-name header whole
            raise Refused(f"the archive has a tar header of {size} bytes (a header bomb?); refused, "
                          "nothing written")
        self._check(position + size)
        return self.stream.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == os.SEEK_SET:
            self._check(offset)
        elif whence == os.SEEK_CUR:
            self._check(self.stream.tell() + offset)
        else:
            raise io.UnsupportedOperation("seek from the end")
        return self.stream.seek(offset, whence)

    def tell(self) -> int:
        return self.stream.tell()


@contextmanager
def _decompressed(archive: Path) -> Iterator[IO[bytes]]:
    """The archive's tar stream, decompressed by its magic bytes (never by its name); a
    symbolic link the user names is followed.

    Raises:
        UsageError: it cannot be opened, or is not a regular file.
    """
    try:
        raw = open(os.path.realpath(archive), "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise UsageError(f"cannot read archive {archive}: {exc.strerror or exc}") from None
    with raw:
        mode = os.fstat(raw.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"archive {archive} is {safe_io.describe(mode)}, not a file")
        head = raw.read(6)
        raw.seek(0)
        if head.startswith(b"\x1f\x8b"):
            stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb")
        elif head.startswith(b"BZh"):
            stream = bz2.BZ2File(raw)
        elif head.startswith(b"\xfd7zXZ\x00"):
            stream = lzma.LZMAFile(raw)  # noqa: SIM115 - closed below
        else:
            stream = raw
        with stream:
            yield stream


def _manifest_entries(manifest: Any) -> dict[str, list[dict[str, Any]]]:
    """The entries per kind of a manifest, checked: every key and file name is one an entry
    of that kind can have.

    Raises:
        UsageError: it is not a gpu-cache manifest this version can read.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UsageError("not a gpu-cache archive (no gpu-cache manifest first in it)")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UsageError(f"the archive's format version {version!r} is newer than this gpu-cache "
                         f"reads ({FORMAT_VERSION}); update gpu-cache")
    section = manifest.get("kinds")
    if not isinstance(section, dict):
        raise UsageError("the archive's manifest has no kinds")
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, part in section.items():
        if kind not in CARRIED or not isinstance(part, dict) or not isinstance(part.get("entries"), list):
            raise UsageError(f"the archive's manifest names an unknown kind {_shown(str(kind))}")
        entries = []
        for entry in part["entries"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict) or not entry["files"]:
                raise Refused("the archive's manifest has an entry without files; refused, nothing written")
            key = entry.get("key")
            files = entry["files"]
            good_key = isinstance(key, str) and (_JAX_KEY_RE.match(key) if kind == "jax"
                                                 else triton_cache.KEY_RE.match(key))
            good_files = all(_plain_name(n) and isinstance(s, int) and not isinstance(s, bool) and s >= 0
                             for n, s in files.items())
            if kind == "jax" and good_key:  # the executable, and its last use where JAX kept one
                good_files = good_files and set(files) <= {f"{key}-cache", f"{key}-atime", key} \
                    and bool({f"{key}-cache", key} & set(files))
            if kind == "triton" and good_files:
                good_files = not any(n.startswith("tmp.") for n in files)
            if not good_key or not good_files:
                raise Refused(f"the archive's manifest names an unsafe {kind} entry "
                              f"{_shown(str(key))}; refused, nothing written")
            last_use = entry.get("last_use")
            entry["last_use"] = (min(float(last_use), time.time())
                                 if isinstance(last_use, (int, float)) and last_use == last_use
                                 and last_use >= 0 else 0.0)
            entry["size"] = sum(files.values())  # what is written, whatever the manifest says
            entries.append(entry)
        out[kind] = entries
    return out


def _member_name(kind: str, entry: Mapping[str, Any], file_name: str) -> str:
    return f"jax/{file_name}" if kind == "jax" else f"triton/{entry['key']}/{file_name}"


@dataclass
class _Expected:
    """What each member of the archive must be, from the manifest."""

    by_member: dict[str, tuple[str, dict[str, Any], str, int]]  # name -> (kind, entry, file, size)
    total: int


def _expected(entries: Mapping[str, list[dict[str, Any]]]) -> _Expected:
    by_member = {}
    total = 0
    for kind, items in entries.items():
        for entry in items:
            for file_name, size in entry["files"].items():
                name = _member_name(kind, entry, file_name)
                if name in by_member:
                    raise Refused(f"the archive's manifest names {_shown(name)} twice; refused, "
                                  "nothing written")
                by_member[name] = (kind, entry, file_name, size)
                total += size
    return _Expected(by_member, total)


def _check_member(member: tarfile.TarInfo, expected: _Expected, seen: set[str],
                  root: Path) -> tuple[str, dict[str, Any], str]:
    """The (kind, entry, file name) a member holds, once it is shown to be safe.

    Raises:
        Refused: anything but a regular file that the manifest names, with its size.
    """
    name = member.name
    spec = expected.by_member.get(name)
    if not member.isreg() or member.issparse():
        what = ("a symbolic link" if member.issym() else "a hard link" if member.islnk()
                else "a device" if member.ischr() or member.isblk() else "a FIFO" if member.isfifo()
                else "a folder" if member.isdir() else "not a regular file")
        raise Refused(f"archive member {_shown(name)} is {what}; refused, nothing written")
    if spec is None:
        raise Refused(f"archive member {_shown(name)} is not named by the archive's manifest "
                      "(an absolute path, `..`, or a file of no entry); refused, nothing written")
    if name in seen:
        raise Refused(f"archive member {_shown(name)} comes twice; refused, nothing written")
    if member.size != spec[3]:
        raise Refused(f"archive member {_shown(name)} holds {member.size} bytes, its manifest says "
                      f"{spec[3]}; refused, nothing written")
    data_filter = getattr(tarfile, "data_filter", None)  # Python 3.12, and 3.11.4+
    if data_filter is not None:
        try:
            data_filter(member, str(root))
        except tarfile.FilterError as exc:
            raise Refused(f"archive member {_shown(name)}: {exc}; refused, nothing written") from None
    seen.add(name)
    return spec[0], spec[1], spec[2]


@dataclass
class _Archive:
    """An archive opened for reading: its manifest, its checked entries per kind, and what
    each member must be."""

    manifest: dict[str, Any]
    entries: dict[str, list[dict[str, Any]]]
    expected: _Expected
    _stream: IO[bytes]
    _budget: _Budget
    _manifest_size: int

    def members(self, root: Path) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile, str,
                                                    dict[str, Any], str]]:
        """Each member after the manifest, from the start of the archive, once it is shown to
        be safe: ``(member, tar, kind, entry, file name)``. The files of one entry must come
        together, as pack writes them.

        Raises:
            Refused: an unsafe member, a damaged archive, or a member the manifest names is
                missing.
        """
        self._stream.seek(0)
        try:
            # not closed: closing a TarFile on a stream it did not open only marks it closed
            tar = tarfile.open(fileobj=self._budget, mode="r:")  # noqa: SIM115
            first = tar.next()
            if first is None or first.name != MANIFEST_NAME or first.size != self._manifest_size:
                raise Refused("the archive changed while it was read; refused")
            seen: set[str] = set()
            done: set[int] = set()
            current: int | None = None
            while (member := tar.next()) is not None:
                kind, entry, file_name = _check_member(member, self.expected, seen, root)
                if id(entry) != current:
                    if id(entry) in done:
                        raise Refused(f"archive member {_shown(member.name)}: the files of one entry "
                                      "are not together, as `gpu-cache pack` writes them; refused")
                    if current is not None:
                        done.add(current)
                    current = id(entry)
                yield member, tar, kind, entry, file_name
        except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise Refused(f"the archive is damaged ({exc}); refused, nothing written") from None
        except OSError as exc:  # gzip.BadGzipFile, bz2's invalid data stream
            raise Refused(f"the archive is damaged ({exc.strerror or exc}); refused, nothing "
                          "written") from None
        if len(seen) != len(self.expected.by_member):
            missing = next(n for n in self.expected.by_member if n not in seen)
            raise Refused(f"the archive lacks {_shown(missing)}, which its manifest names "
                          "(truncated?); refused, nothing written")


@contextmanager
def _open_archive(archive: Path) -> Iterator[_Archive]:
    """The archive, opened, with its manifest read and checked.

    Raises:
        UsageError: not a readable gpu-cache archive.
        Refused: its manifest names unsafe entries.
    """
    with _decompressed(archive) as stream:
        budget = _Budget(stream, MAX_MANIFEST + _END_ROOM)
        try:
            tar = tarfile.open(fileobj=budget, mode="r:")  # noqa: SIM115 - as in _Archive.members
            first = tar.next()
            if first is None or first.name != MANIFEST_NAME or not first.isreg() \
                    or first.size > MAX_MANIFEST:
                raise UsageError(f"{archive} is not a gpu-cache archive (its first member is not "
                                 f"{MANIFEST_NAME}); make one with `gpu-cache pack`")
            reader = tar.extractfile(first)
            assert reader is not None
            text = b"".join(iter(lambda: reader.read(safe_io.CHUNK), b""))
        except tarfile.TarError as exc:
            raise UsageError(f"{archive} is not a gpu-cache archive: not a tar file ({exc})") from None
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise UsageError(f"cannot read archive {archive}: {exc}") from None
        try:
            manifest = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"{archive}: its manifest is not JSON ({exc})") from None
        entries = _manifest_entries(manifest)
        expected = _expected(entries)
        budget.limit = (budget.tell() + first.size + expected.total + _END_ROOM
                        + _HEADER_ROOM * (len(expected.by_member) + 1))
        yield _Archive(manifest, entries, expected, stream, budget, first.size)


# --- which target the archive must fit ----------------------------------------------------------


def _identity_code() -> str:
    """Python source that prints the identity of whatever interpreter runs it (gpu_cache's
    software module is standard library only and Python 3.9 compatible)."""
    source = Path(software.__file__).read_text()
    return source + "\nimport json as _json\nprint(_json.dumps(identity()))\n"


def target_software(python: str | None = None, image: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """The identity of the software the entries are for, and that target in words: a named
    Python (run to ask it), an image (run with ``apptainer``/``singularity exec`` where one is
    installed; else None: only its name can be compared), or this interpreter.

    Raises:
        UsageError: the named Python or image cannot be run.
    """
    if python is None and image is None:
        return software.identity(), f"this interpreter ({sys.executable})"
    if python is not None:
        argv, where = [python, "-c", _identity_code()], python
    else:
        assert image is not None
        runner = shutil.which("apptainer") or shutil.which("singularity")
        if runner is None:
            return None, f"image {image}"
        argv, where = [runner, "exec", image, "python3", "-c", _identity_code()], f"image {image}"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"cannot run {where} to learn its software: {exc}") from None
    lines = proc.stdout.strip().splitlines()
    try:
        identity = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except ValueError:
        identity = None
    if not isinstance(identity, dict):
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise UsageError(f"cannot learn the software of {where}: {why}")
    return identity, where


def fit_problems(manifest: Mapping[str, Any], present: Iterable[str], target: dict[str, Any] | None,
                 target_words: str, image: str | None, gpu_type: str | None) -> tuple[list[str], list[str]]:
    """(mismatches, notes): why the entries of the ``present`` kinds would not serve the
    target, and what could not be checked."""
    problems: list[str] = []
    notes: list[str] = []
    by_kind = manifest.get("software_by_kind") if isinstance(manifest.get("software_by_kind"), dict) else {}
    device = manifest.get("device") if isinstance(manifest.get("device"), dict) else {}
    for kind in present:
        warmed = [i for i in by_kind.get(kind) or [] if isinstance(i, dict)]
        if not warmed:
            notes.append(f"the archive does not say which software made its {kind} entries")
        elif target is not None:
            if all(_relevant(kind, w) != _relevant(kind, target) for w in warmed):
                problems.append(f"its {kind} entries were made with {describe_for(kind, warmed[0])}, "
                                f"{target_words} has {describe_for(kind, target)}")
        else:  # an image that cannot be run here: compare its name
            images = {str(w.get("image")) for w in warmed if w.get("image")}
            if not any(image == i or os.path.basename(str(image)) == os.path.basename(i) for i in images):
                made_in = ", ".join(sorted(images)) or "no image (the host)"
                problems.append(f"its {kind} entries were made in {made_in}, not {image} (no "
                                "apptainer here to run the image and compare its software)")
        if gpu_type is None:
            continue
        section = device.get(kind) if isinstance(device.get(kind), dict) else {}
        if kind == "jax":
            types = [t for t in section.get("gpu_types") or [] if isinstance(t, str)]
            if not types:
                notes.append("the archive does not say which device its jax entries were compiled for")
            elif gpu_type not in types:
                problems.append(f"its jax entries were compiled on {', '.join(types)}, not {gpu_type} "
                                "(JAX keys hold the device; --kind triton unpacks only the Triton entries)")
        else:
            targets = [t for t in section.get("targets") or [] if isinstance(t, str)]
            wanted = target_of_gpu_type(gpu_type)
            if not targets:
                notes.append("the archive does not say which GPU its triton entries target")
            elif wanted is None:
                if gpu_type not in (section.get("gpu_types") or []):
                    notes.append(f"the compute capability of GPU type {gpu_type} is unknown here: "
                                 f"Triton targets {', '.join(targets)} not checked")
            elif wanted not in targets:
                problems.append(f"its triton entries target {', '.join(targets)}, not {wanted} ({gpu_type})")
    return problems, notes


# --- unpack ---------------------------------------------------------------------------------------


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

    def as_dict(self) -> dict[str, Any]:
        return {"archive": self.archive, "cache_root": self.cache_root, "dry_run": self.dry_run,
                "written": self.written, "replaced": self.replaced, "kept_newer": self.kept,
                "bytes": self.bytes, "checked": self.checked, "notes": self.notes,
                "forced_past": self.forced}


def render_unpack(report: UnpackReport) -> str:
    verb = "would unpack" if report.dry_run else "unpacked"
    parts = [f"{kind}: {report.written.get(kind, 0)} new, {report.replaced.get(kind, 0)} replaced, "
             f"{report.kept.get(kind, 0)} kept (newer here)" for kind in report.written]
    lines = [f"{verb} {report.archive} into {report.cache_root} ({format_size(report.bytes)}): "
             + "; ".join(parts)]
    lines += [f"forced past: {line}" for line in report.forced]
    return "\n".join(lines) + "\n"


def _existing(kind: str, folder: Path) -> dict[str, Any]:
    try:
        return {e.key: e for e in kinds.scan(kind, folder, grace_seconds=3600.0)
                if e.name not in ("(temporary)", "(trash)", "(symbolic link)")}
    except OSError:
        return {}


def _plan(entries: Mapping[str, list[dict[str, Any]]], root: Path) -> dict[int, str]:
    """Per entry (by id): ``write`` (absent here), ``replace`` (older or broken here) or
    ``keep`` (as new or newer here)."""
    actions: dict[int, str] = {}
    for kind, items in entries.items():
        here = _existing(kind, kinds.KINDS[kind].folder(root))
        for entry in items:
            old = here.get(entry["key"])
            if old is None:
                actions[id(entry)] = "write"
            elif old.problem is None and old.last_use >= entry["last_use"]:
                actions[id(entry)] = "keep"
            else:
                actions[id(entry)] = "replace"
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


def _kind_folder_fd(root: Path, kind: str, shared_group: str | None) -> int:
    """A descriptor of the kind's folder under ``root``, made when missing: a real folder,
    never a symbolic link (which would lead the writes outside the root), and trusted.

    Raises:
        Refused: it is a link, not a folder, or not trusted.
    """
    folder = kinds.KINDS[kind].folder(root)
    trust.make_folder(folder, shared_group)
    why = trust.distrust(folder, shared_group, trusted_above=root)
    if why:
        raise Refused(f"{why}; refused, nothing written")
    try:
        return os.open(folder, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{folder} is not a real folder (a symbolic link?); unpack writes only into "
                          "real folders under the cache root; refused, nothing written") from None
        raise


def _copy(source: IO[bytes], fd: int, size: int) -> None:
    left = size
    while left:
        chunk = source.read(min(safe_io.CHUNK, left))
        if not chunk:
            raise Refused("the archive ended inside a member (truncated?)")
        safe_io._write_all(fd, chunk)
        left -= len(chunk)


def _mtime(member: tarfile.TarInfo) -> float:
    value = member.mtime
    now = time.time()
    return min(float(value), now) if isinstance(value, (int, float)) and value >= 0 else now


def _is_group(file_name: str) -> bool:
    return file_name.startswith(triton_cache.GROUP_PREFIX) and file_name.endswith(".json")


def _checked_group(entry: Mapping[str, Any], name: str, data: bytes) -> dict[str, Any]:
    """A Triton group file's JSON, once it is shown to list only files of its entry.

    Raises:
        Refused: it is not such a group file.
    """
    try:
        if len(data) > MAX_SMALL_JSON:
            raise ValueError(f"{len(data)} bytes")
        group = json.loads(data)
        children = group["child_paths"]
        if not isinstance(children, dict):
            raise TypeError("child_paths is not a mapping")
        for child in children:
            if not _plain_name(child) or child not in entry["files"] or _is_group(child):
                raise ValueError(f"it names {_shown(str(child))}, no file of the entry")
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise Refused(f"triton entry {entry['key']}: its group file {_shown(name)} is not Triton's "
                      f"({exc}); refused, nothing written") from None
    return group


class _Writer:
    """Writes one entry whole; ``pending``: its files still to come."""

    def __init__(self, folder: Path, dir_fd: int, entry: dict[str, Any]) -> None:
        self.folder, self.dir_fd, self.entry = folder, dir_fd, entry
        self.pending = set(entry["files"])

    def add(self, file_name: str, source: IO[bytes], member: tarfile.TarInfo) -> None:
        raise NotImplementedError

    def finish(self) -> bool:
        """Put the entry in place; False when a newer one appeared there meanwhile (kept)."""
        raise NotImplementedError

    def abandon(self) -> None:
        """Remove what this writer left behind (nothing once it has finished)."""


class _JaxWriter(_Writer):
    """Each file into a temporary file beside its name, then all renamed into place
    (``-cache`` before ``-atime``) under JAX's lock where the cache has one."""

    def __init__(self, folder: Path, dir_fd: int, entry: dict[str, Any], capped: bool) -> None:
        super().__init__(folder, dir_fd, entry)
        self.capped = capped
        self.temps: dict[str, str] = {}

    def _temp(self, file_name: str, fill: Callable[[int], None], mtime: float) -> None:
        temp = safe_io.temp_name(file_name)
        fd = os.open(temp, _CREATE_FLAGS, 0o666, dir_fd=self.dir_fd)
        self.temps[file_name] = temp
        try:
            fill(fd)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def add(self, file_name: str, source: IO[bytes], member: tarfile.TarInfo) -> None:
        self._temp(file_name, lambda fd: _copy(source, fd, member.size), _mtime(member))
        self.pending.discard(file_name)

    def _newer_here(self) -> bool:
        """A whole entry of this key that a process wrote or used since the plan was made."""
        for name in (f"{self.entry['key']}-cache", self.entry["key"]):
            try:
                info = os.lstat(name, dir_fd=self.dir_fd)
            except FileNotFoundError:
                continue
            return stat.S_ISREG(info.st_mode) and info.st_size > 0 and info.st_mtime >= self.entry["last_use"]
        return False

    def finish(self) -> bool:
        key, last_use = self.entry["key"], self.entry["last_use"]
        if self.capped and f"{key}-cache" in self.temps and f"{key}-atime" not in self.temps:
            # A capped JAX reads every -atime when it evicts: give the entry one (its last use).
            self._temp(f"{key}-atime",
                       lambda fd: safe_io._write_all(fd, int(last_use * 1e9).to_bytes(8, "little")),
                       last_use)
        with safe_io.exclusive_lock(self.folder / jax_cache.LOCK_NAME, timeout=60, create=False):
            if self._newer_here():
                return False
            for name in sorted(self.temps, key=lambda n: n.endswith("-atime")):
                os.replace(self.temps[name], name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                del self.temps[name]
        return True

    def abandon(self) -> None:
        for temp in self.temps.values():
            with suppress(OSError):
                os.unlink(temp, dir_fd=self.dir_fd)
        self.temps = {}


class _TritonWriter(_Writer):
    """Builds the key folder in a temporary folder beside it (the group file last, its
    absolute paths rewritten to the new place), then renames it into place."""

    def __init__(self, folder: Path, dir_fd: int, entry: dict[str, Any], replace: bool) -> None:
        super().__init__(folder, dir_fd, entry)
        self.replace = replace
        self.temp = safe_io.temp_name(entry["key"])
        os.mkdir(self.temp, 0o777, dir_fd=dir_fd)
        self.fd = os.open(self.temp, _DIR_FLAGS, dir_fd=dir_fd)
        self.group: tuple[str, bytes, float] | None = None

    def _write(self, file_name: str, fill: Callable[[int], None], mtime: float) -> None:
        fd = os.open(file_name, _CREATE_FLAGS, 0o666, dir_fd=self.fd)
        try:
            fill(fd)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def add(self, file_name: str, source: IO[bytes], member: tarfile.TarInfo) -> None:
        self.pending.discard(file_name)
        if _is_group(file_name):
            self.group = (file_name, source.read(member.size), _mtime(member))
            return
        self._write(file_name, lambda fd: _copy(source, fd, member.size), _mtime(member))

    def _rewritten_group(self, final: Path) -> tuple[str, bytes, float] | None:
        if self.group is None:
            return None
        name, data, mtime = self.group
        group = _checked_group(self.entry, name, data)
        group["child_paths"] = {child: str(final / child) for child in group["child_paths"]}
        return name, json.dumps(group).encode(), mtime

    def finish(self) -> bool:
        key, last_use = self.entry["key"], self.entry["last_use"]
        group = self._rewritten_group(self.folder / key)
        if group is not None:  # written last, as Triton does
            self._write(group[0], lambda fd: safe_io._write_all(fd, group[1]), group[2])
        os.utime(self.fd, (last_use, last_use))
        if self.replace:
            triton_cache.remove_entry(self.folder, key)  # into the trash: a reader misses cleanly
        try:
            os.rename(self.temp, key, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False  # a process compiled it meanwhile: its entry stays
            raise
        self.temp = ""
        os.utime(self.fd, (last_use, last_use))  # the same folder, now in place
        return True

    def abandon(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None  # type: ignore[assignment]
        if self.temp:
            shutil.rmtree(self.temp, dir_fd=self.dir_fd, ignore_errors=True)
            self.temp = ""


def unpack(root: Path | None, archive: Path, kinds_asked: Iterable[str] | None = None,
           gpu_type: str | None = None, python: str | None = None, image: str | None = None,
           force: bool = False, dry_run: bool = False, shared_group: str | None = None) -> UnpackReport:
    """Check ``archive`` against the target and write its entries under ``root``.

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
    for kind in kinds_asked or ():
        if kind not in CARRIED:
            raise UsageError(f"cannot carry cache kind {kind!r}; kinds: {', '.join(CARRIED)}")
    target, target_words = target_software(python, image)
    report = UnpackReport(str(archive), str(root), dry_run)
    with _open_archive(archive) as opened:
        entries = opened.entries
        chosen = [k for k in entries if kinds_asked is None or k in kinds_asked]
        present = [k for k in chosen if entries[k]]
        problems, notes = fit_problems(opened.manifest, present, target, target_words, image, gpu_type)
        if opened.manifest.get("jax_path_in_key") and "jax" in present:
            old = Path(str(opened.manifest.get("source_root"))) / "jax"
            if old != kinds.KINDS["jax"].folder(root):
                notes.append(f"its jax entries hold their old folder's path in their keys (jax <= "
                             f"0.10 with XLA caches on): they hit only at {old}")
        report.checked = {"software": target_words, "kinds": present,
                          "gpu_type": gpu_type or "not checked (no --gpu-type)"}
        report.notes = notes
        for note in notes:
            log.warning("unpack: %s", note)
        if problems and not force:
            on = f" and GPU type {gpu_type}" if gpu_type else ""
            raise Refused(f"{archive} does not fit {target_words}{on}: {'; '.join(problems)}; "
                          "refused, nothing written (--force unpacks it anyway)")
        report.forced = problems
        actions = _plan({k: entries[k] for k in chosen}, root)
        todo = [e for k in chosen for e in entries[k] if actions[id(e)] != "keep"]
        need = sum(e["size"] for e in todo)
        free = _free_space(root)
        if free is not None and need + SPACE_MARGIN > free:
            raise Refused(f"the archive's entries need {format_size(need)} under {root}, and only "
                          f"{format_size(free)} is free there; refused, nothing written")
        # First pass: every member is safe and as the manifest says, before anything is written.
        for member, tar, kind, entry, file_name in opened.members(root):
            if kind == "triton" and _is_group(file_name):  # small: its paths are rewritten
                reader = tar.extractfile(member)
                assert reader is not None
                _checked_group(entry, file_name, reader.read(min(member.size, MAX_SMALL_JSON + 1)))
        for kind in chosen:
            for name, action in (("written", "write"), ("replaced", "replace"), ("kept", "keep")):
                getattr(report, name)[kind] = sum(1 for e in entries[kind] if actions[id(e)] == action)
        report.bytes = need
        if not dry_run and todo:
            _write_entries(root, chosen, opened, actions, report, shared_group)
    return report


def _write_entries(root: Path, chosen: list[str], opened: _Archive, actions: dict[int, str],
                   report: UnpackReport, shared_group: str | None) -> None:
    """Second pass: write each entry that is to be written, whole."""
    jax_folder = kinds.KINDS["jax"].folder(root)
    capped = os.path.lexists(jax_folder / jax_cache.LOCK_NAME) or any(
        isinstance(e.source, jax_cache.JaxEntry) and e.source.atime_path is not None
        and e.source.cache_path is not None for e in _existing("jax", jax_folder).values())
    fds: dict[str, int] = {}
    progress = _Progress("unpack", sum(1 for k in chosen for e in opened.entries[k]
                                       if actions[id(e)] != "keep"))
    writer: _Writer | None = None
    done = written_bytes = 0
    try:
        for kind in chosen:
            if any(actions[id(e)] != "keep" for e in opened.entries[kind]):
                fds[kind] = _kind_folder_fd(root, kind, shared_group)
        for member, tar, kind, entry, file_name in opened.members(root):
            action = actions.get(id(entry), "keep")
            if kind not in fds or action == "keep":
                continue
            if writer is None or writer.entry is not entry:
                folder = kinds.KINDS[kind].folder(root)
                writer = (_JaxWriter(folder, fds[kind], entry, capped) if kind == "jax"
                          else _TritonWriter(folder, fds[kind], entry, action == "replace"))
            source = tar.extractfile(member)
            assert source is not None
            writer.add(file_name, source, member)
            if writer.pending:
                continue
            if not writer.finish():  # a process wrote a newer one meanwhile: it stays
                getattr(report, "written" if action == "write" else "replaced")[kind] -= 1
                report.kept[kind] += 1
            writer.abandon()
            writer = None
            done += 1
            written_bytes += entry["size"]
            progress.step(done, written_bytes)
    finally:
        if writer is not None:
            writer.abandon()
        for fd in fds.values():
            os.close(fd)
