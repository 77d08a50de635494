"""Reading and writing files that someone else may have put there.

Everything under a cache root is treated as attacker-controlled: any name may be a symbolic
link (to ``/dev/zero``, to another user's file), a FIFO, a device node, a folder, a hard link or
a huge file. The rules, for every module that touches the root:

* **Read only regular files, with a bound** (:func:`read_bounded`, :func:`iter_chunks`): the
  name is checked with ``lstat`` before it is opened (a device is never opened: opening some
  has side effects), opened with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink fails, a FIFO swapped
  in meanwhile does not block), and ``fstat`` must show the same regular file. Anything else is
  :class:`NotRegularFile`; more than the limit is :class:`TooLarge`.
* **Never write through a name** (:func:`replace_file`): write a temporary file with a unique
  name, created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then ``os.replace`` it over the name
  (a rename replaces a symlink itself; it never follows it).
* **Folders by descriptor** (:func:`open_dir`, :func:`move_to_trash`): an entry is removed by
  renaming it, in one atomic step between descriptors of real folders, into
  :data:`TRASH_DIR_NAME`, then deleting it there; a symlink swapped in by name is never followed.

And for what the user names (``--output``, ``--outdir``), :func:`write_output`: a regular file
or a new path is replaced through a temporary file beside it; a symlink is followed and its
target treated by these rules (the link stays a link); a character device or a FIFO is written
to directly, never replaced; a folder, a socket or a block device is refused.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpu_cache.core.errors import UsageError

#: Open a name that must be a regular file: never through a symlink, never blocking on a FIFO.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
#: Where the system has it (Linux): a read that leaves the file's access time as it was.
NOATIME = getattr(os, "O_NOATIME", 0)
#: Create a new file under a name nobody else has (a temporary name): never through a symlink.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Open a name that must be a folder, never through a symlink.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The folder inside a kind's folder where removed entries are renamed before they are deleted
#: (a name no tool looks up).
TRASH_DIR_NAME = ".gpu-cache-trash"
#: Read size of :func:`iter_chunks` and :func:`read_bounded`.
CHUNK = 1 << 20


class NotRegularFile(OSError):
    """A name that should be a regular file is something else (symlink, FIFO, device, folder)."""

    def __init__(self, path: str | os.PathLike[str], what: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({what})", str(path))
        self.what = what


class TooLarge(OSError):
    """A file is larger than its reader allows."""

    def __init__(self, path: str | os.PathLike[str], limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit} bytes", str(path))


class Outside(OSError):
    """A path that leads, through a symbolic link, out of the folder it belongs in."""

    def __init__(self, path: str | os.PathLike[str], real: str, root: str | os.PathLike[str]) -> None:
        super().__init__(errno.EPERM, f"leads to {real}, outside {root}", str(path))
        self.real = real


def within(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """``path`` with every symbolic link on it resolved; it must then lie under ``root``
    (resolved too), never be ``root`` itself. What gpu-cache removes or writes under a cache
    root never leads out of it, whatever a kind's folder links to (#21). A path that does not
    exist resolves as far as it does.

    Raises:
        Outside: it leads out of ``root``.
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real == real_root or os.path.commonpath((real, real_root)) != real_root:
        raise Outside(path, real, root)
    return Path(real)


def describe(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"),
                        (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "an unknown kind of file"


@contextmanager
def open_regular(path: str | os.PathLike[str], dir_fd: int | None = None) -> Iterator[int]:
    """A read-only descriptor of the regular file at ``path``, never following a symlink.

    Raises:
        NotRegularFile: ``path`` is a symlink, FIFO, device, socket or folder.
        OSError: it cannot be opened (gone, unreadable).
    """
    before = os.lstat(path, dir_fd=dir_fd)
    if not stat.S_ISREG(before.st_mode):
        raise NotRegularFile(path, describe(before.st_mode))  # never open a device
    try:
        fd = os.open(path, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(path, "a symbolic link") from None
        raise
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode):
            raise NotRegularFile(path, describe(after.st_mode))
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise NotRegularFile(path, "replaced while it was opened")
        # O_NONBLOCK was only for the open (a FIFO swapped in); reads of a file may block.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        yield fd
    finally:
        os.close(fd)


def open_to_check(path: str | os.PathLike[str], known: os.stat_result) -> int | None:
    """A descriptor of the regular file a scan has just ``lstat``-ed (``known``), for a check of
    gpu-cache's own that must not count as a use: without moving its access time (``O_NOATIME``
    needs the file's owner: another's is read plainly), never through a link. None where it is
    gone, cannot be read, or the name now holds another file or size (the next scan checks that
    one): not the check's business. The caller closes it."""
    try:
        try:
            fd = os.open(path, READ_FLAGS | NOATIME)
        except PermissionError:
            fd = os.open(path, READ_FLAGS)
    except OSError:
        return None
    try:
        after = os.fstat(fd)
    except OSError:
        after = None
    if after is None or not stat.S_ISREG(after.st_mode) \
            or (after.st_dev, after.st_ino, after.st_size) != (known.st_dev, known.st_ino, known.st_size):
        os.close(fd)
        return None
    return fd


def read_bounded(path: str | os.PathLike[str], limit: int, dir_fd: int | None = None,
                 judge: Callable[[int, os.stat_result], None] | None = None) -> bytes:
    """The contents of the regular file at ``path``, at most ``limit`` bytes; ``judge`` is
    given the opened file's descriptor and ``fstat`` first (it raises to refuse the file: the trust rule of
    :func:`gpu_cache.core.owners.read_trusted`).

    Raises:
        NotRegularFile: ``path`` is not a regular file.
        TooLarge: it holds more than ``limit`` bytes (only ``limit + 1`` are ever read).
        OSError: it cannot be read.
    """
    with open_regular(path, dir_fd) as fd:
        chunks: list[bytes] = []
        total = 0
        info = os.fstat(fd)
        if judge is not None:
            judge(fd, info)
        # os.read allocates what it is asked for: ask for the file's size (and a byte) first.
        want = info.st_size + 1
        while total <= limit:
            chunk = os.read(fd, min(CHUNK, limit + 1 - total, max(want - total, 1 << 12)))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    if total > limit:
        raise TooLarge(path, limit)
    return b"".join(chunks)


def read_known(path: str | os.PathLike[str], limit: int, known: os.stat_result) -> bytes:
    """The contents of a regular file that a scan has just ``lstat``-ed (``known``, e.g. from
    ``os.scandir``), at most ``limit`` bytes: :func:`read_bounded` without its own ``lstat``
    and ``fcntl``, for reading many small files at the cost of an open, an fstat and one read.
    The file opened must still be that very file (same device and inode, a regular file).

    Raises:
        NotRegularFile: ``known`` is not a regular file, or the name now holds another file.
        TooLarge: it holds more than ``limit`` bytes.
        OSError: it cannot be read.
    """
    if not stat.S_ISREG(known.st_mode):
        raise NotRegularFile(path, describe(known.st_mode))  # never open a device
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(path, "a symbolic link") from None
        raise
    try:
        after = os.fstat(fd)
        if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (known.st_dev, known.st_ino):
            raise NotRegularFile(path, "replaced while it was opened")
        # O_NONBLOCK has no effect on a regular file's reads: no fcntl needed. The first read
        # asks for the file's size and a byte (os.read allocates what it is asked for).
        data = os.read(fd, min(limit + 1, after.st_size + 1, CHUNK))
        while len(data) <= limit and len(data) < after.st_size:  # (one read for a small file)
            more = os.read(fd, min(limit + 1 - len(data), CHUNK))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooLarge(path, limit)
    return data


#: The largest JSON report or verdict a command reads (they are kilobytes).
JSON_LIMIT = 64 << 20


def load_json(path: str | os.PathLike[str], limit: int = JSON_LIMIT) -> Any:
    """The JSON in the regular file ``path`` (a FIFO or device is refused, never waited on).

    Raises:
        UsageError: it cannot be read, is not a regular file, is too large or is not JSON.
    """
    try:
        return json.loads(read_bounded(path, limit))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def iter_chunks(path: str | os.PathLike[str], size: int = CHUNK) -> Iterator[bytes]:
    """The regular file at ``path`` in chunks of at most ``size`` bytes (never all at once).

    Raises:
        NotRegularFile: ``path`` is not a regular file.
        OSError: it cannot be read.
    """
    with open_regular(path) as fd:
        while chunk := os.read(fd, size):
            yield chunk


def harden(fd: int, folder: os.stat_result) -> None:
    """Take write permission for others (and for the group, unless ``folder``, the stat of the
    folder it is in, is a team's: group-writable, as gpu-cache makes a shared-group cache) off
    the file or folder ``fd`` that gpu-cache just made, whatever the umask let through: under
    ``umask 000`` a new entry would be 0666, and whoever may write an entry decides what the
    jobs that load it run. The umask's own restrictions stay."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    team = folder.st_mode & stat.S_IWGRP and not folder.st_mode & stat.S_IWOTH
    safe = mode & ~(0o002 if team else 0o022)
    if safe != mode:
        os.fchmod(fd, safe)


def _folder_of(name: str | os.PathLike[str], dir_fd: int | None) -> os.stat_result:
    return os.stat(os.path.dirname(os.fspath(name)) or ".", dir_fd=dir_fd)


def new_file(name: str | os.PathLike[str], dir_fd: int | None = None) -> int:
    """A write descriptor of a new file under a name nobody else has (never through a link),
    hardened (:func:`harden`).

    Raises:
        OSError: as ``open`` does (FileExistsError: the name exists).
    """
    fd = os.open(name, CREATE_FLAGS, 0o666, dir_fd=dir_fd)
    try:
        harden(fd, _folder_of(name, dir_fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def new_folder(name: str | os.PathLike[str], dir_fd: int | None = None) -> None:
    """Make the folder ``name``, hardened (:func:`harden`).

    Raises:
        OSError: as ``mkdir`` does (FileExistsError: the name exists).
    """
    os.mkdir(name, 0o777, dir_fd=dir_fd)
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        harden(fd, _folder_of(name, dir_fd))
    finally:
        os.close(fd)


def temp_name(name: str) -> str:
    """A unique hidden name for a temporary file beside ``name``:
    ``.<name>.<pid>.<8 hex digits>.tmp`` (prune removes stale ones it made in the JAX folder)."""
    return f".{name[:200]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"  # within NAME_MAX


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than it is given)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def replace_file(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    """Make ``path`` a regular file holding ``data``, atomically, never writing through it.

    The data goes into a new temporary file beside ``path`` (``O_EXCL | O_NOFOLLOW``: a name
    planted there is never written through), which is then renamed over ``path``; whatever
    ``path`` was (a symlink, a FIFO, a hard link) is replaced, not written to. ``mode``: the
    new file's permission bits (default: 0o666 less the umask, :func:`harden`-ed).

    Raises:
        OSError: the temporary file cannot be written or renamed (it is then removed).
    """
    _via_temp(Path(path), data, mode, os.replace)


def add_file(path: str | os.PathLike[str], data: bytes) -> bool:
    """Make ``path`` a regular file holding ``data``, atomically, only where no name ``path``
    exists: the temporary file (as in :func:`replace_file`) is hard-linked to ``path``, which
    never replaces anything. False when ``path`` existed.

    Raises:
        OSError: the temporary file cannot be written or linked (it is removed either way).
    """
    try:
        _via_temp(Path(path), data, None, os.link)
    except FileExistsError:
        return False
    return True


def _via_temp(path: Path, data: bytes, mode: int | None, place: Callable[[Path, Path], None]) -> None:
    """Write ``data`` to a new temporary file beside ``path``, then ``place(temp, path)``
    (rename or link); the temporary name is gone afterwards."""
    temp = path.with_name(temp_name(path.name))
    fd = new_file(temp)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            write_all(fd, data)
        finally:
            os.close(fd)
        place(temp, path)
    finally:
        try:
            os.unlink(temp)
        except OSError:
            pass


@contextmanager
def open_dir(name: str | os.PathLike[str], dir_fd: int | None = None,
             follow: bool = False) -> Iterator[int]:
    """A descriptor of the folder ``name`` (relative to ``dir_fd``), never through a symlink
    unless ``follow`` (only for a kind's folder itself, which the configuration names).

    Raises:
        OSError: it is gone, a symlink (ELOOP) or not a folder (ENOTDIR).
    """
    fd = os.open(name, DIR_FLAGS & ~os.O_NOFOLLOW if follow else DIR_FLAGS, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def trash_fd(root_fd: int) -> int:
    """A descriptor of the trash folder in the kind's folder ``root_fd``, made when missing.
    Anything else by that name (a symlink to a folder elsewhere, a file) is removed first:
    removed entries never leave the kind's folder.

    Raises:
        OSError: the trash cannot be made, or keeps being replaced.
    """
    for _attempt in range(3):
        try:
            info = os.lstat(TRASH_DIR_NAME, dir_fd=root_fd)
        except FileNotFoundError:
            info = None
        if info is not None and not stat.S_ISDIR(info.st_mode):
            try:
                os.unlink(TRASH_DIR_NAME, dir_fd=root_fd)  # never follows a symlink
            except FileNotFoundError:
                pass
            info = None
        if info is None:
            try:
                new_folder(TRASH_DIR_NAME, dir_fd=root_fd)
            except FileExistsError:
                pass
        try:
            return os.open(TRASH_DIR_NAME, DIR_FLAGS, dir_fd=root_fd)
        except (FileNotFoundError, NotADirectoryError):
            continue  # swapped or removed meanwhile: look again
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
    raise OSError(errno.EEXIST, "keeps being replaced by something other than a folder", TRASH_DIR_NAME)


def move_to_trash(root_fd: int, name: str, parent_fd: int | None = None) -> tuple[int, str]:
    """Rename ``name`` (in the folder ``parent_fd``, default ``root_fd``) into the trash of the
    kind's folder ``root_fd`` in one atomic step (same filesystem: a reader sees the whole
    entry or none); return the trash's descriptor (the caller closes it) and the new name.

    Raises:
        OSError: the rename failed (FileNotFoundError: ``name`` is gone).
    """
    trash = trash_fd(root_fd)
    target = f"{name}.{os.getpid()}.{secrets.token_hex(8)}"
    try:
        os.rename(name, target, src_dir_fd=root_fd if parent_fd is None else parent_fd, dst_dir_fd=trash)
    except BaseException:
        os.close(trash)
        raise
    return trash, target


def delete_in(folder_fd: int, name: str) -> None:
    """Delete ``name`` (a file or a whole folder) inside the folder ``folder_fd``; never follows
    a symlink; what is gone already is no error, and what cannot be deleted stays."""
    try:
        os.unlink(name, dir_fd=folder_fd)
    except IsADirectoryError:
        shutil.rmtree(name, dir_fd=folder_fd, ignore_errors=True)  # fd-based: no symlink followed
    except FileNotFoundError:
        pass


def listing(path: str | os.PathLike[str]) -> list[tuple[str, str, os.stat_result]]:
    """(name, path, lstat) of each name in the folder ``path`` (none where it cannot be
    listed); a name removed while listed is left out."""
    out = []
    try:
        handle = os.scandir(path)
    except OSError:
        return out
    with handle:
        for item in handle:
            try:
                out.append((item.name, item.path, item.stat(follow_symlinks=False)))
            except OSError:
                continue
    return out


def tree_size(path: str | os.PathLike[str], access_times: bool = False) -> tuple[int, int, float]:
    """(bytes, regular files, newest mtime) under ``path``, not following symlinks; races ignored.
    One ``lstat`` per name (``os.scandir``). ``access_times``: a regular file's access time
    counts as a use too (for caches whose hits mark nothing but read the files)."""
    total = count = 0
    newest = 0.0
    pending = [os.fspath(path)]
    while pending:
        for _name, child, st in listing(pending.pop()):  # (a folder removed while we walk: none)
            if stat.S_ISDIR(st.st_mode):
                pending.append(child)
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
                count += 1
                if access_times:
                    newest = max(newest, st.st_atime)
            newest = max(newest, st.st_mtime)
    return total, count, newest


# --- what the user names as an output -----------------------------------------------------


def _write_device(path: Path, data: bytes, what: str, follow: bool = False) -> None:
    """Write ``data`` into a character device or FIFO as it is: no truncation, no rename.
    ``follow``: ``path`` is a symlink to it (``/dev/stdout``: opened through the link, which
    reaches the very pipe or terminal even where its target has no path)."""
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags if follow else flags | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ENXIO and what == "a FIFO":
            raise OSError(errno.ENXIO, "is a FIFO that no process reads; start its reader first",
                          str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not (stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
            raise OSError(errno.EINVAL, f"was replaced by {describe(info.st_mode)} while it was "
                          "opened; nothing written", str(path))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        write_all(fd, data)
    finally:
        os.close(fd)


def write_output(target: str | os.PathLike[str], data: bytes | str, what: str = "output") -> Path:
    """Write an output the user named, never replacing what it names unless it is a regular
    file; returns the path written (a symlink's target).

    * a new path or a regular file: through a temporary file beside it and a rename (a file
      that existed keeps its permission bits); missing parent folders are made;
    * a symlink: followed, and its target treated by these rules (the link stays a link);
    * a character device (``/dev/null``, ``/dev/stdout``) or a FIFO: written to directly; a
      FIFO that no process reads is refused (``OSError``, exit 1) rather than waited on;
    * a folder, a socket, a block device, a symlink loop: refused (``UsageError``, exit 2).

    Raises:
        UsageError: ``target`` names something that cannot take a file.
        OSError: it can, but writing failed (no reader on a FIFO, a full disk, permissions).
    """
    payload = data.encode() if isinstance(data, str) else data
    path = Path(target)
    try:
        info: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        info = None
    link = info is not None and stat.S_ISLNK(info.st_mode)
    if link:
        try:
            info = os.stat(path)  # what the link leads to
        except FileNotFoundError:
            info = None  # a dangling link: its target is made
        except OSError as exc:  # ELOOP
            raise UsageError(f"{what} {target} cannot be followed: {exc.strerror or exc}") from None
        if info is None or stat.S_ISREG(info.st_mode):
            path = Path(os.path.realpath(path))  # replace the target, beside the target
            if os.path.islink(path):
                raise UsageError(f"{what} {target} leads to a symbolic link that cannot be "
                                 "followed; nothing written")
    if info is None or stat.S_ISREG(info.st_mode):
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, payload, stat.S_IMODE(info.st_mode) if info is not None else None)
    elif stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode):
        _write_device(path, payload, describe(info.st_mode), follow=link)
    else:
        raise UsageError(f"{what} {target} is {describe(info.st_mode)}, not a file; "
                         "name a file to write (nothing written)")
    return path
