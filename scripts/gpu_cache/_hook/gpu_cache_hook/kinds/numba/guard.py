"""gpu-cache's startup hook, numba's files judged before numba opens them (the ``numba`` piece).

Numba keeps a function's index (``.nbi``) and each overload's data (``.nbc``) as pickles, and
unpickling runs whatever code the pickle names: whoever could write one runs code in every job
that loads it. So the piece reads them itself, through descriptors, and unpickles only a file
that passes, at load time, in the job (``gpu-cache env`` judged the folders once, where and when
it ran: a file rewritten later, or a folder opened to others later in the same exported
environment, is caught only here):

- its folder (numba's per-source folder) is a folder, not a link, this user's or root's (or, in
  a team's folder, of the team's group), and nobody else may write it (no mode bit, no POSIX
  ACL or default ACL; the owner's user-private group may: the rule of ``trust``'s folders);
- the file is a regular file, this user's or root's (or the team's), writable by nobody else
  (mode and ACL; ``owners.owner_problem``, the rule of every file the hook serves);
- its bytes are those a verifying scan sealed it with, where ``prune`` sealed it (``seals``);
- it unpickles as numba's format says (:func:`index_overloads`, ``pickle.loads``).

A file that fails in a folder that passes is set aside (``locks.set_aside``) and numba
compiles and writes it anew; nothing is read from or written into a folder that fails.
What numba writes is made private whatever the umask (:meth:`Guard.private`): a 0666 index
under ``umask 000`` would be an invitation. Standard library only, Python 3.9+.
"""

import errno
import io
import os
import pickle
import stat
import zlib

from ... import owners
from ...locks import set_aside
from ...seals import Seals

DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_WHO = {owners.ACL_USER: "user", owners.ACL_GROUP: "group", owners.ACL_GROUP_OBJ: "group",
        owners.ACL_OTHER: "everyone"}


class Refused(OSError):
    """A file or folder another user may have written: not loaded (an OSError: numba's own
    ``load`` takes it for a data file that is gone, a miss)."""


class Damaged(OSError):
    """A file of the user's own that is not whole, or not as prune sealed it: set aside."""


def index_overloads(cache_file, data):
    """The overloads of an index file's bytes, as numba's ``IndexDataCacheFile._load_index``
    reads them: numba's version (a pickle; another version's file is a miss, its rest never
    unpickled), then ``(source stamp, overloads)`` (a stale stamp is a miss)."""
    stream = io.BytesIO(data)
    if pickle.load(stream) != cache_file._version:
        return {}
    stamp, overloads = pickle.loads(stream.read())
    return overloads if stamp == cache_file._source_stamp else {}


def _team(folder):
    try:
        return owners.team_gid(os.stat(folder))
    except OSError:
        return None


class Guard:
    """The judged reads and private writes of one process. ``note(field, text)``: the record
    keeps what was refused or set aside."""

    def __init__(self, note):
        self.note = note
        self.seals = {}  # kind folder -> its Seals, or None where it cannot be opened
        self.private_groups = {}  # (uid, gid) -> whether gid is uid's user-private group
        self.loaded = {}  # id of an index file -> (folder, name, fstat) of the data it read last

    # --- the rules ------------------------------------------------------------------------

    def _writers(self, fd, info, team, folder):
        """Why someone else may have written the file or folder ``fd`` (``info``: its fstat),
        or None: owner, mode and ACL (``owners.owner_problem``), then a folder's default ACL (what
        a new file in it gets)."""
        if folder and info.st_mode & stat.S_IWGRP and not info.st_mode & stat.S_IWOTH \
                and info.st_uid in (os.geteuid(), 0) and info.st_gid != team \
                and self._private_group(info.st_uid, info.st_gid):
            team = info.st_gid  # the owner's user-private group: only the owner is in it
        why = owners.owner_problem(info, team, where=fd)
        if why or not folder:
            return why
        writers = owners.acl_writers(owners.read_acl(fd, owners.ACL_DEFAULT), info.st_uid, info.st_gid, team)
        if writers:
            who = ", ".join(f"{_WHO[tag]} {'' if who is None else who}".strip() for tag, who in writers)
            return f"writable through a default ACL by {who}"
        return None

    def _private_group(self, uid, gid):
        if (uid, gid) not in self.private_groups:  # (it may read the whole user database)
            self.private_groups[uid, gid] = owners.private_group(uid, gid)
        return self.private_groups[uid, gid]

    def folder(self, folder):
        """The descriptor of numba's folder ``folder`` and the team of the folder above it, the
        folder judged. Raises Refused, OSError (FileNotFoundError: none yet)."""
        team = _team(os.path.dirname(folder))
        try:
            fd = os.open(folder, DIR)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(exc.errno, f"{folder} is a link or not a folder") from None
            raise
        try:
            why = self._writers(fd, os.fstat(fd), team, folder=True)
        except (OSError, ValueError) as exc:
            why = f"not inspectable ({exc})"
        if why:
            os.close(fd)
            raise Refused(errno.EPERM, f"{folder} is {why}")
        return fd, team

    # --- reading --------------------------------------------------------------------------

    def load(self, path, parse, index_file=None):
        """``parse(bytes)`` of numba's file ``path``, read whole through a descriptor after the
        judgement (module docstring). ``index_file``: the index whose data file this is (what
        :meth:`set_aside_loaded` sets aside if numba then cannot rebuild it). Raises
        FileNotFoundError, Refused (another user may have written it: set aside where its
        folder passes), Damaged (not whole, or not as sealed: set aside)."""
        folder, name = os.path.split(path)
        try:
            folder_fd, team = self.folder(folder)
        except Refused as exc:
            self.note("refused", exc.strerror)
            raise
        try:
            fd, info = self._opened(folder_fd, name, path, team)
            try:
                data = _read_all(fd, info.st_size)
                unsealed = self._unsealed(os.path.dirname(folder), f"{os.path.basename(folder)}/{name}",
                                          fd, info, data)
            finally:
                os.close(fd)
            if unsealed:
                self._damaged(folder_fd, name, info, f"{path}: its bytes are not those prune sealed")
            try:
                found = parse(data)
            except Exception as exc:  # numba's own pickle, cut short or damaged
                self._damaged(folder_fd, name, info, f"{path}: {type(exc).__name__}: {exc}")
            if index_file is not None:
                self.loaded[id(index_file)] = (folder, name, info)
            return found
        finally:
            os.close(folder_fd)

    def _opened(self, folder_fd, name, path, team):
        """The descriptor and fstat of the file ``name`` of the judged folder ``folder_fd``,
        itself judged (never a link followed, a FIFO waited on). Raises Refused (set aside)."""
        try:
            fd = os.open(name, READ, dir_fd=folder_fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            info, fd, why = os.stat(name, dir_fd=folder_fd, follow_symlinks=False), None, "a symbolic link"
        else:
            info = os.fstat(fd)
            try:
                why = "not a regular file" if not stat.S_ISREG(info.st_mode) else \
                    self._writers(fd, info, team, folder=False)
            except (OSError, ValueError) as exc:  # an ACL that cannot be read, or is of no known format
                why = f"not inspectable ({exc})"
        if why:
            if fd is not None:
                os.close(fd)
            self._aside(folder_fd, name, info, "refused", f"{path} is {why}")
            raise Refused(errno.EPERM, f"{path} is {why}")
        return fd, info

    def _unsealed(self, kind_folder, relative, fd, info, data):
        """Whether a verifying scan sealed the file with other bytes (``seals``)."""
        if kind_folder not in self.seals:
            try:
                self.seals[kind_folder] = Seals(os.open(kind_folder, DIR), _team(kind_folder))
            except OSError:
                self.seals[kind_folder] = None
        found = self.seals[kind_folder]
        return found is not None and found.damaged(relative, fd, info, zlib.crc32(data))

    def _damaged(self, folder_fd, name, info, why):
        self._aside(folder_fd, name, info, "damaged", why)
        raise Damaged(errno.EIO, why)

    def _aside(self, folder_fd, name, info, field, why):
        """The file ``name`` (``info``: as judged) set aside in its folder, which passed; the
        record says so. Never raises: a folder numba cannot write leaves it, refused again."""
        try:
            set_aside(name, info, dir_fd=folder_fd)
            why += "; set aside"
        except OSError as exc:
            why += f"; left in place ({exc.strerror or exc!r})"
        self.note(field, why)

    def set_aside_loaded(self, index_file, why):
        """The data file the index file ``index_file`` read last, which numba could not
        rebuild an overload from (``why``: its exception): set aside. Whether it read one."""
        found = self.loaded.pop(id(index_file), None)
        if found is None:
            return False
        folder, name, info = found
        try:
            folder_fd, _team_gid = self.folder(folder)
        except OSError:
            return True  # refused now: nothing is read from it again
        try:
            self._aside(folder_fd, name, info, "damaged", f"{os.path.join(folder, name)}: {why}")
        finally:
            os.close(folder_fd)
        return True

    # --- writing --------------------------------------------------------------------------

    @staticmethod
    def private(fd, team):
        """The file ``fd`` numba has just written made writable by nobody else (by the team
        ``team`` too, in a team's folder), whatever the umask let through: :meth:`load` refuses
        it otherwise."""
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        safe = mode & ~(0o002 if team is not None and info.st_gid == team else 0o022)
        if safe != mode:
            os.fchmod(fd, safe)


def _read_all(fd, size):
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            raise OSError(errno.EIO, "the file got shorter while it was read")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
