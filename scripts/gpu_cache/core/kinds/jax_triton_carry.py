"""jax-triton's kernels carried (:mod:`gpu_cache.core.kinds.carrying`): one file each, named by
its key, read whole and checked as the startup hook reads it (its sha256 and fields); on unpack
written through a temporary file, checked, then linked to its name (never writable by others:
the hook reads no entry that another user could have written)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection
from contextlib import suppress
from pathlib import Path
from typing import Any

from gpu_cache.core import safe_io
from gpu_cache.core.kinds import carrying
from gpu_cache.core.kinds.carrying import Carried, Damaged, ManifestEntry, Writer, fill, new_file, shown


class JaxTritonCarry(carrying.Carry):
    """One file a kernel, checked as the hook reads it (:mod:`.jax_triton_format`)."""

    fields = ("target",)
    # its key holds jax-triton's version and Triton's build (and the Python its launchers are for)
    keyed_by, keyed_by_python = ("jax-triton", "triton"), True

    def entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        out = []
        for entry in self.kind.scan(folder, grace_seconds=3600.0):
            if wanted is not None and entry.key not in wanted:
                continue
            source = entry.source
            assert isinstance(source, kernel_cache.KernelEntry)
            problem, target = entry.problem, None
            if problem is None:
                try:
                    read = safe_io.read_bounded(source.path, kernel_cache.ENTRY_LIMIT)
                    data, problem = kernel_cache.parsed(read, entry.key)
                    target = data.get("target") if data is not None else None
                except OSError as exc:
                    problem = f"unreadable entry ({exc.__class__.__name__})"
            path = Path(source.path)
            out.append(Carried(entry.key, entry.name, {path.name: path}, entry.last_use, problem,
                               {"target": target}))
        return out

    def names_ok(self, key: str, files: Collection[str]) -> bool:
        """One file, named by its key."""
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        return bool(kernel_cache.KEY_RE.fullmatch(key)) and set(files) == {key}

    def whole(self, file_name: str) -> tuple[int, bool] | None:
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        return kernel_cache.ENTRY_LIMIT, False  # read as the hook reads it, in a dry run

    def member(self, entry: ManifestEntry, file_name: str, data: bytes) -> str | None:
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        return kernel_cache.problem_in(data, entry.key)

    def writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        return lambda entry, replace: KernelWriter(folder, dir_fd, entry, replace)


class KernelWriter(Writer):
    """A kernel into a temporary file beside its name, checked (its digest, then an entry of its
    key in the hook's format), then put in place, unless a valid entry as new is there."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, replace: bool) -> None:
        super().__init__(folder, dir_fd, entry, replace)
        self.temp = ""

    def add(self, file_name: str, source: Any, member: Any) -> None:
        from gpu_cache.core.kinds.jax_triton_format import ENTRY_LIMIT

        self.pending.discard(file_name)
        if member.size > ENTRY_LIMIT:
            raise Damaged(f"{shown(file_name)} holds {member.size} bytes, more than jobs read")
        temp = safe_io.temp_name(file_name)
        new_file(temp, self.dir_fd, lambda fd: fill(fd, file_name, source, member, self.entry),
                 self.entry.last_use)
        self.temp = temp

    def _problem(self, name: str) -> str | None:
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        try:
            data = safe_io.read_bounded(name, kernel_cache.ENTRY_LIMIT, dir_fd=self.dir_fd)
        except OSError as exc:
            return f"it is not an entry jobs can read ({type(exc).__name__})"
        return kernel_cache.problem_in(data, self.entry.key)

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
