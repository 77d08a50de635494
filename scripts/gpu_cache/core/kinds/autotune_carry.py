"""tokamax's autotuning results carried (:mod:`gpu_cache.core.kinds.carrying`): one file in its
version folder, with the versions its wrapper names; on unpack written through a temporary file
and a rename under the lock the startup hook saves under, once it is shown to be a result of
the versions and device kind its key names."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Collection
from contextlib import suppress
from pathlib import Path
from typing import Any

from gpu_cache.core import safe_io
from gpu_cache.core.kinds import carrying
from gpu_cache.core.kinds.carrying import (
    Carried,
    Damaged,
    ManifestEntry,
    Refused,
    Writer,
    fill,
    new_file,
    shown,
)
from gpu_cache.core.kinds.kind import texts


class AutotuneCarry(carrying.Carry):
    """A result in its version folder, read whole as a job reads it (:mod:`.autotune_format`)."""

    fields = ("tokamax", "jax")  # the versions the result names
    device = None  # each result names its device kind, and only that device reads it
    keyed_by = ("tokamax", "jax")  # a result loads only in the tokamax and jax that made it

    def entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        """Each result, read whole and checked: gpu-cache's wrapper of the versions its key names."""
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        out = []
        for entry in self.kind.scan(folder, grace_seconds=3600.0):
            if wanted is not None and entry.key not in wanted:
                continue
            source = entry.source
            assert isinstance(source, autotune_cache.AutotuneEntry)
            problem, versions = entry.problem, (None, None)
            if problem is None and not autotune_cache.KEY_RE.fullmatch(entry.key):
                problem = "a name gpu-cache does not give a result"
            if problem is None:
                try:
                    wrapper = json.loads(safe_io.read_bounded(source.path, autotune_cache.RESULT_LIMIT))
                    problem = autotune_cache.problem_of(wrapper, entry.key)
                    if problem is None:
                        versions = (str(wrapper["tokamax"]), str(wrapper["jax"]))
                except (OSError, ValueError, RecursionError) as exc:
                    problem = f"unreadable result ({exc.__class__.__name__})"
            path = Path(source.path)
            out.append(Carried(entry.key, entry.name, {path.name: path}, entry.last_use, problem,
                               {"tokamax": versions[0], "jax": versions[1]}))
        return out

    def folder(self, key: str) -> str:
        return key.rpartition("/")[0]  # its version folder

    def names_ok(self, key: str, files: Collection[str]) -> bool:
        """One result file in its version folder, named as the key says."""
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        return bool(autotune_cache.KEY_RE.fullmatch(key)) and set(files) == {key.rpartition("/")[2]}

    def whole(self, file_name: str) -> tuple[int, bool] | None:
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        return autotune_cache.RESULT_LIMIT, False  # read as a job reads it, in a dry run

    def member(self, entry: ManifestEntry, file_name: str, data: bytes) -> str | None:
        return problem_of(data, entry.key)

    def writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        return lambda entry, replace: AutotuneWriter(folder, dir_fd, entry, replace)

    def recorded_keys(self, record: dict[str, Any]) -> set[str]:
        """The results a record's process loaded, and the one of its device kind where it saved
        one, in its versions' folder."""
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        tuning = self.kind.section(record) or {}
        versions = texts(tuning.get("versions"))
        if len(versions) != 2:
            return set()
        found = set(texts(tuning.get("loaded")))
        device = record.get("device")
        if str(tuning.get("save")).startswith("saved ") and isinstance(device, dict):
            found |= {autotune_cache.file_name(name) for name in texts(device.get("kinds"))}
        folder = autotune_cache.version_folder(*versions)
        return {f"{folder}/{name}" for name in found}

    def entries_software(self, entries: list[ManifestEntry]) -> list[dict[str, Any]] | None:
        """Each result names its own versions: they are what must fit (newest first)."""
        made = sorted(entries, key=lambda e: -e.last_use)
        versions = dict.fromkeys((e.fields.get("tokamax"), e.fields.get("jax")) for e in made)
        return [{"tokamax": t, "jax": j} for t, j in versions if t and j]


def problem_of(data: bytes, key: str) -> str | None:
    """Why ``data`` is not a result jobs can read at ``key``, or None."""
    from gpu_cache.core.kinds import autotune_format as autotune_cache

    try:
        return autotune_cache.problem_of(json.loads(data), key)
    except (ValueError, RecursionError) as exc:
        return f"it is not a result jobs can read ({type(exc).__name__})"


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

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, replace: bool) -> None:
        super().__init__(folder, dir_fd, entry, replace)
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

    def _problem(self, name: str) -> str | None:
        from gpu_cache.core.kinds.autotune_format import RESULT_LIMIT

        try:
            data = safe_io.read_bounded(name, RESULT_LIMIT, dir_fd=self.fd)
        except OSError as exc:
            return f"it is not a result jobs can read ({type(exc).__name__})"
        return problem_of(data, self.entry.key)

    def add(self, file_name: str, source: Any, member: Any) -> None:
        from gpu_cache.core.kinds.autotune_format import RESULT_LIMIT

        self.pending.discard(file_name)
        if member.size > RESULT_LIMIT:
            raise Damaged(f"{shown(file_name)} holds {member.size} bytes, more than jobs read")
        temp = safe_io.temp_name(file_name)
        new_file(temp, self.fd, lambda fd: fill(fd, file_name, source, member, self.entry),
                 self.entry.last_use)
        self.temp = temp

    def _newer_here(self) -> bool:
        """A valid result of this key written since the plan was made (a warm process)."""
        assert self.fd is not None
        try:
            info = os.lstat(self.name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_mtime >= self.entry.last_use \
            and self._problem(self.name) is None

    def finish(self) -> bool:
        assert self.fd is not None
        problem = self._problem(self.temp)
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
