"""Inductor's entries carried (:mod:`gpu_cache.core.kinds.carrying`): its FX graph and
AOTAutograd key folders and its code entries (each C++ library checked whole); not its locks,
temporaries, Triton folder or other files (a process remakes them)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
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
    Writer,
    fill,
    member_mtime,
    regular_files,
    shown,
)

#: Inductor's carried entries: an FX graph or AOTAutograd key folder, or the code files of one
#: key in its shard folder (the shard: the key's second and third characters).
KEY_RE = re.compile(r"^(fxgraph/(?P<f>[a-z0-9]{2})/f(?P=f)[a-z0-9]{30,70}"
                    r"|aotautograd/a[a-z0-9]{32,72}|(?P<c>[a-z0-9]{2})/c(?P=c)[a-z0-9]{30,70})$")
#: The key folders of FX graphs: each one compile (a graph also writes code files and an
#: AOTAutograd entry).
FX_GRAPHS = "fxgraph/"
#: Inductor's entries that are key folders (the rest are code files in a shard folder).
FOLDERS = (FX_GRAPHS, "aotautograd/")


class InductorCarry(carrying.Carry):
    """Key folders and code entries (:mod:`.inductor_format`), each C++ library checked whole."""

    # torch's version is in every key; its pickles need the same Python
    keyed_by, keyed_by_python = ("torch",), True

    def entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        """``wanted`` (the records' graphs) selects FX graphs; the AOTAutograd entries and code
        they may name all go."""
        from gpu_cache.core.kinds import inductor_format as inductor_cache

        out = []
        for entry in self.kind.scan(folder, grace_seconds=3600.0, verify_after=0.0):
            source = entry.source
            assert isinstance(source, inductor_cache.InductorEntry)
            if source.what not in ("code", "fxgraph", "aotautograd"):
                continue
            if wanted is not None and source.what == "fxgraph" and entry.key not in wanted:
                continue
            files: dict[str, Path] = {}
            if source.what == "code":
                files = {Path(p).name: Path(p) for p in source.paths if p != source.lock}
            elif _is_folder(source.paths[0]):  # (a link there is never followed)
                files = regular_files(Path(source.paths[0]))
            if files or entry.problem is not None:
                out.append(Carried(entry.key, entry.name, files, entry.last_use, entry.problem))
        return out

    def folder(self, key: str) -> str:
        """A key folder's own files, or a code entry's in its shard."""
        return key if key.startswith(FOLDERS) else key.rpartition("/")[0]

    def names_ok(self, key: str, files: Collection[str]) -> bool:
        """A key folder's plain files, or code files named by the key."""
        stem = key.rpartition("/")[2] + "."
        return bool(KEY_RE.fullmatch(key)) and (key.startswith(FOLDERS)
                                                or all(n.startswith(stem) for n in files))

    def writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        return lambda entry, replace: InductorWriter(folder, dir_fd, entry, replace)

    def recorded_keys(self, record: dict[str, Any]) -> set[str]:
        """FX graph keys, as the inventory names their key folders."""
        return {f"{FX_GRAPHS}{key[1:3]}/{key}" for key in super().recorded_keys(record)}


def _is_folder(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


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
        super().__init__(folder, dir_fd, entry, replace)
        self.keyed = entry.key.startswith(FOLDERS)
        parent, _, self.name = entry.key.rpartition("/")
        self.parent_fd: int | None = _folder_below(dir_fd, parent)
        self.temps: dict[str, str] = {}
        self.temp = ""
        self.fd: int | None = None
        if self.keyed:
            self.temp = safe_io.temp_name(self.name)
            safe_io.new_folder(self.temp, dir_fd=self.parent_fd)
            self.fd = os.open(self.temp, safe_io.DIR_FLAGS, dir_fd=self.parent_fd)

    def add(self, file_name: str, source: Any, member: Any) -> None:
        from gpu_cache.core.kinds.inductor_format import elf_problem

        self.pending.discard(file_name)
        where = self.fd if self.keyed else self.parent_fd
        name = file_name if self.keyed else safe_io.temp_name(file_name)
        fd = safe_io.new_file(name, dir_fd=where)
        if not self.keyed:
            self.temps[file_name] = name
        try:
            fill(fd, file_name, source, member, self.entry)
            os.utime(fd, (member_mtime(member),) * 2)
            if file_name.endswith(".so"):
                folder = self.folder / self.entry.key.rpartition("/")[0]
                path = folder / self.temp / name if self.keyed else folder / name
                problem = elf_problem(str(path), os.fstat(fd))
                if problem:
                    raise Damaged(f"{shown(file_name)}: {problem}")
        finally:
            os.close(fd)

    def finish(self) -> bool:
        from gpu_cache.core.kinds.inductor_format import rename_away

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
            rename_away(str(self.folder), self.entry.key)  # a reader misses cleanly
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
