"""JAX's persistent compilation cache on disk: entries, their last use, safe removal.

Layout (``jax/_src/lru_cache.py`` in the jax sources): ``<key>-cache`` holds the compressed executable,
``<key>-atime`` (only with a size cap) the last use as 8 little-endian bytes of
nanoseconds, and ``.lockfile`` guards both when a cap is set. ``<key>`` is
``<module name>-<sha256 hex>``.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_cache.core import names, safe_io, safe_locks, verified
from gpu_cache.core.kinds import integrity
from gpu_cache.core.kinds import jax_frames as frames

ATIME_SUFFIX = "-atime"
#: A ``-cache`` file younger than this may still be being written (JAX writes in place).
WRITE_GRACE_SECONDS = 1.0
LOCK_NAME = ".lockfile"
#: ``<key>-cache``/``<key>-atime``; older jax (0.4.30, as images that pin it run) writes the
#: executable as plain ``<key>`` and keeps no ``-atime``.
_FILE_RE = re.compile(r"^(?P<key>(?P<name>.+)-(?P<hash>[0-9a-f]{64}))(?:-(?P<suffix>cache|atime))?$")
#: The ``-<sha256 hex>`` before a ``-cache``/``-atime`` suffix (matched in place: fast).
_HASH_TAIL = re.compile(r"-[0-9a-f]{64}")
#: Temporary files in a JAX folder: :func:`write_atime`'s (``.<key>-atime.<pid>.<hex>.tmp``,
#: and the fixed ``.<key>-atime.tmp`` of earlier gpu-cache versions). JAX writes none; prune
#: removes them once stale.
_TEMP_RE = re.compile(r"^\..+\.tmp$")


@dataclass
class JaxEntry:
    """One cache entry: its ``-cache`` file, its ``-atime`` sidecar, or both.

    ``problem`` says why it is broken (then pruning removes it whatever its age): an empty
    ``-cache`` file (a full disk), one that does not decompress (truncated by a full disk
    or a killed writer; checked only when scanning with ``verify_after``), or an ``-atime``
    without its ``-cache``. ``needs_atime`` marks a ``-cache`` without ``-atime`` in a
    size-capped cache: JAX reads every ``-atime`` when it evicts, so such an entry makes
    every later write fail until it is repaired. ``last_use_source`` says where
    ``last_use`` came from (see :func:`scan`).

    The paths are kept as text (``cache_file``, ``atime_file``; a million ``Path`` objects
    cost a second); ``cache_path`` and ``atime_path`` give them as paths.
    """

    key: str
    name: str
    cache_file: str | None
    atime_file: str | None
    size: int
    last_use: float
    problem: str | None
    needs_atime: bool = False
    last_use_source: str = "mtime"

    @property
    def cache_path(self) -> Path | None:
        return None if self.cache_file is None else Path(self.cache_file)

    @property
    def atime_path(self) -> Path | None:
        return None if self.atime_file is None else Path(self.atime_file)

    @atime_path.setter
    def atime_path(self, value: str | os.PathLike[str] | None) -> None:
        self.atime_file = None if value is None else os.fspath(value)


def _read_atime(path: str, info: os.stat_result) -> float | None:
    try:
        data = safe_io.read_known(path, 8, info)
    except OSError:  # gone, unreadable, not a regular file, more than 8 bytes
        return None
    if len(data) != 8:
        return None
    return int.from_bytes(data, "little") / 1e9


#: The value a record keeps for an ``-atime`` file that holds no time (not 8 bytes).
_NO_TIME = (1 << 64) - 1


def _recorded_atime(key: str, path: str, info: os.stat_result,
                    record: verified.Record | None) -> float | None:
    """The time in an ``-atime`` file, from ``record`` when it read this very file before
    (same inode, size, mtime and ctime: JAX rewrites the file on every use, which changes
    them), else read and recorded."""
    if record is None or not stat.S_ISREG(info.st_mode):
        return _read_atime(path, info)
    digest = verified.digest(2, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    known = record.get(digest)
    if known is not None:
        return None if known == _NO_TIME else known / 1e9
    when = _read_atime(path, info)
    if when is not None:
        record.put(digest, int(when * 1e9) & _NO_TIME)
    return when


#: An ``-atime`` file whose mtime is further than this from the time it holds was copied or
#: restored without its times (JAX writes the file and its content at once); its content is
#: then the only true last use. (Generous: a network filesystem's server clock may differ.)
COPIED_TOLERANCE_SECONDS = 300.0
COPIED = "-atime (file times ignored: copied without them)"


#: A JAX entry's files: ``<name>-<sha256 hex>-cache`` and ``-atime``. The scan tells them by
#: slicing (a third of the regular expression's cost) and checks the hash once per key.
_SUFFIX_LENGTH = len("cache")  # and len("atime")
_HASH_LENGTH = len("-") + 64  # "-<sha256 hex>", the end of the key
_SHORTEST = 1 + _HASH_LENGTH + len("-") + _SUFFIX_LENGTH  # a one-letter name


@dataclass
class _Listing:
    """A JAX folder's files, by role: each ``-cache`` (or plain ``<key>``) file as
    ``(key, path, lstat)`` (a list is cheaper than a mapping), the ``-atime`` files by key,
    stale temporary files as broken entries, and whether JAX caps the folder's size."""

    caches: list[tuple[str, str, os.stat_result]]
    atimes: dict[str, tuple[str, os.stat_result]]
    temps: list[JaxEntry]
    capped: bool


def scan(folder: Path | str, verify_after: float | None = None,
         temp_grace: float | None = None, record: verified.Record | None = None) -> list[JaxEntry]:
    """All entries in a JAX cache folder (missing folder: none). With ``verify_after`` (a
    time), each ``-cache`` file modified after it and older than
    :data:`WRITE_GRACE_SECONDS` is decompressed to find broken ones. With ``temp_grace``
    (seconds), temporary files of an interrupted prune older than that are listed too, as
    broken entries. Never raises for races: a file that disappears while scanning is skipped.

    ``record`` (:class:`gpu_cache.core.verified.Record` of this folder): what earlier scans read or
    verified; an entry verified whole before (same name, inode and size: JAX never rewrites
    an entry) is not decompressed again, only read again now and then for its CRC (damage
    that keeps the size: :func:`_verify`), and an ``-atime`` file read before (same inode,
    size, mtime and ctime) is not read again. What this scan learns is added to it.

    Last use: where JAX keeps an ``-atime`` record (a size cap), the time it holds. When the
    ``-atime`` file's own mtime agrees with it, the files' times are trusted too (the newest
    wins: the startup hook marks a hit in the ``-cache`` mtime even where JAX runs without a
    cap); when it does not (a copy or restore without times made every mtime "now"), the
    recorded time alone counts. Without an ``-atime``, the newest mtime.

    A ``-cache`` or ``-atime`` name that is not a regular file (a symlink, a FIFO, a device,
    a folder) makes its entry broken; it is never opened or followed.
    """
    started = time.monotonic()
    try:
        listing = _list(os.fspath(folder), temp_grace)
    except (FileNotFoundError, NotADirectoryError):
        return []
    entries = _entries(listing, verify_after, record)
    if record is not None:
        _recheck(entries, record, time.monotonic() - started)
    return entries + listing.temps


def _list(folder: str, temp_grace: float | None) -> _Listing:
    """The files of ``folder`` by role (:class:`_Listing`); one that disappears is skipped.

    Raises:
        FileNotFoundError, NotADirectoryError: no such folder.
    """
    listing = _Listing([], {}, [], False)
    plain: dict[str, tuple[str, os.stat_result]] = {}  # jax 0.4.30's <key> without a suffix
    now = time.time()
    match = _FILE_RE.fullmatch
    with os.scandir(folder) as found:
        for item in found:
            name = item.name
            suffix = name[-_SUFFIX_LENGTH:]
            if len(name) >= _SHORTEST and (suffix == "cache" or suffix == "atime") \
                    and name[-_SUFFIX_LENGTH - 1] == "-":
                try:
                    info = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                key = name[:-_SUFFIX_LENGTH - 1]
                if suffix == "cache":
                    listing.caches.append((key, item.path, info))
                else:
                    listing.atimes[key] = (item.path, info)
                continue
            named = match(name)
            if named is None:
                if temp_grace is not None:
                    _stale_temporary(item, now - temp_grace, listing.temps)
                continue
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            key, suffix = named.group("key", "suffix")
            (listing.atimes if suffix == "atime" else plain)[key] = (item.path, info)
    if plain:  # one entry per key: a <key>-cache name wins over a plain <key>
        cached = {key for key, _path, _info in listing.caches}
        listing.caches += [(key, path, info) for key, (path, info) in plain.items() if key not in cached]
    # JAX keeps -atime files and a .lockfile only with a size cap; a lone -atime proves nothing.
    listing.capped = os.path.lexists(os.path.join(folder, LOCK_NAME)) or (
        bool(listing.atimes) and any(key in listing.atimes for key, _path, _info in listing.caches))
    return listing


def _stale_temporary(item: os.DirEntry[str], before: float, temps: list[JaxEntry]) -> None:
    """Add ``item`` to ``temps`` as a broken entry when it is a temporary file (of a prune, or
    of a promotion from a node-local tier) last changed before ``before``."""
    promoted = item.name.startswith(names.TEMP_PREFIX)
    if not (promoted or _TEMP_RE.match(item.name)):
        return
    try:
        info = item.stat(follow_symlinks=False)
    except OSError:
        return
    if info.st_mtime <= before:
        temps.append(JaxEntry(
            key=item.name, name="(temporary)", cache_file=None, atime_file=item.path,
            size=info.st_size if stat.S_ISREG(info.st_mode) else 0, last_use=info.st_mtime,
            problem="stale temporary file of an interrupted "
                    + ("promotion from a node-local tier" if promoted else "prune")))


def _entries(listing: _Listing, verify_after: float | None,
             record: verified.Record | None) -> list[JaxEntry]:
    """One entry per key of ``listing``: its ``-cache`` file with its ``-atime``, or either alone."""
    young = time.time() - WRITE_GRACE_SECONDS
    entries = []
    isreg = stat.S_ISREG
    tail = _HASH_TAIL.fullmatch
    atimes, capped = listing.atimes, listing.capped
    for key, path, info in listing.caches:
        atime = atimes.pop(key, None) if atimes else None
        if not tail(key, len(key) - _HASH_LENGTH):
            continue  # "...-cache" without a hash before it: not JAX's
        if not isreg(info.st_mode) or (atime is not None and not isreg(atime[1].st_mode)):
            entries.append(_pair(key, (path, info), atime, verify_after, young, record, capped))
            continue
        # Regular files (the common case, kept short): see _pair for the general one.
        size, last_use, source = info.st_size, info.st_mtime, "mtime"
        if atime is not None:
            size += atime[1].st_size
            last_use, source = _last_use(key, atime, max(last_use, atime[1].st_mtime), record)
        if info.st_size == 0:
            problem: str | None = "empty -cache file (written while the disk was full)"
        elif verify_after is not None and verify_after < info.st_mtime < young:
            problem = _verify(key, path, info, record)
        else:
            problem = None
        entries.append(JaxEntry(key, key[:-_HASH_LENGTH], path, None if atime is None else atime[0], size,
                                last_use, problem, capped and atime is None and problem is None,
                                source))
    for key, atime in atimes.items():  # -atime files without their -cache
        if tail(key, len(key) - _HASH_LENGTH):
            entries.append(_pair(key, None, atime, verify_after, young, record, capped))
    return entries


def _last_use(key: str, atime: tuple[str, os.stat_result], last_use: float,
              record: verified.Record | None) -> tuple[float, str]:
    """An entry's last use and where it comes from, given its ``-atime`` file and the newest
    mtime of its files (``last_use``): the time the ``-atime`` file holds wins where its own
    mtime disagrees with it (copied without times), else the newest of both."""
    recorded = _recorded_atime(key, atime[0], atime[1], record)
    if recorded is None:
        return last_use, "mtime"
    if abs(atime[1].st_mtime - recorded) > COPIED_TOLERANCE_SECONDS:
        return recorded, COPIED
    return max(last_use, recorded), "-atime"


def _pair(key: str, cache: tuple[str, os.stat_result] | None, atime: tuple[str, os.stat_result] | None,
          verify_after: float | None, young: float, record: verified.Record | None,
          capped: bool) -> JaxEntry:
    """One entry with an ``-atime`` half, or whose ``-cache`` is not a regular file."""
    problem = None
    size = 0
    last_use = 0.0
    source = "mtime"
    for part, suffix in ((cache, "cache"), (atime, "atime")):
        if part is not None:
            info = part[1]
            if stat.S_ISREG(info.st_mode):
                size += info.st_size
            else:
                odd = f"-{suffix} is {safe_io.describe(info.st_mode)}, not a regular file"
                problem = odd if problem is None else f"{odd}; {problem}"
            if info.st_mtime > last_use:
                last_use = info.st_mtime
    if atime is not None and problem is None:
        last_use, source = _last_use(key, atime, last_use, record)
    if problem is not None:
        pass
    elif cache is None:
        problem = "-atime without -cache"
    elif cache[1].st_size == 0:
        problem = "empty -cache file (written while the disk was full)"
    elif verify_after is not None and verify_after < cache[1].st_mtime < young:
        problem = _verify(key, cache[0], cache[1], record)
    return JaxEntry(key, key[:-_HASH_LENGTH], cache[0] if cache else None, atime[0] if atime else None, size,
                    last_use, problem, capped and cache is not None and atime is None and problem is None,
                    source)


#: Why a JAX entry whose bytes changed after it was verified is broken.
CHANGED = ("-cache file's bytes changed after it was verified whole (damaged in place, its size "
           "kept: JAX never rewrites an entry)")


def _verify(key: str, path: str, info: os.stat_result, record: verified.Record | None) -> str | None:
    """:func:`jax_frames.undecompressable`, remembered in ``record``: an entry verified whole
    before (the same file: name, inode and size) is not decompressed again, only offered to be read again
    (:func:`_recheck`); with ``recheck_all`` every entry is verified again, and the CRC-32 of
    its bytes must still be the one recorded."""
    digest = None if record is None else integrity.seal_of(record, os.path.basename(path), path, info)
    if record is None or digest is None:  # (keyed as a seal, which the hook looks up too)
        return frames.undecompressable(path)
    known = record.get(digest)
    if known is not None:
        if known == verified.DAMAGED:
            return CHANGED
        record.candidate(digest, (digest, known, path, info, key))
        return None
    problem, crc = frames.examine(path)
    if problem is None and crc is not None:
        before = record.previous(digest)  # (recheck_all: what get did not tell)
        if before is not None and before != crc:
            record.put(digest, verified.DAMAGED)
            return CHANGED
        record.put(digest, crc)
    return problem


def _recheck(entries: list[JaxEntry], record: verified.Record, spent: float) -> None:
    """Read again the entries verified before that ``record`` picks (:meth:`~gpu_cache.core.
    verified.Record.rechecks`, within a share of ``spent``, the scan's own seconds): one whose
    bytes no longer have the CRC-32 they had when verified is broken, and recorded so."""
    changed = set()
    for digest, known, path, info, key in record.rechecks(spent):
        crc = integrity.crc_of(path, info)  # (one read for most entries: cheap beside a scan)
        if crc is not None and crc != known:
            record.put(digest, verified.DAMAGED)
            changed.add(key)
    for entry in entries if changed else ():
        if entry.key in changed:
            entry.problem, entry.needs_atime = CHANGED, False


def write_atime(folder: Path, entry: JaxEntry) -> None:
    """Give a lone ``-cache`` its ``-atime`` (its last use), so a capped JAX can evict again.

    Written to a new, uniquely named temporary file and renamed into place: a name planted
    in the folder is never written through.

    Raises:
        OSError: the sidecar cannot be written.
    """
    path = folder / f"{entry.key}{ATIME_SUFFIX}"
    safe_io.replace_file(path, int(entry.last_use * 1e9).to_bytes(8, "little"))
    entry.atime_path = path


def repair_lockfile(folder: Path) -> str | None:
    """Remove a ``.lockfile`` that is not a regular file (a symlink, FIFO or device planted
    there: JAX's ``filelock`` before 4.x opens it with ``O_TRUNC``, following a symlink, and
    would truncate its target in every capped job). JAX makes a regular one on its next use.
    Returns what was removed, in words, or None.

    Raises:
        OSError: it cannot be removed.
    """
    path = folder / LOCK_NAME
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(info.st_mode):
        return None
    _unlink(path)
    return f"{LOCK_NAME} was {safe_io.describe(info.st_mode)}"


def _unlink(path: str | os.PathLike[str]) -> None:
    """Remove one name of an entry, never following it (a folder planted there goes too)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(path)  # fd-based: never follows a symlink inside


def remove(folder: Path, entry: JaxEntry) -> None:
    """Delete one entry as a whole: ``-cache`` first, then ``-atime``.

    In that order a crash between the two leaves only a lone ``-atime``, which JAX ignores
    and the next prune removes; the reverse would leave a lone ``-cache`` that breaks every
    later write of a size-capped cache. When the cache has JAX's ``.lockfile``, the removal
    holds it, so a capped reader never sees half an entry (a ``.lockfile`` that is not a
    regular file is removed, never followed, and JAX makes a new one).

    Raises:
        OSError: a file could not be removed (other than already being gone).
    """
    with safe_locks.exclusive_lock(folder / LOCK_NAME, timeout=30, create=False):
        for path in (entry.cache_file, entry.atime_file):
            if path is not None:
                _unlink(path)
