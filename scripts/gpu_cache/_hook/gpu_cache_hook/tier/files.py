"""The node-local tier's files (``tier``): each tier's kind folders opened once by
descriptor and judged by the trust rules (ours or root's, or the team's; nobody else may
write), every name below reached from them one at a time without following a link, and the
copies' primitives: a temporary file linked to its final name only where that name is free.
Standard library only, Python 3.9+.
"""

import errno
import os
import stat
import threading
import zlib

from ..names import TEMP_PREFIX
from ..owners import owner_problem

DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Errors of os.link that mean "no hard links here": rename-if-absent instead.
NO_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS)
CHUNK = 1 << 20


class Refused(OSError):
    """A folder the tier may not use (not ours, writable by others, a link)."""


def plain(name):
    """Whether ``name`` is one plain file name (no folder, no dot-entry, not ours)."""
    return (isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name
            and name not in (".", "..") and not name.startswith(TEMP_PREFIX))


def folder_problem(fd, team_gid):
    """Why the folder open at ``fd`` may hold what another user put there
    (``owners.owner_problem``), or that it is no folder; None."""
    info = os.fstat(fd)
    return owner_problem(info, team_gid, where=fd) if stat.S_ISDIR(info.st_mode) else "not a folder"


class Side:
    """One tier's root (local or shared): its kind folders, opened by the trust rules once."""

    def __init__(self, root, create):
        self.root = root
        self.create = create  # make missing kind folders (the local tier: ours)
        self.fds = {}  # kind -> fd, or the Refused of that kind
        self.mutex = threading.Lock()
        self.team_gid = None
        try:
            info = os.stat(root)
            if info.st_mode & stat.S_IWGRP and not info.st_mode & stat.S_IWOTH:
                self.team_gid = info.st_gid  # a team's root (shared_group mode)
        except OSError:
            pass
        # the mode of the folders it makes (an entry's folder, a tree's folders): as the tools
        # make them under a usual umask, never writable by others (the rules would refuse it)
        self.dir_mode = 0o700 if create else 0o775 if self.team_gid is not None else 0o755

    def folder(self, kind):
        """The descriptor of ``<root>/<kind>``. Raises Refused or OSError."""
        with self.mutex:
            return self._folder(kind)

    def _folder(self, kind):
        known = self.fds.get(kind)
        if isinstance(known, int):
            return known
        if known is not None:
            raise known
        path = os.path.join(self.root, kind)
        try:
            try:
                fd = os.open(path, DIR)
            except FileNotFoundError:
                if not self.create:
                    raise
                os.makedirs(path, 0o700, exist_ok=True)
                fd = os.open(path, DIR)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                exc = Refused(exc.errno, f"{path} is a link or not a folder")
            if isinstance(exc, Refused):
                self.fds[kind] = exc
            raise exc from None
        why = folder_problem(fd, self.team_gid)
        if why:
            os.close(fd)
            refused = Refused(errno.EPERM, f"{path} is {why}")
            self.fds[kind] = refused
            raise refused
        self.fds[kind] = fd
        return fd

    def sub(self, kind, name, make):
        """The descriptor of the folder ``<root>/<kind>/<name>`` (an entry's), checked like a
        kind folder; the caller closes it. Raises Refused or OSError (FileNotFoundError)."""
        parent = self.folder(kind)
        if make:
            try:
                os.mkdir(name, self.dir_mode, dir_fd=parent)
            except FileExistsError:
                pass
        try:
            fd = os.open(name, DIR, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(exc.errno, f"{kind}/{name} is a link or not a folder") from None
            raise
        why = folder_problem(fd, self.team_gid)
        if why:
            os.close(fd)
            raise Refused(errno.EPERM, f"{kind}/{name} is {why}")
        return fd


def harden(fd, folder):
    """No write for others (nor for the group, unless ``folder`` is a team's) on a file the tier
    just made, whatever the umask let through (gpu_cache.core.safe_io.harden's rule)."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    team = folder.st_mode & stat.S_IWGRP and not folder.st_mode & stat.S_IWOTH
    safe = mode & ~(0o002 if team else 0o022)
    if safe != mode:
        os.fchmod(fd, safe)


def copy_fd(src, dst):
    """Copy the rest of ``src`` into ``dst``: the bytes copied, and their CRC-32."""
    size = crc = 0
    while True:
        chunk = os.read(src, CHUNK)
        if not chunk:
            return size, crc
        crc = zlib.crc32(chunk, crc)
        size += write_all(dst, [chunk])


def write_all(fd, chunks):
    size = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[written:]
            size += written
    return size


def read_all(fd, size, limit=1 << 20):
    """The content of a small file (an entry's manifest), at most ``limit`` bytes."""
    if size > limit:
        raise OSError(errno.EFBIG, f"a manifest over {limit} bytes")
    chunks = []
    while True:
        chunk = os.read(fd, limit)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def link_new(tmp, tmp_fd, dst_fd, name):
    """Give the file ``tmp`` the name ``name`` when that name is free: a hard link (atomic,
    never over an existing file), or where links are not supported a rename when the name is
    free. Whether it was placed."""
    try:
        os.link(tmp, name, src_dir_fd=tmp_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in NO_LINK:
            raise
    if exists_at(dst_fd, name):
        return False
    os.rename(tmp, name, src_dir_fd=tmp_fd, dst_dir_fd=dst_fd)
    return True


def exists_at(folder_fd, name):
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        return True
    except OSError:
        return False


def exists(side, kind, name):
    try:
        return exists_at(side.folder(kind), name)
    except OSError:
        return False


def open_below(side, kind, rel, make):
    """The descriptor of the folder ``<kind>/<rel>`` of ``side``, walked one name at a time
    without following a link (made where missing and ``make``), each checked by the rules."""
    fd = os.dup(side.folder(kind))
    try:
        for name in [part for part in rel.split(os.sep) if part]:
            if name in (".", ".."):
                raise Refused(errno.EPERM, f"{rel} is not a plain path")
            if make:
                try:
                    os.mkdir(name, side.dir_mode, dir_fd=fd)
                except FileExistsError:
                    pass
            sub = os.open(name, DIR, dir_fd=fd)
            os.close(fd)
            fd = sub
            why = folder_problem(fd, side.team_gid)
            if why:
                raise Refused(errno.EPERM, f"{kind}/{rel} is {why}")
        return fd
    except BaseException:
        os.close(fd)
        raise
