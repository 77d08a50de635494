"""Locks on files under a cache root that someone else may have put there: the safe-I/O
layer's locks (the files and folders are in :mod:`gpu_cache.core.safe_io`).

They follow the lock rules of docs/guarantees.md: nobody but you (and the team, in a
group-writable folder) can open a lock file, so nobody else can hold it; one that others could
open is replaced, never waited on. The rules, and how a lock file is made and set aside, are
the startup hook's, which its single-flight applies too (``_hook/gpu_cache_hook/locks.py``, a
standard-library module this imports).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpu_cache._hook.gpu_cache_hook import locks as lock_rules
from gpu_cache.core.safe_io import NotRegularFile


class LockTimeout(OSError):
    """Another process held the lock for longer than the timeout."""


_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class NotPrivate(OSError):
    """A lock file that others could hold, and that cannot be replaced by one they cannot."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(errno.EPERM, f"a lock file others could hold ({why})", str(path))


_LOCK_FLAGS = os.O_RDWR | lock_rules.OPEN


#: Why the file ``info`` breaks the lock rules, or None: ``lock_file_problem(info, group_bits,
#: gid)``, a regular file of yours (or, in a team's folder, whose ``group_bits`` are 0o060, of a
#: member, in the folder's group ``gid``) that nobody else can open.
lock_file_problem = lock_rules.private


def _open_lock(path: Path, create: bool, replace: bool) -> int | None:
    """A read-write descriptor of the lock file at ``path``, by the lock rules (None: missing
    and not ``create``). Never follows a symlink, never truncates, never opens a device; a
    file that breaks the rules is set aside and made anew (only when ``create`` was asked or
    something stood at the name).

    Raises:
        NotRegularFile: a folder is there.
        NotPrivate: it breaks the rules and ``replace`` is False, or it cannot be replaced.
    """
    folder = os.stat(path.parent)
    group_bits = 0o060 if folder.st_mode & stat.S_IWGRP else 0
    replaced = False
    for _attempt in range(4):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            if not (create or replaced):
                return None
            try:
                return lock_rules.create(str(path), group_bits)
            except FileExistsError:
                continue
        if stat.S_ISDIR(info.st_mode):
            raise NotRegularFile(path, "a folder")
        fd, why = lock_rules.open_named(str(path), info, group_bits, folder.st_gid)
        if fd is not None:
            return fd
        if why is None:  # replaced meanwhile: look again
            continue
        if not replace:
            raise NotPrivate(path, why)
        try:
            lock_rules.set_aside(str(path), info)
        except OSError as exc:
            raise NotPrivate(path, f"{why}; cannot replace it: {exc.strerror or exc}") from None
        replaced = True
    raise NotRegularFile(path, "keeps being replaced by something else")


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a lock on an unlinked or
    replaced file excludes nobody)."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextmanager
def exclusive_lock(path: str | os.PathLike[str], timeout: float, create: bool = True,
                   replace: bool = True) -> Iterator[bool]:
    """Hold ``flock(LOCK_EX)`` on the lock file at ``path``; yields whether a lock is held.

    By the lock rules (docs/guarantees.md): the lock file is one that nobody but you (and, in
    a group-writable folder, its group) can open, so nobody else can hold it: made with an
    exclusive create, mode 0600 (0660), whatever the umask. Anything else at ``path`` (a
    symlink, FIFO, socket or device, another user's file, a file others may open, as JAX's
    ``filelock`` makes ``.lockfile`` with the job's umask) is never waited on: a fresh lock file
    is renamed over the name (never following it), and a lock taken on a file that lost its
    name meanwhile is taken again on the new one. The file is never truncated. It excludes
    ``filelock.FileLock`` holders of the same file, which use ``flock`` too (filelock 4.x
    takes a lock on a file unlinked meanwhile again). With ``create=False`` a missing file
    yields False (nothing to lock). ``replace=False`` (a dry run, which must change nothing):
    a file that breaks the rules raises instead of being replaced. Where the filesystem has no
    ``flock`` (``ENOLCK``, ``ENOSYS``: Lustre ``noflock``, NFS without a lock daemon) it yields
    False too: nothing there can lock (``filelock``, which JAX uses, fails the same way), and
    the caller goes on without (two prunes at once then both remove whole entries, and a file
    already gone is no error).

    Raises:
        LockTimeout: another process held it for ``timeout`` seconds.
        NotRegularFile: ``path`` is a folder.
        NotPrivate: with ``replace=False``, or where it cannot be replaced, a lock file others
            could hold (never waited on).
        OSError: it cannot be opened or created (a read-only filesystem).
    """
    path = Path(path)
    deadline = time.monotonic() + timeout
    while True:
        fd = _open_lock(path, create, replace)
        if fd is None:
            yield False
            return
        try:
            locked = _flock(fd, path, deadline)
        except BaseException:
            os.close(fd)
            raise
        if locked and not _still_named(fd, path):
            os.close(fd)  # releases the lock on the orphaned file
            continue
        break
    try:
        if not locked:
            yield False  # no flock on this filesystem: nothing can be locked here
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _flock(fd: int, path: Path, deadline: float) -> bool:
    """Take ``flock(LOCK_EX)`` before ``deadline`` (``time.monotonic``); False where the
    filesystem has no flock.

    Raises:
        LockTimeout: not before ``deadline``.
    """
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(errno.EAGAIN, "held by another process", str(path)) from None
            time.sleep(0.05)
        except OSError as exc:
            if exc.errno in _NO_FLOCK:
                return False
            raise


def hold_if_free(path: str) -> int | None:
    """A descriptor holding ``flock`` on another tool's lock file at ``path`` (Inductor's),
    taken without waiting, while its entry is removed: a writer never sees its entry vanish
    midway. None: there is none, or it is not a regular file (the caller removes the name).

    Raises:
        OSError: EBUSY, another process holds it (its entry is being written).
    """
    try:
        fd = os.open(path, _LOCK_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            return None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(errno.EBUSY, "being compiled (its lock is held)", path) from None
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            os.close(fd)
            raise
    return fd
