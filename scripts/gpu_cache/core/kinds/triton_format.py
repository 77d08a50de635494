"""Inventory and safe removal for a Triton kernel cache directory (``TRITON_CACHE_DIR``).

Pure standard library. The layout, as written by Triton's ``FileCacheManager``
(``triton/runtime/cache.py``, the same in triton 3.6 and 3.9):

* ``<dir>/<key>/`` where ``<key>`` is the base32 of a SHA-256 digest without ``=`` padding,
  always 52 characters of ``A-Z2-7``.
* A compiled kernel's key directory holds ``<kernel>.{source,ttir,ttgir,llir,ptx,cubin,json}``
  and the group manifest ``__grp__<kernel>.json`` = ``{"child_paths": {file name: absolute path}}``,
  written last. A hit needs the manifest and (triton 3.9) every child path to exist; triton 3.6
  only needs the ``<kernel>.json`` child, and then fails on the missing ones.
* Every file is written into ``<dir>/<key>/tmp.pid_<pid>_<uuid4>/`` and moved in with
  ``os.replace``; a writer killed in between leaves that temp directory behind.
* Other key directories hold no manifest: gcc-built helper modules (``cuda_utils<EXT_SUFFIX>``, and
  on triton <= 3.6 ``__triton_launcher<EXT_SUFFIX>``), or autotuning results
  (``<kernel>.autotune.json``).

Removal (:func:`remove_entry`) renames a key directory into the trash inside the cache
directory (one atomic rename on the same filesystem) and deletes it there, so a reader sees the
whole group or nothing, never a group with some children gone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpu_cache.core import safe_io, verified

KEY_RE = re.compile(r"^[A-Z2-7]{52}$")
"""A Triton cache key directory name: base32 of a SHA-256 digest, padding stripped."""

TEMP_RE = re.compile(r"^tmp\.pid_(\d+)_([0-9a-f-]{36})$")
"""A writer's temp directory inside a key directory (``tmp.pid_<pid>_<uuid4>``)."""

GROUP_PREFIX = "__grp__"
#: A group manifest larger than this is not read (Triton's are a few hundred bytes).
MANIFEST_LIMIT = 1 << 20
"""Where removed entries go before deletion: it has a dot, lower case and dashes, none of which a
base32 key can contain, so Triton never looks it up as a key."""

KIND_KERNEL = "kernel"
KIND_MODULE = "module"
KIND_AUTOTUNE = "autotune"
KIND_EMPTY = "empty"
KIND_UNKNOWN = "unknown"


class TritonCacheError(OSError):
    """A cache directory or entry cannot be scanned or removed as asked."""


@dataclass(frozen=True)
class TempDir:
    """A ``tmp.pid_<pid>_<uuid>`` directory left inside a key directory.

    A live writer's temp directory exists only for the moment of one file write; one that is
    older than a few seconds was left by a killed writer (stale).
    """

    path: Path
    key: str
    pid: int | None
    age_seconds: float
    bytes: int


@dataclass  # (not frozen: five times slower to make)
class TritonEntry:
    """One key directory of the cache.

    Attributes:
        key: the key directory's name.
        folder: its path, as text (``path`` gives it as a path).
        kind: ``kernel`` (a compiled kernel group, or the remains of one), ``module`` (a gcc-built
            helper module such as ``cuda_utils`` or ``__triton_launcher``), ``autotune``
            (autotuning results), ``empty`` or ``unknown``.
        kernel: the kernel name, from ``__grp__<kernel>.json`` (or from the file names when the
            manifest is missing); for a module, its name (``cuda_utils``); else ``None``.
        bytes: total size of the regular files in it, temp directories included.
        mtime: newest modification time of it and its files (seconds since the epoch).
        complete: for a kernel, the manifest is valid JSON with ``child_paths``, names the
            ``<kernel>.json`` metadata, and every child it names exists in this directory; for a
            module or autotune entry, its file is there and not empty; ``False`` for empty and
            unknown entries.
        points_outside: the manifest names at least one child path outside this key directory
            (e.g. a cache copied from another path: Triton then reads the old location's files, or
            misses once they are gone).
        problems: human-readable reasons why the entry is incomplete or suspect.
    """

    key: str
    folder: str
    kind: str
    kernel: str | None
    bytes: int
    mtime: float
    complete: bool
    points_outside: bool
    problems: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        """The key directory's path."""
        return Path(self.folder)


@dataclass(frozen=True)
class OtherPath:
    """A top-level path of the cache directory that is not a key directory.

    ``kind`` is ``trash`` (leftovers of :func:`remove_entry`), ``file``, ``directory`` or
    ``symlink``.
    """

    path: Path
    kind: str
    bytes: int


@dataclass(frozen=True)
class TritonInventory:
    """What :func:`scan` found in a Triton cache directory."""

    cache_dir: Path
    scanned_at: float
    entries: tuple[TritonEntry, ...] = ()
    temp_dirs: tuple[TempDir, ...] = ()
    others: tuple[OtherPath, ...] = ()
    exists: bool = True
    errors: tuple[str, ...] = field(default=())

    @property
    def kernels(self) -> tuple[TritonEntry, ...]:
        """The entries of kind ``kernel``."""
        return tuple(e for e in self.entries if e.kind == KIND_KERNEL)

    @property
    def autotune_results(self) -> int:
        """Key directories of Triton's kept autotuning results (``*.autotune.json``, written
        with ``TRITON_CACHE_AUTOTUNING=1``, Triton >= 3.4; issue 24)."""
        return autotune_results(self.entries)


def autotune_results(entries: object) -> int:
    """How many of ``entries`` (Triton entries, or :class:`gpu_cache.core.kinds.Entry` made
    from them) hold an autotuning result."""
    return sum(getattr(getattr(e, "source", e), "kind", None) == KIND_AUTOTUNE
               for e in entries)  # type: ignore[attr-defined]


def _inside(child: str, directory: str) -> bool:
    """True when the (absolute or relative) path ``child`` lies directly in ``directory``
    (normalised and absolute)."""
    head = child.rpartition("/")[0]
    if head == directory:
        return True  # Triton's own manifests: absolute paths into the key folder
    return os.path.normpath(os.path.dirname(os.path.abspath(child))) == directory


def _kernel_problems(path: str, manifest: str, info: os.stat_result) -> tuple[bool, list[str]]:
    """Read one group manifest: (points_outside, problems); problems also name the children
    the manifest lists, as ``missing child <name>`` for each (the caller drops those present)."""
    kernel = manifest[len(GROUP_PREFIX):-len(".json")]
    problems: list[str] = []
    try:
        data = json.loads(safe_io.read_known(os.path.join(path, manifest), MANIFEST_LIMIT, info))
    except safe_io.NotRegularFile as exc:
        return False, [f"{manifest} is {exc.what}, not a regular file"]
    except (OSError, ValueError) as exc:
        return False, [f"{manifest}: unreadable ({type(exc).__name__})"]
    children = data.get("child_paths") if isinstance(data, dict) else None
    if not isinstance(children, dict):
        return False, [f"{manifest}: no child_paths mapping"]
    outside = False
    for child_name, child_path in children.items():
        if not isinstance(child_path, str):
            problems.append(f"{manifest}: child {child_name!r} has no path")
            continue
        if not outside and not _inside(child_path, path):
            outside = True
        problems.append(f"\0{child_name}")  # "missing" unless present: see _check_manifest
    if f"{kernel}.json" not in children:
        problems.append(f"{manifest} does not list {kernel}.json")
    return outside, problems


def _check_manifest(path: str, key: str, manifest: str, names: dict[str, os.stat_result],
                    record: verified.Record | None) -> tuple[bool, bool, list[str]]:
    """Check one group manifest against the files present: (complete, points_outside,
    problems). A group ``record`` saw whole before (the same manifest file, the same names
    beside it) is not read again."""
    info = names[manifest]
    digest = 0
    if record is not None:
        digest = verified.digest(3, verified.text("\0".join(sorted(names))), info.st_ino,
                                 info.st_size, info.st_mtime_ns)
        if record.get(digest) is not None:
            return True, False, []
    outside, found = _kernel_problems(path, manifest, info)
    problems = [f"missing child {p[1:]}" if p.startswith("\0") else p
                for p in found if not (p.startswith("\0") and p[1:] in names)]
    complete = not problems
    if outside:
        problems.append("manifest names paths outside this entry (copied or moved cache)")
    elif complete and record is not None:
        record.put(digest, 1)
    return complete, outside, problems


def _scan_entry(path: str, key: str, folder_info: os.stat_result, now: float,
                record: verified.Record | None = None) -> tuple[TritonEntry, list[TempDir]]:
    """One key folder: one ``lstat`` per name in it (and in writers' temp folders)."""
    names: dict[str, os.stat_result] = {}
    temps: list[TempDir] = []
    odd: list[tuple[str, str]] = []
    manifests: list[str] = []
    size = 0
    newest = folder_info.st_mtime
    isreg = stat.S_ISREG
    with os.scandir(path) as listing:
        for child in listing:
            try:
                info = child.stat(follow_symlinks=False)
            except OSError:
                continue
            name = child.name
            if isreg(info.st_mode):
                names[name] = info
                size += info.st_size
                if info.st_mtime > newest:
                    newest = info.st_mtime
                if name.startswith(GROUP_PREFIX) and name.endswith(".json"):
                    manifests.append(name)
            elif stat.S_ISDIR(info.st_mode):
                inner, _n, inner_newest = safe_io.tree_size(child.path)
                size += inner
                newest = max(newest, inner_newest)
                match = TEMP_RE.match(name)
                if match or name.startswith("tmp."):
                    temps.append(TempDir(Path(child.path), key, int(match.group(1)) if match else None,
                                         max(0.0, now - max(inner_newest, info.st_mtime)), inner))
                else:
                    odd.append((name, f"unexpected directory {name}"))
            else:
                if info.st_mtime > newest:
                    newest = info.st_mtime
                odd.append((name, f"unexpected {safe_io.describe(info.st_mode)} {name}"))
    problems = [why for _name, why in sorted(odd)] if odd else []
    kind, kernel, complete, outside = KIND_UNKNOWN, None, False, False
    if manifests:
        if len(manifests) > 1:
            manifests.sort()
        kind, kernel = KIND_KERNEL, manifests[0][len(GROUP_PREFIX):-len(".json")]
        complete, outside, found = _check_manifest(path, key, manifests[0], names, record)
        if found:
            problems += found
        if len(manifests) > 1:
            complete = False
            problems.append(f"{len(manifests)} group manifests in one key directory")
    else:
        modules = sorted(n for n in names if n.endswith(".so"))
        autotune = sorted(n for n in names if n.endswith(".autotune.json"))
        kernel_files = sorted(n for n in names if n.endswith((".source", ".ttir", ".cubin", ".json"))
                              and n not in autotune)
        if modules:
            kind, kernel = KIND_MODULE, modules[0].split(".", 1)[0]
            complete = names[modules[0]].st_size > 0
            if not complete:
                problems.append(f"{modules[0]} is empty")
        elif autotune:
            kind = KIND_AUTOTUNE
            kernel = autotune[0][: -len(".autotune.json")]
            complete = names[autotune[0]].st_size > 0
        elif kernel_files:
            kind, kernel = KIND_KERNEL, kernel_files[0].rsplit(".", 1)[0]
            problems.append("no __grp__ manifest (a writer stopped before finishing)")
        elif not names and not temps:
            kind = KIND_EMPTY
            problems.append("empty key directory")
        else:
            problems.append("unrecognised contents: " + ", ".join(sorted(names)))
    if temps:
        temps.sort(key=lambda t: t.path.name)
        problems.append(f"{len(temps)} temp dir(s) left by writers")
    entry = TritonEntry(key, path, kind, kernel, size, newest, complete, outside, tuple(problems))
    return entry, temps


def scan(cache_dir: str | os.PathLike[str], record: verified.Record | None = None) -> TritonInventory:
    """Inventory a Triton cache directory.

    A missing directory gives an empty inventory with ``exists=False``. Entries that vanish or
    cannot be read while scanning (other processes may prune or write concurrently) are left out
    and named in ``errors``. One ``lstat`` per name, one listing per folder; a group manifest
    is read unless ``record`` (:class:`gpu_cache.core.verified.Record` of this folder) saw the
    very same group whole before.

    Raises:
        TritonCacheError: ``cache_dir`` exists but is not a directory, or cannot be listed.
    """
    root_text = os.path.abspath(cache_dir)
    root = Path(root_text)
    now = time.time()
    try:
        listing = sorted(os.scandir(root_text), key=lambda item: item.name)
    except FileNotFoundError:
        return TritonInventory(root, now, exists=False)
    except NotADirectoryError:
        raise TritonCacheError(f"{root} is not a directory") from None
    except OSError as exc:
        if not os.path.isdir(root_text):
            if not os.path.lexists(root_text):
                return TritonInventory(root, now, exists=False)
            raise TritonCacheError(f"{root} is not a directory") from None
        raise TritonCacheError(f"cannot list {root}: {exc.strerror or exc}") from exc
    entries: list[TritonEntry] = []
    temps: list[TempDir] = []
    others: list[OtherPath] = []
    errors: list[str] = []
    key_match = KEY_RE.fullmatch
    for item in listing:
        name = item.name
        try:
            if item.is_symlink():
                others.append(OtherPath(Path(item.path), "symlink", 0))
            elif item.is_dir(follow_symlinks=False):
                if key_match(name):
                    entry, entry_temps = _scan_entry(item.path, name, item.stat(follow_symlinks=False),
                                                     now, record)
                    entries.append(entry)
                    temps.extend(entry_temps)
                else:
                    kind = "trash" if name == safe_io.TRASH_DIR_NAME else "directory"
                    others.append(OtherPath(Path(item.path), kind, safe_io.tree_size(item.path)[0]))
            elif name != verified.NAME:
                others.append(OtherPath(Path(item.path), "file", item.stat(follow_symlinks=False).st_size))
        except OSError as exc:
            errors.append(f"{name}: {exc.strerror or exc}")
    return TritonInventory(root, now, tuple(entries), tuple(temps), tuple(others), True, tuple(errors))


def remove_entry(cache_dir: str | os.PathLike[str], key: str) -> int:
    """Remove one key directory safely while other processes may read the cache; return its bytes.

    The directory is first renamed, in one atomic step, into ``<cache_dir>/.gpu-cache-trash/``
    (a name Triton never looks up), then deleted there. A reader that looks the key up afterwards
    misses cleanly and recompiles; it never finds a manifest whose children are half deleted.
    (A reader that had already resolved the group keeps any file it has open; one that resolved it
    but had not yet opened a child gets FileNotFoundError from Triton, as with any deletion, so
    prune by age, not entries that are being compiled right now.) A key that is already gone
    returns 0. Leftovers of a failed delete stay in the trash; :func:`empty_trash` removes them.

    Raises:
        TritonCacheError: ``key`` is not a Triton key name, or names something that is not a
            directory, or the rename fails (e.g. read-only filesystem).
    """
    if not KEY_RE.fullmatch(key):
        raise TritonCacheError(f"{key!r} is not a Triton cache key")
    root = Path(cache_dir).absolute()
    victim = root / key
    try:
        info = victim.lstat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        raise TritonCacheError(f"{victim} is not a key directory")
    size = safe_io.tree_size(victim)[0]
    try:
        with safe_io.open_dir(root, follow=True) as root_fd:
            try:
                trash_fd, moved = safe_io.move_to_trash(root_fd, key)
            except FileNotFoundError:
                if not os.path.lexists(victim):
                    return 0  # another pruner won the race
                # the trash directory vanished under us: make it again, once
                trash_fd, moved = safe_io.move_to_trash(root_fd, key)
    except TritonCacheError:
        raise
    except OSError as exc:
        raise TritonCacheError(f"cannot move {victim} to the trash: {exc.strerror or exc}") from exc
    try:
        shutil.rmtree(moved, dir_fd=trash_fd, ignore_errors=True)
    finally:
        os.close(trash_fd)
    return size


def remove_temp_dir(temp: TempDir) -> int:
    """Remove a writer's temp directory found by :func:`scan`; return its bytes (0 if gone).

    Only remove stale ones (older than a minute, say): a live writer's file would be lost and its
    ``os.replace`` would fail.

    Raises:
        TritonCacheError: the path is not a ``tmp.*`` directory or cannot be removed.
    """
    if not temp.path.name.startswith("tmp.") or temp.path.is_symlink():
        raise TritonCacheError(f"{temp.path} is not a writer's temp directory")
    if not temp.path.exists():
        return 0
    size = safe_io.tree_size(temp.path)[0]
    try:
        # through descriptors of the real folders: a key folder swapped for a symlink fails
        with safe_io.open_dir(temp.path.parent.parent, follow=True) as root_fd, \
                safe_io.open_dir(temp.path.parent.name, root_fd) as key_fd:
            shutil.rmtree(temp.path.name, dir_fd=key_fd)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise TritonCacheError(f"cannot remove {temp.path}: {exc.strerror or exc}") from exc
    return size


def empty_trash(cache_dir: str | os.PathLike[str]) -> int:
    """Delete whatever :func:`remove_entry` left in the trash directory; return the bytes freed.

    The trash directory itself stays, so that a concurrent :func:`remove_entry` can still rename
    into it. A trash name that is a symlink is never followed (nothing outside is deleted).

    Raises:
        TritonCacheError: a leftover cannot be deleted.
    """
    root = Path(cache_dir).absolute()
    trash = root / safe_io.TRASH_DIR_NAME
    try:
        with safe_io.open_dir(root, follow=True) as root_fd:
            trash_fd = os.open(safe_io.TRASH_DIR_NAME, safe_io.DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        return 0  # missing, a symlink (ELOOP) or not a folder: nothing of ours to empty
    freed = 0
    try:
        for child in os.listdir(trash_fd):
            path = trash / child
            try:
                info = os.lstat(child, dir_fd=trash_fd)
                if stat.S_ISDIR(info.st_mode):
                    size = safe_io.tree_size(path)[0]
                    shutil.rmtree(child, dir_fd=trash_fd)
                else:
                    size = info.st_size if stat.S_ISREG(info.st_mode) else 0
                    os.unlink(child, dir_fd=trash_fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise TritonCacheError(f"cannot delete {path}: {exc.strerror or exc}") from exc
            freed += size
    finally:
        os.close(trash_fd)
    return freed
