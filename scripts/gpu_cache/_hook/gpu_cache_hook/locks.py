"""The lock rules for single-flight's files and folders, and who holds a lease: the parts of
single-flight (flight) that keep no state. The rules are docs/guarantees.md's "Locks", and this
is their one home: gpu_cache.core.safe_locks imports it for gpu-cache's own locks, so it imports
nothing but the standard library and the owner rules beside it. Python 3.9+.
"""

import errno
import os
import stat

from .owners import acl_problem  # (relative: the host imports this module as gpu_cache._hook...)

#: Open flags of every lock and lease file: never through a link, never blocking.
OPEN = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
#: The first line of a lease file.
MAGIC = b"gpu-cache lease 1\n"

_SELF = None


def folder_problem(info, above, team, where):
    """Why the lock folder ``where`` (``info``: its lstat; ``above``: its parent's stat) breaks
    the lock rules, or None: a folder of ours that only we, or in a team's folder (``team``) its
    group, may reach, by its mode and its ACL (another account that may add lock files there
    could hold the locks a job waits on)."""
    if not stat.S_ISDIR(info.st_mode):
        return f"is {describe(info.st_mode)}, not a folder"
    if info.st_uid != os.geteuid() and not (team and info.st_gid == above.st_gid):
        return f"is owned by uid {info.st_uid}"
    allowed = 0o2770 if team and info.st_gid == above.st_gid else 0o700
    if stat.S_IMODE(info.st_mode) & ~allowed & 0o777:
        return f"has mode {stat.S_IMODE(info.st_mode):04o}: others could reach its lock files"
    why = acl_problem(where, info, above.st_gid if allowed & 0o070 else None)
    return f"is {why}" if why else None


def describe(mode):
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return what
    return "a regular file"


def private(info, group_bits, gid):
    """Why the file ``info`` breaks the lock rules, or None: a regular file of ours (or, in a
    team's folder, whose ``group_bits`` are 0o060, of a member, in the folder's group ``gid``)
    that nobody else can open."""
    if not stat.S_ISREG(info.st_mode):
        return describe(info.st_mode)
    if info.st_uid != os.geteuid() and not (group_bits and info.st_gid == gid):
        return f"owned by uid {info.st_uid}"
    if stat.S_IMODE(info.st_mode) & ~(0o600 | group_bits):
        return f"mode {stat.S_IMODE(info.st_mode):04o}, which others may open"
    return None


def open_named(path, named, group_bits, gid):
    """Open the lock file ``path``, which ``named`` (its lstat) says is there, by the lock rules
    (``private``): ``(fd, None)``; ``(None, why)`` where it breaks them (a folder, link or device
    is never opened); ``(None, None)`` where it was removed or replaced meanwhile: look again."""
    if not stat.S_ISREG(named.st_mode):
        return None, describe(named.st_mode)
    try:
        fd = os.open(path, os.O_RDWR | OPEN)
    except FileNotFoundError:
        return None, None
    except OSError as exc:  # another user's file, or swapped for a link or FIFO
        return None, exc.strerror or str(exc)
    info = os.fstat(fd)
    why = None  # (replaced meanwhile)
    if (info.st_dev, info.st_ino) == (named.st_dev, named.st_ino):
        why = private(info, group_bits, gid)
        if why is None:
            return fd, None
    os.close(fd)
    return None, why


def create(path, group_bits):
    """Create ``path`` exclusively by the lock rules; its descriptor (O_RDWR).

    Raises:
        FileExistsError: the name exists (also where sshfs said EPERM for it).
        OSError: as ``open`` does, or the new file is not ours (a filesystem that maps owners).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN, 0o600)
    except PermissionError:
        # sshfs answers an exclusive create of a name another node just made with EPERM (SFTP's
        # generic failure), not EEXIST: taken for "locks do not work here", it turned
        # single-flight off for the whole process on CI (#22)
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "exists", path) from None
        raise
    try:
        os.fchmod(fd, 0o600 | group_bits)  # whatever the umask or a default ACL
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"files made here belong to uid {info.st_uid}, not to "
                          f"uid {os.geteuid()}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def set_aside(path, judged, dir_fd=None):
    """Remove what ``path`` names (relative to the folder ``dir_fd``, if given), which was found
    to break the lock rules (``judged``: its lstat), so that an exclusive create makes the lock
    file anew: one creator wins, however many processes replace the name at once. It is renamed
    aside first, and put back when it turned out to be a lock file another process made
    meanwhile. Never follows a link. (The jax-triton store sets a refused entry aside so.)

    Raises:
        OSError: it cannot be renamed (a sticky folder and another user's file).
    """
    import uuid

    aside = os.path.join(os.path.dirname(path), f".{uuid.uuid4().hex}.aside")
    try:
        os.rename(path, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileNotFoundError:
        return
    moved = os.lstat(aside, dir_fd=dir_fd)
    if (moved.st_dev, moved.st_ino) != (judged.st_dev, judged.st_ino):
        try:  # a fresh lock file of another process: back in place
            os.link(aside, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            pass
    if stat.S_ISDIR(moved.st_mode):
        try:
            os.rmdir(aside, dir_fd=dir_fd)
        except OSError:
            pass  # not empty: it stays aside, under a hidden name no lock or lease ever takes
        return
    os.unlink(aside, dir_fd=dir_fd)


#: What ``open`` says of a name that is no file to read: a link (O_NOFOLLOW), a socket.
_NOT_A_FILE = (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP)


def read_small(path, limit=8192):
    """``(content, stat)`` of what ``path`` names, opened without following a link and never
    blocking; None where there is no such name. A link, folder, socket or device is never read:
    its content is empty and its stat says what it is (the caller sets it aside)."""
    try:
        fd = os.open(path, os.O_RDONLY | OPEN)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in _NOT_A_FILE:
            raise
        try:
            return b"", os.lstat(path)
        except FileNotFoundError:
            return None
    try:
        info = os.fstat(fd)
        return (os.read(fd, limit) if stat.S_ISREG(info.st_mode) else b""), info
    finally:
        os.close(fd)


def self_id():
    """What names this process in its leases: host, boot id, pid namespace, pid, start time."""
    global _SELF
    if _SELF is None or _SELF[0] != os.getpid():
        import socket

        _SELF = (os.getpid(), {
            "host": socket.gethostname()[:200], "boot": read_text("/proc/sys/kernel/random/boot_id"),
            "pidns": link("/proc/self/ns/pid"), "pid": str(os.getpid()),
            "start": start_time(os.getpid())})
    return _SELF[1]


def read_text(path):
    try:
        with open(path, "rb") as stream:
            return stream.read(200).decode("ascii", "replace").strip()
    except OSError:
        return ""


def link(path):
    try:
        return os.readlink(path)
    except OSError:
        return ""


def start_time(pid):
    text = read_text(f"/proc/{pid}/stat")
    fields = text.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def holder_dead(fields):
    """Whether the lease's holder is a process of this very host (same boot, same pid
    namespace) that no longer runs. False when that cannot be told."""
    me = self_id()
    if not me["boot"] or not me["pidns"] or fields.get("boot") != me["boot"] \
            or fields.get("pidns") != me["pidns"] or not fields.get("pid", "").isdigit():
        return False
    start = start_time(int(fields["pid"]))  # "" where no such process runs
    return start == "" or fields.get("start", "") not in ("", start)


def parse(content):
    fields = {}
    if content.startswith(MAGIC):
        for line in content[len(MAGIC):].decode("utf-8", "replace").splitlines():
            name, _, value = line.partition(" ")
            fields[name] = value
    return fields


def stale(fd, path):
    """Whether ``path`` no longer names the file open as ``fd`` (its holder unlinked it)."""
    mine = os.fstat(fd)
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return True
    return (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino)
