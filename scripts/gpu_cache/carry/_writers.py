"""Unpack's writers: each entry written whole, and checked before it is put in place.

A writer builds the entry beside its place (temporary files, a temporary folder), checks what
it wrote (every file's SHA-256 against the manifest's, a JAX executable decompressed as
prune's verification does, a Triton group naming only files of its entry, its metadata JSON,
an autotuning result gpu-cache's wrapper of the versions and device kind its key names),
and only then renames it into place. An entry that fails a check is :class:`Damaged`: nothing
of it is put in place, and the entry already there stays (#21: an archive damaged in transit,
with its sizes kept, must never replace a good entry with a broken one).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tarfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from gpu_cache.core import safe_io, safe_locks
from gpu_cache.core.caches import autotune as autotune_cache
from gpu_cache.core.caches import inductor as inductor_cache
from gpu_cache.core.caches import jax as jax_cache
from gpu_cache.core.caches import jax_frames
from gpu_cache.core.caches import jax_triton as kernel_cache
from gpu_cache.core.caches import triton as triton_cache

from ._archive import MemberReader
from ._format import INDUCTOR_FOLDERS, MAX_SMALL_JSON, ManifestEntry, Refused, is_group, plain_name, shown


class Damaged(Exception):
    """An entry whose files are not what the archive's manifest says (damaged in transit or
    on disk): it is not written, and the entry already there is kept."""


def group_problem(entry: ManifestEntry, name: str, data: bytes) -> str | None:
    """Why a Triton group file is not one that lists only files of its entry, or None."""
    try:
        if len(data) > MAX_SMALL_JSON:
            raise ValueError(f"{len(data)} bytes")
        group = json.loads(data)
        children = group["child_paths"]
        if not isinstance(children, dict):
            raise TypeError("child_paths is not a mapping")
        for child in children:
            if not plain_name(child) or child not in entry.files or is_group(child):
                raise ValueError(f"it names {shown(str(child))}, no file of the entry")
        kernel = name[len(triton_cache.GROUP_PREFIX):-len(".json")]
        if f"{kernel}.json" not in children:
            raise ValueError(f"it does not list {shown(kernel + '.json')}")
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        return f"its group file {shown(name)} is not Triton's ({exc})"
    return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest_problem(entry: ManifestEntry, file_name: str, digest: str) -> str | None:
    if entry.sha256[file_name] != digest:
        return f"{shown(file_name)} differs from what was packed (its SHA-256)"
    return None


def member_problem(reader: MemberReader, member: tarfile.TarInfo, entry: ManifestEntry,
                   file_name: str, read_all: bool) -> str | None:
    """Why a member is not what was packed (damaged), or None: a Triton group file is read
    (a few KiB: its paths are rewritten); with ``read_all``, every other file too, in chunks
    (a dry run, which writes nothing to check as it goes), an autotuning result also as a job
    reads it.

    Raises:
        Refused: a group file, as packed, that is not Triton's (it names paths outside its
            entry: an archive made to write elsewhere, not damage).
    """
    if entry.kind == "triton" and is_group(file_name):
        if member.size > MAX_SMALL_JSON:
            raise Refused(f"triton entry {shown(entry.key)}: its group file {shown(file_name)} holds "
                          f"{member.size} bytes, not Triton's")
        data = reader.read(member.size)
        damaged = _digest_problem(entry, file_name, sha256(data))
        problem = damaged or group_problem(entry, file_name, data)
        if problem and not damaged:  # as packed: an archive made to write elsewhere
            raise Refused(f"triton entry {shown(entry.key)}: {problem}")
        return damaged
    if not read_all:
        return None
    readers = {"autotune": (autotune_cache.RESULT_LIMIT, autotune_cache.problem_of),
               "jax_triton": (kernel_cache.ENTRY_LIMIT, kernel_cache.problem_of)}
    limit, problem_of = readers.get(entry.kind, (-1, None))
    if problem_of is not None and member.size <= limit:  # read as a job does
        data = reader.read(member.size)
        problem = _digest_problem(entry, file_name, sha256(data))
        try:
            return problem or problem_of(json.loads(data), entry.key)
        except (ValueError, RecursionError) as exc:
            return f"it is not an entry jobs can read ({type(exc).__name__})"
    digest = hashlib.sha256()
    for chunk in iter(lambda: reader.read(safe_io.CHUNK), b""):
        digest.update(chunk)
    return _digest_problem(entry, file_name, digest.hexdigest())


def _copy(source: MemberReader, fd: int, size: int, digest: Any) -> None:
    left = size
    while left:
        chunk = source.read(min(safe_io.CHUNK, left))
        if not chunk:
            raise Refused("the archive ended inside a member (truncated?)")
        digest.update(chunk)
        safe_io.write_all(fd, chunk)
        left -= len(chunk)


def member_mtime(member: tarfile.TarInfo) -> float:
    value = member.mtime
    now = time.time()
    return min(float(value), now) if isinstance(value, (int, float)) and 0 <= value < 1 << 40 else now


class Writer:
    """Writes one entry whole; ``pending``: its files still to come."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry) -> None:
        self.folder, self.dir_fd, self.entry = folder, dir_fd, entry
        self.pending = set(entry.files)

    def add(self, file_name: str, source: MemberReader, member: tarfile.TarInfo) -> None:
        raise NotImplementedError

    def finish(self) -> bool:
        """Check the entry, then put it in place; False when a newer one appeared there
        meanwhile (kept).

        Raises:
            Damaged: what was written is not what was packed; nothing was put in place.
        """
        raise NotImplementedError

    def abandon(self) -> None:
        """Remove what this writer left behind (nothing once it has finished)."""


def _fill(fd: int, file_name: str, source: MemberReader, member: tarfile.TarInfo,
          entry: ManifestEntry) -> None:
    digest = hashlib.sha256()
    _copy(source, fd, member.size, digest)
    problem = _digest_problem(entry, file_name, digest.hexdigest())
    if problem:
        raise Damaged(problem)


class JaxWriter(Writer):
    """Each file into a temporary file beside its name, checked, then all renamed into place
    (``-cache`` before ``-atime``) under JAX's lock where the cache has one."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, capped: bool) -> None:
        super().__init__(folder, dir_fd, entry)
        self.capped = capped
        self.temps: dict[str, str] = {}

    def _temp(self, file_name: str, fill: Callable[[int], None], mtime: float) -> None:
        temp = safe_io.temp_name(file_name)
        fd = safe_io.new_file(temp, dir_fd=self.dir_fd)
        self.temps[file_name] = temp
        try:
            fill(fd)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def add(self, file_name: str, source: MemberReader, member: tarfile.TarInfo) -> None:
        self._temp(file_name, lambda fd: _fill(fd, file_name, source, member, self.entry),
                   member_mtime(member))
        self.pending.discard(file_name)

    def _newer_here(self) -> bool:
        """A whole entry of this key that a process wrote or used since the plan was made."""
        for name in (f"{self.entry.key}-cache", self.entry.key):
            try:
                info = os.lstat(name, dir_fd=self.dir_fd)
            except FileNotFoundError:
                continue
            return stat.S_ISREG(info.st_mode) and info.st_size > 0 and info.st_mtime >= self.entry.last_use
        return False

    def finish(self) -> bool:
        key, last_use = self.entry.key, self.entry.last_use
        executable = next(n for n in (f"{key}-cache", key) if n in self.temps)
        problem = jax_frames.undecompressable(self.folder / self.temps[executable])
        if problem:
            raise Damaged(problem)
        if self.capped and f"{key}-cache" in self.temps and f"{key}-atime" not in self.temps:
            # A capped JAX reads every -atime when it evicts: give the entry one (its last use).
            self._temp(f"{key}-atime",
                       lambda fd: safe_io.write_all(fd, int(last_use * 1e9).to_bytes(8, "little")),
                       last_use)
        with safe_locks.exclusive_lock(self.folder / jax_cache.LOCK_NAME, timeout=60, create=False):
            if self._newer_here():
                return False
            for name in sorted(self.temps, key=lambda n: n.endswith("-atime")):
                os.replace(self.temps[name], name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                del self.temps[name]
        return True

    def abandon(self) -> None:
        for temp in self.temps.values():
            with suppress(OSError):
                os.unlink(temp, dir_fd=self.dir_fd)
        self.temps = {}


class TritonWriter(Writer):
    """Builds the key folder in a temporary folder beside it (Triton's group file last, its
    absolute paths rewritten to the new place), checks it, then renames it into place: Triton's
    key folders, and those of another kind that has no writer of its own."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, replace: bool) -> None:
        super().__init__(folder, dir_fd, entry)
        self.replace = replace
        self.temp = safe_io.temp_name(entry.key)
        safe_io.new_folder(self.temp, dir_fd=dir_fd)
        self.fd: int | None = os.open(self.temp, safe_io.DIR_FLAGS, dir_fd=dir_fd)
        self.group: tuple[str, bytes, float] | None = None

    def _write(self, file_name: str, fill: Callable[[int], None], mtime: float) -> None:
        fd = safe_io.new_file(file_name, dir_fd=self.fd)
        try:
            fill(fd)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def add(self, file_name: str, source: MemberReader, member: tarfile.TarInfo) -> None:
        self.pending.discard(file_name)
        if self.entry.kind == "triton" and is_group(file_name):
            data = source.read(member.size)
            problem = _digest_problem(self.entry, file_name, sha256(data))
            if problem:
                raise Damaged(problem)
            self.group = (file_name, data, member_mtime(member))
            return
        self._write(file_name, lambda fd: _fill(fd, file_name, source, member, self.entry),
                    member_mtime(member))

    def _rewritten_group(self, final: Path) -> tuple[str, bytes, float] | None:
        """The group file with its paths pointing at ``final``, once the entry is shown whole:
        the group lists only files of the entry, and its kernel's metadata is JSON."""
        if self.group is None:
            return None
        name, data, mtime = self.group
        problem = group_problem(self.entry, name, data)
        if problem:
            raise Damaged(problem)
        metadata = name[len(triton_cache.GROUP_PREFIX):]
        try:
            json.loads(safe_io.read_bounded(metadata, MAX_SMALL_JSON, dir_fd=self.fd))
        except (OSError, ValueError, RecursionError) as exc:
            raise Damaged(f"its metadata {shown(metadata)} is not JSON ({type(exc).__name__})") from None
        group = json.loads(data)
        group["child_paths"] = {child: str(final / child) for child in group["child_paths"]}
        return name, json.dumps(group).encode(), mtime

    def finish(self) -> bool:
        key, last_use = self.entry.key, self.entry.last_use
        group = self._rewritten_group(self.folder / key)
        if group is not None:  # written last, as Triton does
            self._write(group[0], lambda fd: safe_io.write_all(fd, group[1]), group[2])
        assert self.fd is not None
        os.utime(self.fd, (last_use, last_use))
        if self.replace and self.entry.kind == "triton":
            triton_cache.remove_entry(self.folder, key)  # into the trash: a reader misses cleanly
        elif self.replace:
            inductor_cache.rename_away(str(self.folder), key)
        try:
            os.rename(self.temp, key, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False  # a process compiled it meanwhile: its entry stays
            raise
        self.temp = ""
        os.utime(self.fd, (last_use, last_use))  # the same folder, now in place
        return True

    def abandon(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.temp:
            shutil.rmtree(self.temp, dir_fd=self.dir_fd, ignore_errors=True)
            self.temp = ""


def _result_problem(name: str, dir_fd: int, key: str) -> str | None:
    """Why the file ``name`` in ``dir_fd`` is not a valid autotuning result at ``key``, or None."""
    try:
        data = json.loads(safe_io.read_bounded(name, autotune_cache.RESULT_LIMIT, dir_fd=dir_fd))
    except (OSError, ValueError, RecursionError) as exc:
        return f"it is not a result jobs can read ({type(exc).__name__})"
    return autotune_cache.problem_of(data, key)


def _lock_folder(fd: int, timeout: float = 60.0) -> None:
    """``flock`` on a folder, as the startup hook takes it to save a result (where the
    filesystem has none, the rename alone keeps the file whole).

    Raises:
        OSError: another process held it for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise OSError(errno.ETIMEDOUT, "a warm process held the autotune folder's lock") from None
            time.sleep(0.05)
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return
            raise


class AutotuneWriter(Writer):
    """An autotuning result into a temporary file in its version folder, checked (its digest,
    then gpu-cache's wrapper of the versions and device kind the key names), then renamed over
    the name under the lock the startup hook saves under, unless a valid result as new is there."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry) -> None:
        super().__init__(folder, dir_fd, entry)
        pair, _, self.name = entry.key.rpartition("/")
        with suppress(FileExistsError):
            safe_io.new_folder(pair, dir_fd=dir_fd)
        try:
            self.fd: int | None = os.open(pair, safe_io.DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(f"{folder / pair} is not a real folder (a symbolic link?); unpack "
                              "writes only into real folders under the cache root") from None
            raise
        self.temp = ""

    def add(self, file_name: str, source: MemberReader, member: tarfile.TarInfo) -> None:
        self.pending.discard(file_name)
        if member.size > autotune_cache.RESULT_LIMIT:
            raise Damaged(f"{shown(file_name)} holds {member.size} bytes, more than jobs read")
        self.temp = safe_io.temp_name(file_name)
        fd = safe_io.new_file(self.temp, dir_fd=self.fd)
        try:
            _fill(fd, file_name, source, member, self.entry)
            os.utime(fd, (self.entry.last_use, self.entry.last_use))
        finally:
            os.close(fd)

    def _newer_here(self) -> bool:
        """A valid result of this key written since the plan was made (a warm process)."""
        assert self.fd is not None
        try:
            info = os.lstat(self.name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_mtime >= self.entry.last_use \
            and _result_problem(self.name, self.fd, self.entry.key) is None

    def finish(self) -> bool:
        assert self.fd is not None
        problem = _result_problem(self.temp, self.fd, self.entry.key)
        if problem:
            raise Damaged(problem)
        _lock_folder(self.fd)
        try:
            if self._newer_here():
                return False
            os.replace(self.temp, self.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            self.temp = ""
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        return True

    def abandon(self) -> None:
        if self.fd is None:
            return
        if self.temp:
            with suppress(OSError):
                os.unlink(self.temp, dir_fd=self.fd)
            self.temp = ""
        os.close(self.fd)
        self.fd = None


class KernelWriter(Writer):
    """A jax-triton kernel (issue 34) into a temporary file beside its name (never writable by
    others: the startup hook reads no entry that another user could have written), checked
    (its digest, then an entry of its key in the hook's format), then renamed into place,
    unless a valid entry as new is there."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, replace: bool) -> None:
        super().__init__(folder, dir_fd, entry)
        self.replace = replace
        self.temp = ""

    def add(self, file_name: str, source: MemberReader, member: tarfile.TarInfo) -> None:
        self.pending.discard(file_name)
        if member.size > kernel_cache.ENTRY_LIMIT:
            raise Damaged(f"{shown(file_name)} holds {member.size} bytes, more than jobs read")
        self.temp = safe_io.temp_name(file_name)
        fd = safe_io.new_file(self.temp, dir_fd=self.dir_fd)
        try:
            _fill(fd, file_name, source, member, self.entry)
            os.utime(fd, (self.entry.last_use, self.entry.last_use))
        finally:
            os.close(fd)

    def _problem(self, name: str) -> str | None:
        try:
            data = json.loads(safe_io.read_bounded(name, kernel_cache.ENTRY_LIMIT, dir_fd=self.dir_fd))
        except (OSError, ValueError, RecursionError) as exc:
            return f"it is not an entry jobs can read ({type(exc).__name__})"
        return kernel_cache.problem_of(data, self.entry.key)

    def finish(self) -> bool:
        problem = self._problem(self.temp)
        if problem:
            raise Damaged(problem)
        key = self.entry.key
        if self.replace:
            try:
                info = os.lstat(key, dir_fd=self.dir_fd)
                if stat.S_ISREG(info.st_mode) and info.st_mtime >= self.entry.last_use \
                        and self._problem(key) is None:
                    return False  # a process compiled it meanwhile: its entry stays
            except FileNotFoundError:
                pass
            os.replace(self.temp, key, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        else:
            try:
                os.link(self.temp, key, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd,
                        follow_symlinks=False)
            except FileExistsError:
                return False  # a process compiled it meanwhile: its entry stays
            os.unlink(self.temp, dir_fd=self.dir_fd)
        self.temp = ""
        return True

    def abandon(self) -> None:
        if self.temp:
            with suppress(OSError):
                os.unlink(self.temp, dir_fd=self.dir_fd)
            self.temp = ""


def _folder_below(dir_fd: int, relative: str) -> int:
    """A descriptor of the folder ``relative`` below ``dir_fd``, each part made where missing
    and opened without following a link."""
    fd = os.dup(dir_fd)
    try:
        for part in relative.split("/"):
            with suppress(FileExistsError):
                safe_io.new_folder(part, dir_fd=fd)
            inner = os.open(part, safe_io.DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        return fd
    except BaseException:
        os.close(fd)
        raise


class InductorWriter(Writer):
    """An FX graph or AOTAutograd key folder built in a temporary folder beside it, then
    renamed into place (Inductor lists a key folder's files: it sees all of them or none); a
    code entry's files each through a temporary file in its shard folder, then given its
    name (a file a process made meanwhile stays, unless the entry replaces a broken one). A
    C++ library is checked to be whole (its ELF headers) before anything is put in place."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, replace: bool) -> None:
        super().__init__(folder, dir_fd, entry)
        self.replace = replace
        self.keyed = entry.key.startswith(INDUCTOR_FOLDERS)
        parent, _, self.name = entry.key.rpartition("/")
        self.parent_fd: int | None = _folder_below(dir_fd, parent)
        self.temps: dict[str, str] = {}
        self.temp = ""
        self.fd: int | None = None
        if self.keyed:
            self.temp = safe_io.temp_name(self.name)
            safe_io.new_folder(self.temp, dir_fd=self.parent_fd)
            self.fd = os.open(self.temp, safe_io.DIR_FLAGS, dir_fd=self.parent_fd)

    def add(self, file_name: str, source: MemberReader, member: tarfile.TarInfo) -> None:
        self.pending.discard(file_name)
        where = self.fd if self.keyed else self.parent_fd
        name = file_name if self.keyed else safe_io.temp_name(file_name)
        fd = safe_io.new_file(name, dir_fd=where)
        if not self.keyed:
            self.temps[file_name] = name
        try:
            _fill(fd, file_name, source, member, self.entry)
            os.utime(fd, (member_mtime(member),) * 2)
            if file_name.endswith(".so"):
                folder = self.folder / self.entry.key.rpartition("/")[0]
                path = folder / self.temp / name if self.keyed else folder / name
                problem = inductor_cache.elf_problem(str(path), os.fstat(fd))
                if problem:
                    raise Damaged(f"{shown(file_name)}: {problem}")
        finally:
            os.close(fd)

    def finish(self) -> bool:
        assert self.parent_fd is not None
        if not self.keyed:
            for file_name, temp in self.temps.items():
                if self.replace:
                    os.replace(temp, file_name, src_dir_fd=self.parent_fd, dst_dir_fd=self.parent_fd)
                    continue
                with suppress(FileExistsError):  # a process made it meanwhile: its file stays
                    os.link(temp, file_name, src_dir_fd=self.parent_fd, dst_dir_fd=self.parent_fd)
            return True
        assert self.fd is not None
        os.utime(self.fd, (self.entry.last_use, self.entry.last_use))
        if self.replace:
            inductor_cache.rename_away(str(self.folder), self.entry.key)  # a reader misses cleanly
        try:
            os.rename(self.temp, self.name, src_dir_fd=self.parent_fd, dst_dir_fd=self.parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False  # a process compiled it meanwhile: its entry stays
            raise
        self.temp = ""
        return True

    def abandon(self) -> None:
        if self.parent_fd is not None:
            for temp in self.temps.values():
                with suppress(OSError):
                    os.unlink(temp, dir_fd=self.parent_fd)
            if self.temp:
                shutil.rmtree(self.temp, dir_fd=self.parent_fd, ignore_errors=True)
        for fd in (self.fd, self.parent_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.parent_fd = None
        self.temps, self.temp = {}, ""
