"""Numba's on-disk cache (``@jit(cache=True)``, and ``numba.cuda.jit(cache=True)``'s kernels)
as a kind. With ``NUMBA_CACHE_DIR`` numba keeps, per folder of source files, a folder
``<its name>_<sha1 of its path>`` and in it, per function, an index
``<module>.<qualname>-<line>.py<XY>.nbi`` (its overloads by signature and target, stamped with
numba's version and the source file's mtime and size) and one data file per overload,
``<the same>.<n>.nbc``. Both are pickles: whoever can write them runs code in every job that
loads them, so each file of an entry must pass the trust rule, and a verifying scan seals them.

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
from pathlib import Path

from gpu_cache.core import names, owners, safe_io
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record

#: ``<stem>.<n>.nbc``: a data file of the index ``<stem>.nbi``.
_DATA = re.compile(r"(?P<stem>.+)\.(?P<number>\d+)\.nbc")


class _Numba(Kind):
    name = "numba"
    env_var = names.NUMBA_CACHE_DIR_VAR
    read_only = ReadOnlyUse.FALLBACK
    watched_module = "numba.core.caching"
    # numba makes <source folder>_<sha1>/ and writes its entries there
    inner_folders = ("*",)
    sealed = True
    read_is_use = True
    last_use = ("the newest modification or access time of the entry's files (numba marks no hit; a "
                "hit reads them)")

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        try:
            team = owners.team_of(os.stat(folder))
        except OSError:
            return []
        now, out = time.time(), []
        for source, sub, info in safe_io.listing(folder):
            if stat.S_ISDIR(info.st_mode) and source != safe_io.TRASH_DIR_NAME:
                out += self._of_source(source, safe_io.listing(sub), team, now - grace_seconds)
        return out

    def _of_source(self, source: str, listing: list[tuple[str, str, os.stat_result]], team: int | None,
                   settled: float) -> list[Entry]:
        """The entries of one source folder's cache folder ``source`` (``listing``: its names);
        a temporary file written before ``settled`` is a killed writer's."""
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
            problem = next((f"{os.path.basename(path)}: {why}" for path, info in files[1:]
                            if (why := self._data_problem(path, info, team))), None)
            out.append(Entry(self, f"{source}/{stem}", stem.rsplit("-", 1)[0],
                             sum(info.st_size for _path, info in files),
                             max(max(info.st_mtime, info.st_atime) for _path, info in files), problem,
                             [path for path, _info in files], path=files[0][0]))
        return out

    @staticmethod
    def _data_problem(path: str, info: os.stat_result, team: int | None) -> str | None:
        """Why a data file may not be loaded (its index is judged as every kind's entry is)."""
        if not stat.S_ISREG(info.st_mode):
            return f"{safe_io.describe(info.st_mode)} where a data file should be (never followed nor opened)"
        why = owners.written_by_others(info, team, where=path)
        return f"not trusted: {why} (another user may have written it)" if why else None

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


KIND = _Numba()
