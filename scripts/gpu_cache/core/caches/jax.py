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
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_cache.core import safe_io, safe_locks, verified

ATIME_SUFFIX = "-atime"
#: A ``-cache`` file younger than this may still be being written (JAX writes in place).
WRITE_GRACE_SECONDS = 1.0
LOCK_NAME = ".lockfile"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: ``<key>-cache``/``<key>-atime``; older jax (0.4.30, as images that pin it run) writes the
#: executable as plain ``<key>`` and keeps no ``-atime``.
_FILE_RE = re.compile(r"^(?P<key>(?P<name>.+)-(?P<hash>[0-9a-f]{64}))(?:-(?P<suffix>cache|atime))?$")
#: The ``-<sha256 hex>`` before a ``-cache``/``-atime`` suffix (matched in place: fast).
_HASH_TAIL = re.compile(r"-[0-9a-f]{64}")
#: Temporary files in a JAX folder: :func:`write_atime`'s (``.<key>-atime.<pid>.<hex>.tmp``,
#: and the fixed ``.<key>-atime.tmp`` of earlier gpu-cache versions). JAX writes none; prune
#: removes them once stale.
_TEMP_RE = re.compile(r"^\..+\.tmp$")
#: Verification stops (and calls the entry broken) past this many decompressed bytes, or
#: :data:`VERIFY_MAX_RATIO` times the compressed size when that is larger. A compiled
#: executable compresses 2-5x; a decompression bomb (zlib up to 1032x, zstd far more) is cut
#: off here after about a second of work, without ever holding more than a chunk.
VERIFY_MAX_PLAIN = 512 << 20
VERIFY_MAX_RATIO = 64
#: Output per decompression step; zstd input is fed in steps this small because one zstd
#: block of 4 input bytes can stand for 128 KiB of output.
_PLAIN_STEP = 1 << 20
_ZSTD_INPUT_STEP = 1 << 10
_ZLIB_TYPE = type(zlib.decompressobj())


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


def _zstd_decompressor() -> Any:
    """A streaming zstd decompressor of the library JAX itself would use, or None."""
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+

        return zstd.ZstdDecompressor()
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return None
    return zstandard.ZstdDecompressor().decompressobj()


class _Inflate:
    """Feeds a stream's chunks through ``decompressor`` and counts the output, holding at most
    one bounded piece of it at a time; ``done`` at the end of the stream or past ``limit``."""

    def __init__(self, decompressor: Any, limit: int) -> None:
        self.decompressor = decompressor
        self.limit = limit
        self.total = 0
        self.done = False
        self.takes_max_length = isinstance(decompressor, _ZLIB_TYPE) or hasattr(decompressor, "needs_input")

    def feed(self, chunk: bytes) -> None:
        decompressor = self.decompressor
        if self.takes_max_length:  # zlib, compression.zstd
            data = chunk
            while True:
                out = decompressor.decompress(data, _PLAIN_STEP)
                self.total += len(out)
                if decompressor.eof or self.total > self.limit:
                    self.done = True
                    return
                data = getattr(decompressor, "unconsumed_tail", b"")
                if not data and not out:
                    return  # this chunk is used up and nothing is pending
        else:  # zstandard's decompressobj has no max_length: feed it small pieces instead
            for start in range(0, len(chunk), _ZSTD_INPUT_STEP):
                self.total += len(decompressor.decompress(chunk[start:start + _ZSTD_INPUT_STEP]))
                if decompressor.eof or self.total > self.limit:
                    self.done = True
                    return


#: The largest block a zstd frame may hold, compressed or not (RFC 8878, Block_Maximum_Size).
ZSTD_BLOCK_MAX = 128 << 10
_TRUNCATED = "truncated -cache file (the writer ran out of space or was killed)"


class ZstdFrame:
    """Whether a zstd frame is whole, from its headers alone (RFC 8878), fed as its bytes
    arrive: the frame header (its content size, whether a checksum follows), then each
    block's 3-byte header (last-block bit, type, size), skipping the block bodies, then the
    checksum. No decoder is needed: gpu-cache's own Python may lack ``zstandard`` while the
    jobs that wrote the entries have it. Only the first bytes of a header are ever held."""

    def __init__(self) -> None:
        self.content_size: int | None = None  # announced by the frame header
        self.plain = 0  # bytes the raw and RLE blocks give: the output is at least this
        self.compressed = 0  # compressed blocks (each gives at most ZSTD_BLOCK_MAX bytes)
        self.problem: str | None = None
        self._header = bytearray()
        self._need = 5  # the magic number and the frame header descriptor
        self._state = "start"
        self._skip = 0
        self._checksum = False
        self._content_bytes = 0
        self._trailing = 0

    def feed(self, data: bytes) -> None:
        position, end = 0, len(data)
        while position < end and self.problem is None:
            if self._skip:
                step = min(self._skip, end - position)
                self._skip -= step
                position += step
            elif self._state == "end":
                self._trailing += end - position
                return
            else:
                take = min(self._need - len(self._header), end - position)
                self._header += data[position:position + take]
                position += take
                if len(self._header) == self._need:
                    header = bytes(self._header)
                    self._header.clear()
                    self._read(header)

    def _read(self, header: bytes) -> None:
        if self._state == "start":
            if header[:4] != _ZSTD_MAGIC:
                self.problem = "-cache file is not a zstd frame"
                return
            descriptor = header[4]
            if descriptor & 0x08:
                self.problem = "-cache file's zstd frame header has its reserved bit set (corrupt)"
                return
            single_segment = bool(descriptor & 0x20)
            self._checksum = bool(descriptor & 0x04)
            self._content_bytes = (int(single_segment), 2, 4, 8)[descriptor >> 6]
            rest = (not single_segment) + (0, 1, 2, 4)[descriptor & 0x03] + self._content_bytes
            self._state, self._need = ("header", rest) if rest else ("block", 3)
        elif self._state == "header":
            if self._content_bytes:
                size = int.from_bytes(header[-self._content_bytes:], "little")
                self.content_size = size + 256 if self._content_bytes == 2 else size
            self._state, self._need = "block", 3
        else:
            value = int.from_bytes(header, "little")
            kind, size = (value >> 1) & 0x03, value >> 3
            if kind == 3 or size > ZSTD_BLOCK_MAX:
                self.problem = "-cache file holds a zstd block that cannot be (corrupt)"
                return
            if kind == 2:
                self.compressed += 1
            else:
                self.plain += size
            self._skip = 1 if kind == 1 else size  # an RLE block repeats its one byte
            if value & 1:  # the last block
                self._skip += 4 if self._checksum else 0
                self._state = "end"

    def finish(self) -> str | None:
        """Why the bytes fed are not one whole zstd frame, or None."""
        if self.problem is not None:
            return self.problem
        if self._state != "end" or self._skip or self._header:
            return _TRUNCATED
        if self._trailing:
            return f"-cache file holds {self._trailing} bytes after the end of its zstd frame"
        size = self.content_size
        if size is not None and not self.plain <= size <= self.plain + self.compressed * ZSTD_BLOCK_MAX:
            return f"-cache file's zstd header announces {size} bytes, which its blocks cannot hold (corrupt)"
        return None


def zstd_problem(chunks: Iterable[bytes]) -> str | None:
    """Why the bytes in ``chunks`` are not one whole zstd frame (:class:`ZstdFrame`), or None."""
    frame = ZstdFrame()
    for chunk in chunks:
        frame.feed(chunk)
    return frame.finish()


def _examine(path: str | os.PathLike[str]) -> tuple[str | None, int | None]:
    """Why the ``-cache`` file at ``path`` cannot be what JAX wrote (None: it can), and the
    CRC-32 of its bytes (None unless it can).

    JAX compresses with zstd when ``zstandard`` (or Python 3.14's ``compression.zstd``) is
    importable, else with zlib, and puts a 4-byte compile time before the executable. A zstd
    frame is walked block by block (:class:`ZstdFrame`: a frame that ends before its last
    block is truncated) and, where a zstd library is installed, also decompressed; it must
    then give the bytes its header announces. A zlib stream must reach its end marker. The
    file is streamed: never more than a chunk of it or of its output is held, and the output
    is bounded (:data:`VERIFY_MAX_PLAIN`).
    """
    try:
        size = os.lstat(path).st_size
        chunks = safe_io.iter_chunks(path)
        first = next(chunks, b"")
    except safe_io.NotRegularFile as exc:
        return f"-cache is {exc.what}, not a regular file", None
    except OSError:
        return None, None  # gone or unreadable: not this check's business
    crc = zlib.crc32(first)
    limit = max(VERIFY_MAX_PLAIN, VERIFY_MAX_RATIO * size)
    frame = ZstdFrame() if first.startswith(_ZSTD_MAGIC) else None
    decompressor = _zstd_decompressor() if frame else zlib.decompressobj()
    inflate = None if decompressor is None else _Inflate(decompressor, limit)
    try:
        chunk: bytes | None = first
        while chunk is not None:
            if frame is not None:
                frame.feed(chunk)
            if inflate is not None and not inflate.done:
                inflate.feed(chunk)
                if inflate.total > limit:
                    break
            chunk = next(chunks, None)
            if chunk is not None:
                crc = zlib.crc32(chunk, crc)
    except OSError:
        return None, None  # unreadable midway: not this check's business
    except Exception as exc:  # noqa: BLE001 - zlib.error, zstandard.ZstdError: both mean corrupt
        return f"-cache file does not decompress ({type(exc).__name__}: {exc})", None
    finally:
        chunks.close()
    plain = inflate.total if inflate is not None else None
    if (plain if plain is not None else frame.plain if frame is not None else 0) > limit:
        return (f"-cache file decompresses to more than {limit} bytes from {size} "
                "(a decompression bomb?)"), None
    if frame is not None:
        problem = frame.finish()
        if problem is not None:
            return problem, None
        if plain is None:
            plain = frame.content_size
    if inflate is not None and (not inflate.decompressor.eof or (
            frame is not None and frame.content_size is not None and plain != frame.content_size)):
        return _TRUNCATED, None
    if plain is not None and plain <= 4:
        return "-cache file holds no executable", None
    return None, crc


def undecompressable(path: str | os.PathLike[str]) -> str | None:
    """Why the ``-cache`` file at ``path`` cannot be what JAX wrote, or None (:func:`_examine`)."""
    return _examine(path)[0]


#: An ``-atime`` file whose mtime is further than this from the time it holds was copied or
#: restored without its times (JAX writes the file and its content at once); its content is
#: then the only true last use. (Generous: a network filesystem's server clock may differ.)
COPIED_TOLERANCE_SECONDS = 300.0
COPIED = "-atime (file times ignored: copied without them)"


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
    folder_text = os.fspath(folder)
    caches: list[tuple[str, str, os.stat_result]] = []  # (key, path, lstat): a list is cheaper
    atimes: dict[str, tuple[str, os.stat_result]] = {}
    plain: dict[str, tuple[str, os.stat_result]] = {}  # jax 0.4.30's <key> without a suffix
    temps: list[JaxEntry] = []
    now = time.time()
    started = time.monotonic()
    match = _FILE_RE.fullmatch
    tail = _HASH_TAIL.fullmatch
    try:
        listing = os.scandir(folder_text)
    except (FileNotFoundError, NotADirectoryError):
        return []
    with listing:
        for item in listing:
            name = item.name
            size = len(name)
            # The common names by slicing (a third of the regular expression's cost); the
            # "-<sha256 hex>" before the suffix is checked once per key, below.
            suffix = name[-5:]
            if size > 71 and (suffix == "cache" or suffix == "atime") and name[-6] == "-":
                try:
                    info = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                if suffix == "cache":
                    caches.append((name[:-6], item.path, info))
                else:
                    atimes[name[:-6]] = (item.path, info)
                continue
            found = match(name)
            if found is None:
                promoted = name.startswith(safe_io.PROMOTION_TEMP_PREFIX)
                if temp_grace is not None and (promoted or _TEMP_RE.match(name)):
                    try:
                        info = item.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if now - info.st_mtime >= temp_grace:
                        temps.append(JaxEntry(
                            key=name, name="(temporary)", cache_file=None, atime_file=item.path,
                            size=info.st_size if stat.S_ISREG(info.st_mode) else 0,
                            last_use=info.st_mtime,
                            problem="stale temporary file of an interrupted "
                                    + ("promotion from a node-local tier" if promoted else "prune")))
                continue
            try:
                info = item.stat(follow_symlinks=False)
            except OSError:
                continue
            key, suffix = found.group("key", "suffix")
            (atimes if suffix == "atime" else plain)[key] = (item.path, info)
    if plain:  # one entry per key: a <key>-cache name wins over a plain <key>
        named = {key for key, _path, _info in caches}
        caches += [(key, path, info) for key, (path, info) in plain.items() if key not in named]
    # JAX keeps -atime files and a .lockfile only with a size cap; a lone -atime proves nothing.
    capped = os.path.lexists(os.path.join(folder_text, LOCK_NAME)) \
        or (bool(atimes) and any(key in atimes for key, _path, _info in caches))
    young = time.time() - WRITE_GRACE_SECONDS
    entries = []
    isreg = stat.S_ISREG
    for key, path, info in caches:
        atime = atimes.pop(key, None) if atimes else None
        if not tail(key, len(key) - 65):
            continue  # "...-cache" without a hash before it: not JAX's
        if not isreg(info.st_mode) or (atime is not None and not isreg(atime[1].st_mode)):
            entries.append(_pair(key, (path, info), atime, verify_after, young, record, capped))
            continue
        # Regular files (the common case, kept short): see _pair for the general one.
        size = info.st_size
        last_use = info.st_mtime
        source = "mtime"
        if atime is not None:
            sidecar = atime[1]
            size += sidecar.st_size
            if sidecar.st_mtime > last_use:
                last_use = sidecar.st_mtime
            recorded = None
            if record is not None:  # _recorded_atime, inlined: this runs once per entry
                digest = hash((2, sidecar.st_ino, sidecar.st_size, sidecar.st_mtime_ns,
                               sidecar.st_ctime_ns)) & _NO_TIME
                known = record.known.get(digest)
                if known is not None:
                    if record.complete:
                        record.kept[digest] = known
                    recorded = None if known == _NO_TIME else known / 1e9
            if recorded is None:
                recorded = _recorded_atime(key, atime[0], sidecar, record)
            if recorded is not None:
                if abs(sidecar.st_mtime - recorded) > COPIED_TOLERANCE_SECONDS:
                    last_use, source = recorded, COPIED
                else:
                    last_use, source = max(last_use, recorded), "-atime"
        if info.st_size == 0:
            problem: str | None = "empty -cache file (written while the disk was full)"
        elif verify_after is not None and verify_after < info.st_mtime < young:
            problem = _verify(key, path, info, record)
        else:
            problem = None
        entries.append(JaxEntry(key, key[:-65], path, None if atime is None else atime[0], size,
                                last_use, problem, capped and atime is None and problem is None,
                                source))
    for key, atime in atimes.items():  # -atime files without their -cache
        if not tail(key, len(key) - 65):
            continue
        entries.append(_pair(key, None, atime, verify_after, young, record, capped))
    if record is not None:
        _recheck(entries, record, time.monotonic() - started)
    return entries + temps


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
        recorded = _recorded_atime(key, atime[0], atime[1], record)
        if recorded is not None:
            if abs(atime[1].st_mtime - recorded) > COPIED_TOLERANCE_SECONDS:
                last_use, source = recorded, COPIED
            else:
                last_use, source = max(last_use, recorded), "-atime"
    if problem is not None:
        pass
    elif cache is None:
        problem = "-atime without -cache"
    elif cache[1].st_size == 0:
        problem = "empty -cache file (written while the disk was full)"
    elif verify_after is not None and verify_after < cache[1].st_mtime < young:
        problem = _verify(key, cache[0], cache[1], record)
    return JaxEntry(key, key[:-65], cache[0] if cache else None, atime[0] if atime else None, size,
                    last_use, problem, capped and cache is not None and atime is None and problem is None,
                    source)


#: Why a JAX entry whose bytes changed after it was verified is broken.
CHANGED = ("-cache file's bytes changed after it was verified whole (damaged in place, its size "
           "kept: JAX never rewrites an entry)")


def _crc(path: str, info: os.stat_result) -> int | None:
    """The CRC-32 of the bytes of the ``-cache`` file ``info`` (its ``lstat``) describes; None
    when it is gone, unreadable or no longer that file. (One read for most entries: re-reading
    them must stay cheap beside a scan.)"""
    try:
        if info.st_size <= safe_io.CHUNK:
            return zlib.crc32(safe_io.read_known(path, safe_io.CHUNK, info))
        crc = 0
        for chunk in safe_io.iter_chunks(path):
            crc = zlib.crc32(chunk, crc)
        return crc
    except OSError:
        return None


def _verify(key: str, path: str, info: os.stat_result, record: verified.Record | None) -> str | None:
    """:func:`undecompressable`, remembered in ``record``: an entry verified whole before
    (same name, inode and size) is not decompressed again, only offered to be read again
    (:func:`_recheck`); with ``recheck_all`` every entry is verified again, and the CRC-32 of
    its bytes must still be the one recorded."""
    if record is None:
        return undecompressable(path)
    digest = verified.digest(1, int(key[-16:], 16), info.st_ino, info.st_size)  # key: <name>-<hex>
    known = record.get(digest)
    if known is not None:
        if known == verified.DAMAGED:
            return CHANGED
        record.candidate(digest, (digest, known, path, info, key))
        return None
    problem, crc = _examine(path)
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
        crc = _crc(path, info)
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
