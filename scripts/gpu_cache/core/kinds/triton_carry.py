"""Triton's entries carried (:mod:`gpu_cache.core.kinds.carrying`): a complete key folder (a
kernel, or an autotune result) of plain files, built in a temporary folder on unpack with its
group file's absolute paths rewritten to the new place, checked, then renamed into place."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Collection
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
    digest_problem,
    fill,
    member_mtime,
    new_file,
    plain_name,
    regular_files,
    sha256,
    shown,
)

#: Largest Triton group or metadata file read (a kernel's are a few KiB).
MAX_SMALL_JSON = 1 << 20


def is_group(name: str) -> bool:
    """A Triton group file (``__grp__<kernel>.json``), whose paths unpack rewrites."""
    from gpu_cache.core.kinds import triton_format as triton_cache

    return name.startswith(triton_cache.GROUP_PREFIX) and name.endswith(".json")


def _target_of(metadata: Any) -> str | None:
    """``sm_90`` from a Triton kernel's metadata (``target: {backend: cuda, arch: 90}``)."""
    target = metadata.get("target") if isinstance(metadata, dict) else None
    if not isinstance(target, dict):
        return None
    backend, arch = target.get("backend"), target.get("arch")
    if backend == "cuda" and isinstance(arch, int):
        return f"sm_{arch}"
    return f"{backend}:{arch}" if isinstance(backend, str) and isinstance(arch, (int, str)) else None


class TritonCarry(carrying.Carry):
    """Complete key folders (:mod:`.triton_format`), their group files rewritten on unpack."""

    fields = ("kind", "target")  # a kernel or an autotune result; the GPU target
    # the wheel's build, and the Python ABI its launchers are built for
    keyed_by, keyed_by_python = ("triton",), True

    def entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        """Triton's complete key folders: kernels (also those whose group file names another
        path: a copied cache, rewritten on unpack) and autotune results; not its native modules
        (built by this machine's C compiler for its Python; Triton rebuilds them in seconds)."""
        from gpu_cache.core.kinds import triton_format as triton_cache

        try:
            inventory = triton_cache.scan(folder)
        except triton_cache.TritonCacheError:
            return []
        out = []
        for source in inventory.entries:
            if wanted is not None and source.key not in wanted:
                continue
            problem = None
            if source.kind == triton_cache.KIND_MODULE:
                problem = (f"native module {source.kernel} (built by this machine's C compiler for its "
                           "Python; Triton rebuilds it in seconds)")
            elif source.kind not in (triton_cache.KIND_KERNEL, triton_cache.KIND_AUTOTUNE) \
                    or not source.complete:
                problem = "; ".join(source.problems) or f"{source.kind} entry"
            files = regular_files(source.path) if problem is None else {}
            target = None
            if source.kernel and f"{source.kernel}.json" in files:
                try:
                    target = _target_of(json.loads(safe_io.read_bounded(files[f"{source.kernel}.json"],
                                                                        MAX_SMALL_JSON)))
                except (OSError, ValueError, RecursionError):
                    pass
            out.append(Carried(source.key, source.kernel, files, source.mtime, problem,
                               {"kind": source.kind, "target": target}))
        return out

    def folder(self, key: str) -> str:
        return key

    def names_ok(self, key: str, files: Collection[str]) -> bool:
        """A key folder of plain files; no writer's ``tmp.`` folder."""
        from gpu_cache.core.kinds import triton_format as triton_cache

        return bool(triton_cache.KEY_RE.fullmatch(key)) and not any(n.startswith("tmp.") for n in files)

    def whole(self, file_name: str) -> tuple[int, bool] | None:
        """A group file is always read whole (its paths are rewritten)."""
        return (MAX_SMALL_JSON, True) if is_group(file_name) else None

    def member(self, entry: ManifestEntry, file_name: str, data: bytes) -> str | None:
        """A group file, as packed, that is not Triton's names paths outside its entry: an
        archive made to write elsewhere, refused."""
        problem = group_problem(entry, file_name, data) if is_group(file_name) else None
        if problem:
            raise Refused(f"triton entry {shown(entry.key)}: {problem}")
        return None

    def writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        return writers(folder, dir_fd)


def group_problem(entry: ManifestEntry, name: str, data: bytes) -> str | None:
    """Why a Triton group file is not one that lists only files of its entry, or None."""
    from gpu_cache.core.kinds import triton_format as triton_cache

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


def writers(folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
    """Triton's writers (torch extensions' builds are key folders of plain files too)."""
    return lambda entry, replace: TritonWriter(folder, dir_fd, entry, replace)


class TritonWriter(Writer):
    """Builds the key folder in a temporary folder beside it (the group file last, its
    absolute paths rewritten to the new place), checks it, then renames it into place."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, replace: bool) -> None:
        super().__init__(folder, dir_fd, entry, replace)
        self.temp = safe_io.temp_name(entry.key)
        safe_io.new_folder(self.temp, dir_fd=dir_fd)
        self.fd: int | None = os.open(self.temp, safe_io.DIR_FLAGS, dir_fd=dir_fd)
        self.group: tuple[str, bytes, float] | None = None

    def add(self, file_name: str, source: Any, member: Any) -> None:
        self.pending.discard(file_name)
        if is_group(file_name):
            data = source.read(member.size)
            problem = digest_problem(self.entry, file_name, sha256(data))
            if problem:
                raise Damaged(problem)
            self.group = (file_name, data, member_mtime(member))
            return
        new_file(file_name, self.fd, lambda fd: fill(fd, file_name, source, member, self.entry),
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
        from gpu_cache.core.kinds import triton_format as triton_cache

        metadata = name[len(triton_cache.GROUP_PREFIX):]
        try:
            json.loads(safe_io.read_bounded(metadata, MAX_SMALL_JSON, dir_fd=self.fd))
        except (OSError, ValueError, RecursionError) as exc:
            raise Damaged(f"its metadata {shown(metadata)} is not JSON ({type(exc).__name__})") from None
        group = json.loads(data)
        group["child_paths"] = {child: str(final / child) for child in group["child_paths"]}
        return name, json.dumps(group).encode(), mtime

    def finish(self) -> bool:
        from gpu_cache.core.kinds import triton_format as triton_cache

        key, last_use = self.entry.key, self.entry.last_use
        group = self._rewritten_group(self.folder / key)
        if group is not None:  # written last, as Triton does
            new_file(group[0], self.fd, lambda fd: safe_io.write_all(fd, group[1]), group[2])
        assert self.fd is not None
        os.utime(self.fd, (last_use, last_use))
        if self.replace:
            triton_cache.remove_entry(self.folder, key)  # into the trash: a reader misses cleanly
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
