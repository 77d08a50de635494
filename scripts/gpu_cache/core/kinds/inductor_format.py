"""Inventory and whole-entry removal for PyTorch Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``).

Pure standard library. The layout, as torch 2.13 writes it (``torch/_inductor/codecache.py``,
``torch/_functorch/_aot_autograd/autograd_cache.py``, ``runtime/cache_dir_utils.py``):

* **Code** (``codecache.write``): ``<dir>/<key[1:3]>/<key>.<suffix>``, where ``<key>`` is
  ``c`` + a base32 hash in lower case. One entry is every file of one key in its two-letter
  shard folder: the Python wrapper (``.py``), a C++ kernel's source and library
  (``.cpp``/``.so``, or ``.main.cpp``/``.main.so``), a GPU kernel (``.cubin``, ``.ptx``,
  ``.json``), autotuning results (``.best_config``). Every file is written through a temporary
  ``.<pid>.<thread>.tmp`` and a rename, except the ``.so``, which the compiler and linker write in
  place while the writer holds ``locks/<key>.lock`` (a ``filelock`` lock, i.e. ``flock``).
* **FX graphs** (``FxGraphCache``): ``fxgraph/<key[1:3]>/<key>/<content hash>``; **AOTAutograd**
  (``AOTAutogradCache``): ``aotautograd/<key>/<content hash>``. One entry is the key folder:
  Inductor lists it and tries each pickle in it (one per set of guards).
* **Locks**: ``locks/<key>.lock``, empty files. A lock goes with its code entry; a lock with
  no code entry left is an entry of its own (zero bytes).
* **Triton**: ``triton/<device>/`` is Triton's own cache when a process ran without
  ``TRITON_CACHE_DIR`` (gpu-cache exports it, so normally absent): Triton's inventory.
* **Anything else** (``cache/<hash>`` autotune timings, ``dynamo/``, ``aoti_eager/``, ...): each
  file is an entry of its own; Inductor rebuilds what it misses.

Broken: a ``.so`` that is empty or cut short (a killed linker or a full disk), a temporary
file older than the grace period, something that is not a regular file. Inductor trusts a
``.so`` that exists (it builds only missing ones): measured with torch 2.13 on the CPU, its
CPU-feature probes (small programs built into the cache and loaded to see whether the CPU
runs AVX-512, AVX2, ...) stay cut short for good, and every later job believes the CPU lacks
those features: with one probe cut short it compiled other kernels, with all of them every
``torch.compile`` failed to build its kernels. A ``.so`` is whole when its ELF headers end
inside it (checked once per file state by a prune, dry runs included; ``stats`` counts only
empty ones). A ``.so`` younger than the grace period may be mid-link: it is not judged, and
young temporary files are left out.

Last use: Inductor marks no hit on disk, so an entry's last use is the newest of its files'
modification and access times (a hit loads the ``.so`` and reads the pickle; the access time
moves where the mount keeps it: ``relatime``, the default, at most once a day). gpu-cache's
own reads use ``O_NOATIME`` so that checking an entry does not count as using it.

Removal: a code entry's files are unlinked while holding its lock (an entry being compiled
is skipped); a key folder is renamed into ``.gpu-cache-trash`` (atomic: a reader lists all of
its candidates or none) and deleted there.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field

from gpu_cache.core import names, safe_io, safe_locks, verified
from gpu_cache.core.kinds import triton_format as triton_cache

#: A code shard folder: two characters of a base32 key.
SHARD_RE = re.compile(r"^[a-z0-9]{2}$")
#: ``write_atomic``'s temporary file: ``.<pid>.<thread id>.tmp``.
TEMP_RE = re.compile(r"^\.\d+\.\d+\.tmp$")
LOCKS = "locks"
TRITON = "triton"
#: Guarded caches: folder name, and how many shard levels lie above each key folder.
GUARDED = {"fxgraph": 1, "aotautograd": 0}
#: What stats calls the kinds of entries.
NAMES = {"fxgraph": "FX graph", "aotautograd": "AOTAutograd graph", "lock": "(lock)",
         "trash": "(trash)", "temporary": "(temporary)"}


@dataclass
class InductorEntry:
    """One whole entry. ``key``: its path below the Inductor folder (a code entry: the shard
    and key, ``7t/c7tj...``; a key folder: ``fxgraph/h3/fh3...``). ``what``: ``code``,
    ``fxgraph``, ``aotautograd``, ``lock``, ``triton``, ``other``, ``temporary``, ``trash``.
    ``paths``: the files (a code entry, with its lock last) or the one folder it removes."""

    key: str
    what: str
    name: str
    paths: list[str]
    size: int
    last_use: float
    problem: str | None = None
    source: object = None  # for Triton entries: the Triton inventory's own record
    lock: str | None = None


@dataclass
class _Scan:
    folder: str
    now: float
    grace: float
    verify: bool
    record: verified.Record | None
    entries: list[InductorEntry] = field(default_factory=list)


def _times(info: os.stat_result) -> float:
    return info.st_mtime if info.st_mtime > info.st_atime else info.st_atime


def _library_problem(path: str, info: os.stat_result, scan: _Scan) -> str | None:
    """Why the ``.so`` at ``path`` cannot load (empty, not ELF, shorter than its own
    headers say), or None. Reads 64 bytes, without moving its access time, once per file
    state (the record keeps the verdict)."""
    if info.st_size == 0:
        return "empty .so (the linker was killed or the disk was full)"
    if not scan.verify:
        return None
    digest = 0
    if scan.record is not None:
        digest = verified.digest(4, verified.text(path), info.st_ino, info.st_size, info.st_mtime_ns)
        if scan.record.get(digest) is not None:
            return None
    problem = elf_problem(path, info)
    if problem is None and scan.record is not None:
        scan.record.put(digest, 1)
    return problem


def elf_problem(path: str, info: os.stat_result) -> str | None:
    fd = safe_io.open_to_check(path, info)
    if fd is None:
        return None
    try:
        head = os.read(fd, 64)
    finally:
        os.close(fd)
    if not head.startswith(b"\x7fELF") or len(head) < 52:
        return ".so is not an ELF library (cut short or overwritten)"
    wide = head[4] == 2
    order = "little" if head[5] == 1 else "big"
    if wide and len(head) < 64:
        return ".so is cut short (shorter than its ELF header)"

    def number(at: int, size: int) -> int:
        return int.from_bytes(head[at:at + size], order)

    if wide:
        phoff, shoff = number(32, 8), number(40, 8)
        phentsize, phnum, shentsize, shnum = number(54, 2), number(56, 2), number(58, 2), number(60, 2)
    else:
        phoff, shoff = number(28, 4), number(32, 4)
        phentsize, phnum, shentsize, shnum = number(42, 2), number(44, 2), number(46, 2), number(48, 2)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    if end > info.st_size:
        return f".so is cut short ({info.st_size} bytes; its headers reach byte {end})"
    return None


def _temporary(scan: _Scan, relative: str, path: str, info: os.stat_result) -> None:
    """A writer's temporary file: left out while young, broken once stale."""
    if scan.now - info.st_mtime >= scan.grace:
        promoted = os.path.basename(path).startswith(names.TEMP_PREFIX)
        scan.entries.append(InductorEntry(relative, "temporary", NAMES["temporary"], [path],
                                          info.st_size if stat.S_ISREG(info.st_mode) else 0,
                                          info.st_mtime, "stale temporary file of an interrupted "
                                          "promotion from a node-local tier" if promoted else
                                          "stale temporary file of a killed writer"))


def _other(scan: _Scan, relative: str, path: str, info: os.stat_result, top: str) -> None:
    """Anything outside the known layout: each file an entry of its own; a folder, walked."""
    if stat.S_ISDIR(info.st_mode):
        for name, child, child_info in safe_io.listing(path):
            _other(scan, f"{relative}/{name}", child, child_info, top)
        return
    base = os.path.basename(path)
    if TEMP_RE.match(base) or base.startswith(names.TEMP_PREFIX):
        _temporary(scan, relative, path, info)
        return
    problem = None if stat.S_ISREG(info.st_mode) else \
        f"{safe_io.describe(info.st_mode)} in the cache folder (never followed)"
    scan.entries.append(InductorEntry(relative, "other", f"(other: {top})", [path],
                                      info.st_size if problem is None else 0, _times(info), problem))


def _shard(scan: _Scan, shard: str, path: str, locks: dict[str, tuple[str, os.stat_result]]) -> None:
    """The code entries of one shard folder."""
    groups: dict[str, list[tuple[str, str, os.stat_result]]] = {}
    for name, child, info in safe_io.listing(path):
        relative = f"{shard}/{name}"
        if name.startswith("."):
            if TEMP_RE.match(name) or name.startswith(names.TEMP_PREFIX):
                _temporary(scan, relative, child, info)
            else:
                _other(scan, relative, child, info, shard)
        elif stat.S_ISDIR(info.st_mode):
            _other(scan, relative, child, info, shard)
        else:
            groups.setdefault(name.split(".", 1)[0], []).append((name, child, info))
    for key, files in groups.items():
        size = 0
        last_use = 0.0
        problem = None
        young = False
        suffixes = set()
        for name, child, info in files:
            suffixes.add(name.rpartition(".")[2])
            when = _times(info)
            if when > last_use:
                last_use = when
            if not stat.S_ISREG(info.st_mode):
                problem = problem or f"{name} is {safe_io.describe(info.st_mode)}, not a regular file"
                continue
            size += info.st_size
            if name.endswith(".so") and problem is None:
                if scan.now - info.st_mtime < scan.grace:
                    young = True  # may be mid-link: not checked yet
                else:
                    problem = _library_problem(child, info, scan)
        lock = locks.pop(key, None)
        paths = [child for _name, child, _info in sorted(files)]
        if lock is not None:
            paths.append(lock[0])
        if problem is not None and young:
            continue  # a writer may still be at it
        kinds = ", ".join(sorted(suffixes))
        scan.entries.append(InductorEntry(f"{shard}/{key}", "code", f"code ({kinds})", paths, size,
                                          last_use, problem, lock=lock[0] if lock else None))


def _key_folders(scan: _Scan, what: str, path: str, levels: int, relative: str) -> None:
    """The key folders of a guarded cache (``levels`` shard folders above them)."""
    for name, child, info in safe_io.listing(path):
        below = f"{relative}/{name}"
        if not stat.S_ISDIR(info.st_mode):
            if TEMP_RE.match(name):
                _temporary(scan, below, child, info)
            else:
                _other(scan, below, child, info, what)
        elif levels:
            _key_folders(scan, what, child, levels - 1, below)
        else:
            size, count, newest = 0, 0, info.st_mtime
            problem = None
            stale_temp = False
            for file_name, _file_path, file_info in safe_io.listing(child):
                newest = max(newest, _times(file_info))
                if not stat.S_ISREG(file_info.st_mode):
                    problem = problem or (f"{file_name} is {safe_io.describe(file_info.st_mode)}, "
                                          "not a regular file")
                    continue
                size += file_info.st_size
                if file_name.startswith("."):
                    stale_temp = stale_temp or scan.now - file_info.st_mtime >= scan.grace
                    continue  # Inductor skips its own temporaries
                count += 1
                if file_info.st_size == 0:
                    problem = problem or f"{file_name} is empty"
            if problem is None and count == 0:
                if scan.now - newest < scan.grace:
                    continue  # being written
                problem = ("stale temporary file of a killed writer" if stale_temp
                           else "empty key folder")
            scan.entries.append(InductorEntry(below, what, NAMES[what], [child], size, newest, problem))


def _triton(scan: _Scan, path: str) -> None:
    """``triton/<device>/``: Triton caches of their own."""
    for name, child, info in safe_io.listing(path):
        if not stat.S_ISDIR(info.st_mode):
            _other(scan, f"{TRITON}/{name}", child, info, TRITON)
            continue
        try:
            inventory = triton_cache.scan(child)
        except triton_cache.TritonCacheError:
            continue
        prefix = f"{TRITON}/{name}"
        for item in inventory.entries:
            problem = None
            if not item.complete or item.points_outside:
                if scan.now - item.mtime < scan.grace:
                    continue
                problem = "; ".join(item.problems) or "incomplete group"
            scan.entries.append(InductorEntry(f"{prefix}/{item.key}", "triton", item.kernel or item.kind,
                                              [child], item.bytes, item.mtime, problem, source=item))
        for temp in inventory.temp_dirs:
            if temp.age_seconds >= scan.grace:
                scan.entries.append(InductorEntry(f"{prefix}/{temp.key}/{temp.path.name}", "triton",
                                                  NAMES["temporary"], [child], temp.bytes,
                                                  scan.now - temp.age_seconds,
                                                  "stale temporary folder of a killed writer", source=temp))
        for other in inventory.others:
            if other.kind == "trash":
                scan.entries.append(InductorEntry(f"{prefix}/{other.path.name}", "triton", NAMES["trash"],
                                                  [child], other.bytes, 0.0,
                                                  "left over from an interrupted removal", source=other))


def scan(folder: str | os.PathLike[str], grace_seconds: float = 3600.0, verify: bool = False,
         record: verified.Record | None = None) -> list[InductorEntry]:
    """Every entry in an Inductor cache folder (a missing folder has none). ``verify``: also
    check that each ``.so`` is whole (its ELF headers), once per file state when ``record``
    is given. One ``lstat`` per name."""
    root = os.path.abspath(folder)
    state = _Scan(root, time.time(), grace_seconds, verify, record)
    top = safe_io.listing(root)
    locks: dict[str, tuple[str, os.stat_result]] = {}
    for name, path, info in top:
        if name == LOCKS and stat.S_ISDIR(info.st_mode):
            for lock_name, lock_path, lock_info in safe_io.listing(path):
                if lock_name.endswith(".lock") and stat.S_ISREG(lock_info.st_mode):
                    locks[lock_name[:-len(".lock")]] = (lock_path, lock_info)
                else:
                    _other(state, f"{LOCKS}/{lock_name}", lock_path, lock_info, LOCKS)
    for name, path, info in top:
        if name == verified.NAME or (name == LOCKS and stat.S_ISDIR(info.st_mode)):
            continue
        if name == safe_io.TRASH_DIR_NAME and stat.S_ISDIR(info.st_mode):
            for leftover, left_path, left_info in safe_io.listing(path):
                size = safe_io.tree_size(left_path)[0] if stat.S_ISDIR(left_info.st_mode) \
                    else left_info.st_size
                state.entries.append(InductorEntry(f"{name}/{leftover}", "trash", NAMES["trash"],
                                                   [left_path], size, 0.0,
                                                   "left over from an interrupted removal"))
        elif SHARD_RE.fullmatch(name) and stat.S_ISDIR(info.st_mode):
            _shard(state, name, path, locks)
        elif name in GUARDED and stat.S_ISDIR(info.st_mode):
            _key_folders(state, name, path, GUARDED[name], name)
        elif name == TRITON and stat.S_ISDIR(info.st_mode):
            _triton(state, path)
        elif TEMP_RE.match(name) or name.startswith(names.TEMP_PREFIX):
            _temporary(state, name, path, info)
        else:
            _other(state, name, path, info, name)
    for key, (path, info) in locks.items():  # locks whose code entry is gone
        state.entries.append(InductorEntry(f"{LOCKS}/{key}.lock", "lock", NAMES["lock"], [path], 0,
                                           _times(info), lock=path))
    return state.entries


def _unlink(path: str) -> None:
    try:
        os.unlink(path)  # the name itself, never what a symlink points to
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(path)  # fd-based: never follows a symlink inside


def rename_away(folder: str, relative: str) -> None:
    """Rename the folder ``relative`` (below ``folder``) into the trash, one atomic step
    through descriptors of real folders (a symlink swapped in is never followed), then
    delete it there."""
    parts = relative.split("/")
    with safe_io.open_dir(folder, follow=True) as root_fd:
        parent_fd = os.dup(root_fd)
        try:
            for part in parts[:-1]:
                inner = os.open(part, safe_io.DIR_FLAGS, dir_fd=parent_fd)
                os.close(parent_fd)
                parent_fd = inner
            try:
                trash_fd, moved = safe_io.move_to_trash(root_fd, parts[-1], parent_fd)
            except FileNotFoundError:
                return  # removed meanwhile
            try:
                safe_io.delete_in(trash_fd, moved)
            finally:
                os.close(trash_fd)
        finally:
            os.close(parent_fd)


def remove(folder: str | os.PathLike[str], entry: InductorEntry) -> None:
    """Remove one whole entry.

    Raises:
        OSError: it could not be removed (EBUSY: a code entry being compiled right now).
    """
    root = os.path.abspath(folder)
    if entry.what in ("fxgraph", "aotautograd"):
        rename_away(root, entry.key)
    elif entry.what == "triton":
        source = entry.source
        if isinstance(source, triton_cache.TritonEntry):
            triton_cache.remove_entry(entry.paths[0], source.key)
        elif isinstance(source, triton_cache.TempDir):
            triton_cache.remove_temp_dir(source)
        else:
            triton_cache.empty_trash(entry.paths[0])
    elif entry.what == "code" or entry.what == "lock":
        held = safe_locks.hold_if_free(entry.lock) if entry.lock else None
        try:
            for path in entry.paths:
                _unlink(path)  # the lock last: a waiting writer then finds it gone and retries
        finally:
            if held is not None:
                os.close(held)
    elif entry.what == "trash":
        _unlink(entry.paths[0])
    else:
        for path in entry.paths:
            _unlink(path)
