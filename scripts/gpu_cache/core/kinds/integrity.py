"""Integrity for every sealed kind, once (docs/kinds.md): each file of an entry found whole by
its kind's own check is sealed in the folder's verification record (:mod:`gpu_cache.core.verified`)
with the CRC-32 of its bytes, keyed by its path in the folder, inode and size; a later verifying
scan that finds the same file (same inode and size: the tools write entries through a new file
and a rename, never in place) with other bytes has found damage: one flipped bit, the mtime
put back, is a broken entry that prune removes and stats reports.

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
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0)
#: The record's key of the seal of the file ``relative`` (its path in the kind folder) of inode
#: ``ino`` and ``size`` bytes: ``seal_key(relative, ino, size)``; its value is the CRC-32 of the
#: file's bytes. The startup hook's, which looks seals up before the node-local tier serves a
#: file of the shared one (``_hook/gpu_cache_hook/seals.py``); JAX's own check records its
#: entries' CRCs so too.
seal_key = seals.seal_key


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
    """Whether one file of an entry is damaged: its seal (by path, inode and size) holds another
    CRC. A file not sealed yet is sealed once it is settled."""
    digest = seal_key(relative, info.st_ino, info.st_size)
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
