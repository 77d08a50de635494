"""Numba's on-disk cache (``@jit(cache=True)``, and ``numba.cuda.jit(cache=True)``'s kernels)
as a kind. With ``NUMBA_CACHE_DIR`` numba keeps, per folder of source files, a folder
``<its name>_<sha1 of its path>`` and in it, per function, an index
``<module>.<qualname>-<line>.py<XY>.nbi`` (its overloads by signature and target, stamped with
numba's version and a stamp of the source file) and one data file per overload,
``<the same>.<n>.nbc``. Both are pickles: whoever can write them runs code in every job that
loads them, so each file of an entry must pass the trust rule (``Kind.scan`` judges every file),
a verifying scan walks each whole without unpickling it (``numba_format``) and seals it, and
the startup hook judges each before numba unpickles it (``_hook/gpu_cache_hook/kinds/numba``).

An entry is an index with its data files (key: ``<folder>/<index name without .nbi>``), removed
index first: a process that looks then sees a miss, never an index whose data is gone. A data
file without its index (numba leaves older overloads' files behind: it numbers new ones on) is
a broken entry of its own; so is a file numba writes through (``<name>.tmp.<hex>``, renamed into
place) that is older than the grace period: its writer was killed.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

from gpu_cache.core import names, safe_io
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record

#: ``<stem>.<n>.nbc``: a data file of the index ``<stem>.nbi``.
_DATA = re.compile(r"(?P<stem>.+)\.(?P<number>\d+)\.nbc")


class _Numba(Kind):
    name = "numba"
    env_var = names.NUMBA_CACHE_DIR_VAR
    read_only = ReadOnlyUse.FALLBACK
    # numba makes <source folder>_<sha1>/ and writes its entries there
    inner_folders = ("*",)
    own_check = sealed = True
    # the hook judges each pickle before numba loads it
    needs_hook = True
    read_is_use = True
    last_use = ("the newest modification or access time of the entry's files (numba marks no hit; a "
                "hit reads them)")

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        """``verify_after``: each index and data file is walked whole (``numba_format``: never
        unpickled), once per file state where ``record`` keeps what was found whole."""
        from gpu_cache.core.kinds import numba_format

        now, out = time.time(), []
        check = (lambda path, relative, info: numba_format.problem(path, relative, info, record)) \
            if verify_after is not None else None
        for source, sub, info in safe_io.listing(folder):
            if stat.S_ISDIR(info.st_mode) and source != safe_io.TRASH_DIR_NAME:
                out += self._of_source(source, safe_io.listing(sub), now - grace_seconds, check)
        return out

    def _of_source(self, source: str, listing: list[tuple[str, str, os.stat_result]], settled: float,
                   check: Callable[[str, str, os.stat_result], str | None] | None) -> list[Entry]:
        """The entries of one source folder's cache folder ``source`` (``listing``: its names);
        a temporary file written before ``settled`` is a killed writer's. ``check``: why a file
        is not whole (its path, its path in the kind folder, its lstat), or None."""
        found: dict[str, list[tuple[str, os.stat_result]]] = {
            name[:-len(".nbi")]: [(path, info)] for name, path, info in listing if name.endswith(".nbi")}
        out = []
        for name, path, info in listing:
            data = _DATA.fullmatch(name)
            if data and data.group("stem") in found:
                found[data.group("stem")].append((path, info))
            elif data or (".tmp." in name and info.st_mtime < settled):
                why = "a data file without its index" if data else "a file of a numba writer that was killed"
                out.append(Entry(self, f"{source}/{name}", name, info.st_size, info.st_mtime, why, [path],
                                 path=path))
        for stem, files in sorted(found.items()):
            problem = next((f"{os.path.basename(path)}: {why}" for path, info in files
                            if (why := _file_problem(source, path, info, check))), None)
            out.append(Entry(self, f"{source}/{stem}", stem.rsplit("-", 1)[0],
                             sum(info.st_size for _path, info in files),
                             max(max(info.st_mtime, info.st_atime) for _path, info in files), problem,
                             [path for path, _info in files], path=files[0][0]))
        return out

    def files(self, entry: Entry) -> list[str]:
        """The index and its data files."""
        return list(entry.source) if isinstance(entry.source, list) else super().files(entry)

    def _remove(self, folder: Path, entry: Entry) -> None:
        """The index first (a reader then misses), then each data file; a link or node there is
        removed itself, never followed."""
        for path in self.files(entry):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def present(self, folder: Path, key: str) -> bool:
        return os.path.isfile(folder / f"{key}.nbi")


def _file_problem(source: str, path: str, info: os.stat_result,
                  check: Callable[[str, str, os.stat_result], str | None] | None) -> str | None:
    """Why a file of an entry (its index is judged as every kind's entry is, and whoever may
    have written each file by ``Kind.scan``) may not be loaded: not a regular file, or not whole."""
    if not stat.S_ISREG(info.st_mode):
        what = safe_io.describe(info.st_mode)
        return f"{what} where a file of the entry should be (never followed nor opened)"
    return check(path, f"{source}/{os.path.basename(path)}", info) if check is not None else None


KIND = _Numba()
