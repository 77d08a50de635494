"""Integrity for every sealed kind, once (docs/kinds.md): each file of an entry found whole by
its kind's own check is sealed in the folder's verification record (:mod:`gpu_cache.core.verified`)
with the CRC-32 of its bytes, keyed by its path in the folder, inode (number and generation) and
size; a later verifying scan that finds the same file (same inode and size: the tools write
entries through a new file and a rename, never in place) with other bytes has found damage: one
flipped bit, the mtime put back, is a broken entry that prune removes and stats reports.

A seal judges only the file it sealed. ext4 gives a new file the inode number just freed: a file
rewritten where a damaged one was removed, at its path and of its size, matched the DAMAGED
seal and was removed again. The inode's generation (:func:`seals.generation`) differs for a new
inode where the filesystem keeps one; a scan keeps it beside the seal under the file's change
time (:func:`seals.stamp_key`), so it opens a file only when that changed. Where the filesystem
keeps none (tmpfs, NFS, overlayfs) prune drops the seals of the entries it removes
(:func:`forget`).

A scan does not read a sealed file again while its inode and size are as sealed; it reads some of
them again in turn (:meth:`gpu_cache.core.verified.Record.rechecks`, within a share of its own
time, as JAX's CRCs are) and ``doctor --fix`` (``recheck_all``) reads all. A file written within
the grace period may still be being written, and is sealed later. Files are read with
``O_NOATIME`` (a read must not count as a use where a kind's last use is a file's access time);
a file that cannot be read so (another user's) is left to its owner's prune.
"""

from __future__ import annotations

import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_cache._hook.gpu_cache_hook import seals
from gpu_cache.core import safe_io, verified

if TYPE_CHECKING:
    from gpu_cache.core.kinds.kind import Entry

#: What a scan says of an entry whose sealed file changed in place.
DAMAGED = ("its bytes changed after gpu-cache sealed it whole, its size kept (damaged in place: a "
           "storage fault, or a write with the old mtime put back)")
_READ = safe_io.READ_FLAGS | safe_io.NOATIME
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: The devices whose filesystem keeps no inode generation: their files are not opened for one.
_NO_GENERATION: set[int] = set()


def seal_of(record: verified.Record, relative: str, path: str, info: os.stat_result,
            ask: bool = True) -> int | None:
    """The record's key of the seal of the file ``relative`` (its path in the kind folder; at
    ``path``, ``info`` its ``lstat``): :func:`seals.seal_key` of its inode's number, generation
    and size, as the startup hook keys it before the node-local tier serves a file of the shared
    one; JAX's own check records its entries' CRCs so too. The generation is the one kept under
    the file's change time, else asked of the file (kept for the next scan) where ``ask``. None:
    not asked, or the file cannot be opened (another user's, or gone)."""
    stamp = seals.stamp_key(relative, info.st_ino, info.st_size, info.st_ctime_ns)
    generation = record.get(stamp)
    if generation is None and not ask:
        return None
    if generation is None:
        generation = generation_of(path, info)
        if generation is None:
            return None
        record.put(stamp, generation)
    return seals.seal_key(relative, info.st_ino, info.st_size, generation)


def generation_of(path: str, info: os.stat_result) -> int | None:
    """The generation of the inode of the file ``info`` (its ``lstat``) describes (0 where its
    filesystem keeps none: :func:`seals.generation`); None when it is gone or no longer that file,
    or cannot be opened."""
    if info.st_dev in _NO_GENERATION:
        return 0
    try:
        fd = os.open(path, _OPEN)
    except OSError:
        return None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            return None
        found = seals.generation(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    if found is None:  # the filesystem keeps none: asked once per device
        _NO_GENERATION.add(info.st_dev)
        return 0
    return found


def forget(record: verified.Record, folder: Path, tops: list[str]) -> None:
    """Drop the seals of the files under ``tops`` (an entry's files or folders in ``folder``,
    about to be removed), so that none judges a later file that gets an inode of theirs where
    the filesystem keeps no generation to tell them apart."""
    base = len(os.fspath(folder)) + 1
    for top in tops:
        for path, info in files_of(top):
            relative = path[base:]
            stamp = seals.stamp_key(relative, info.st_ino, info.st_size, info.st_ctime_ns)
            generation = record.current(stamp)
            if generation is not None:
                record.drop(stamp)
                record.drop(seals.seal_key(relative, info.st_ino, info.st_size, generation))


def files_of(path: str) -> Iterable[tuple[str, os.stat_result]]:
    """The regular files of an entry whose file or folder is ``path`` (a folder: every regular
    file under it, no link followed), each with its ``lstat``."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode):
        yield path, info
        return
    if not stat.S_ISDIR(info.st_mode):
        return
    pending = [path]
    while pending:
        for _name, child, child_info in safe_io.listing(pending.pop()):
            if stat.S_ISDIR(child_info.st_mode):
                pending.append(child)
            elif stat.S_ISREG(child_info.st_mode):
                yield child, child_info


def crc_of(path: str, info: os.stat_result) -> int | None:
    """The CRC-32 of the bytes of the file ``info`` (its ``lstat``) describes, read without moving
    its access time; None when it is gone, is no longer that file, or cannot be read so."""
    try:
        fd = os.open(path, _READ)
    except OSError:
        return None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino, now.st_size) != (info.st_dev, info.st_ino, info.st_size) \
                or not stat.S_ISREG(now.st_mode):
            return None
        crc = 0
        while chunk := os.read(fd, safe_io.CHUNK):
            crc = zlib.crc32(chunk, crc)
        return crc
    except OSError:
        return None
    finally:
        os.close(fd)


def check(folder: Path, found: list[Entry], paths: Callable[[Entry], list[str]], record: verified.Record,
          grace_seconds: float) -> None:
    """Seal the files of each entry of ``found`` that its kind's check found whole, or find the
    damage of one sealed before (its ``problem`` then says so). ``paths``: an entry's files or
    folders. ``record``: the folder's verification record, which keeps the seals; the caller
    saves it."""
    started = time.monotonic()
    base = len(os.fspath(folder)) + 1
    settled = time.time() - grace_seconds
    for entry in found:
        if entry.problem is not None:
            continue
        for top in paths(entry):
            for path, info in files_of(top):
                if _damaged(path[base:], path, info, record, entry, settled):
                    entry.problem = DAMAGED
                    break
            if entry.problem is not None:
                break
    for digest, known, path, info, entry in record.rechecks(time.monotonic() - started):
        crc = crc_of(path, info)
        if crc is not None and crc != known:
            record.put(digest, verified.DAMAGED)
            entry.problem = DAMAGED


def _damaged(relative: str, path: str, info: os.stat_result, record: verified.Record, entry: Entry,
             settled: float) -> bool:
    """Whether one file of an entry is damaged: its seal (:func:`seal_of`) holds another CRC. A
    file not sealed yet is sealed once it is settled."""
    digest = seal_of(record, relative, path, info, ask=info.st_mtime <= settled)
    if digest is None:
        return False  # may still be being written (sealed by a later scan), or another user's
    known = record.get(digest)
    if known == verified.DAMAGED:
        return True
    if known is not None:
        record.candidate(digest, (digest, known, path, info, entry))
        return False
    if info.st_mtime > settled:
        return False  # may still be being written: sealed by a later scan
    crc = crc_of(path, info)
    if crc is None:
        return False
    before = record.previous(digest)  # (recheck_all: what get did not tell)
    if before is not None and before != crc:
        record.put(digest, verified.DAMAGED)
        return True
    record.put(digest, crc)
    return False
