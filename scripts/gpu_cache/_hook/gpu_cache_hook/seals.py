"""gpu-cache's startup hook, the seals prune keeps (docs/kinds.md): before the node-local tier
serves a file of the shared tier, it looks up the CRC-32 that a verifying scan (prune, its dry
run, ``doctor --fix``) sealed the file with, in the kind folder's verification record
(``.gpu-cache-verified``, its digests in order since version 4), and refuses a file whose inode
(its number and generation) and size are as sealed but whose bytes are not (same-size damage).
A seal judges only the file it sealed: ext4 hands a new file the inode number just freed, so
a file rewritten where a damaged one was removed had the path, number and size of a DAMAGED
seal, and was removed in its turn; the inode's generation (``FS_IOC_GETVERSION``, given anew
to each inode made) tells the two apart where the filesystem keeps one (ext4, XFS, btrfs;
tmpfs, NFS and overlayfs keep none: prune drops the seals of what it removes).

The record's name, magic and bound and the seal's key have their one home here: the host side
(``gpu_cache.core.verified``, which writes the records, and ``gpu_cache.core.kinds.integrity``)
imports them, so this imports nothing but the standard library and the hook's ``owners``
(relatively: the host imports it as ``gpu_cache._hook.gpu_cache_hook.seals``). A record that
is missing, of another version, too large, not a regular file or one another user may have
written (it would only make the tier refuse good files) seals nothing, and nor does a
digest this Python makes otherwise than prune's (it is ``hash`` of whole numbers: the same on
every 64-bit CPython 3.8+): the file is then served as it would be without a seal. Standard
library only, Python 3.9+.
"""

import os
import stat
import sys
import zlib

from .owners import owner_problem  # (relative: see above)

NAME = ".gpu-cache-verified"
MAGIC = b"gpu-cache verified v4\n"
#: 9: the inode's generation in the key (8, a record of an earlier gpu-cache: number and size
#: only; its seals match no file now, so it is read as empty and everything is sealed again).
SCHEME = 9
MAX_BYTES = 1 << 30
_MASK = (1 << 64) - 1
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: ``FS_IOC_GETVERSION``, ``_IOR('v', 1, long)`` on 64-bit Linux.
_GET_GENERATION = 0x80087601


def generation(fd):
    """The generation of the inode of the open file ``fd``: a number its filesystem gives each
    inode it makes, so that a file given a freed inode's number is told from the one before;
    None where the filesystem keeps none (a seal's key then holds 0)."""
    try:
        import fcntl

        found = fcntl.ioctl(fd, _GET_GENERATION, bytes(8))
    except (ImportError, OSError):
        return None
    return int.from_bytes(found[:4], sys.byteorder)  # (an int: the kernel writes 4 bytes)


def _name(relative):
    return zlib.crc32(relative.encode("utf-8", "surrogateescape"))


def seal_key(relative, ino, size, generation):
    """The key of the seal of the file ``relative`` (its path in the kind folder) of inode
    ``ino`` of that ``generation``, ``size`` bytes long, as prune keys it."""
    return hash((SCHEME, _name(relative), ino, generation, size)) & _MASK


def stamp_key(relative, ino, size, ctime_ns):
    """The key under which a scan keeps the generation of that file while its change time is
    ``ctime_ns`` (a new file, a write or a chmod changes it): a scan finds the seal of a file
    unchanged since without opening it."""
    return hash((SCHEME, 0, _name(relative), ino, ctime_ns, size)) & _MASK


class Seals:
    """The seals of one kind folder (its descriptor; ``team_gid``: the group of a team's
    folder, or None), mapped at the first look-up."""

    def __init__(self, folder_fd, team_gid=None):
        self.folder_fd = folder_fd
        self.team_gid = team_gid
        self.view = None  # the record's pairs, unsigned 64-bit numbers; () for none

    def _load(self):
        self.view = ()
        if sys.byteorder != "little":  # (the record is written little-endian)
            return
        import mmap

        try:
            fd = os.open(NAME, _READ, dir_fd=self.folder_fd)
        except OSError:
            return
        try:
            info = os.fstat(fd)
            size = info.st_size
            body = size - len(MAGIC) - 8  # (after the magic, the scan's cursor)
            if not stat.S_ISREG(info.st_mode) or size > MAX_BYTES or body <= 0 or body % 16 \
                    or owner_problem(info, self.team_gid, where=fd):
                return
            mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return
        finally:
            os.close(fd)
        if mapped[:len(MAGIC)] == MAGIC:
            self.view = memoryview(mapped)[len(MAGIC) + 8:].cast("Q")

    def sealed(self, key):
        """The value sealed for ``key`` (a digest), or None: a binary search of the pairs."""
        if self.view is None:
            self._load()
        view = self.view
        low, high = 0, len(view) // 2
        while low < high:
            middle = (low + high) // 2
            found = view[2 * middle]
            if found == key:
                return view[2 * middle + 1]
            if found < key:
                low = middle + 1
            else:
                high = middle
        return None

    def damaged(self, relative, fd, info, crc):
        """Whether the file ``relative`` (``fd``: it, open; ``info``: its ``fstat``), whose bytes
        have the CRC-32 ``crc``, is not as it was sealed (or was found damaged by prune since)."""
        sealed = self.sealed(seal_key(relative, info.st_ino, info.st_size, generation(fd) or 0))
        return sealed is not None and sealed != crc
