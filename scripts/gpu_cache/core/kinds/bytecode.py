"""Python's bytecode as a kind: with ``bytecode_cache`` on, the startup hook puts each
interpreter and image in a folder of its own under it; each ``.pyc`` is one entry."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from gpu_cache.core import names, safe_io
from gpu_cache.core.kinds.kind import Entry, ReadOnlyUse
from gpu_cache.core.kinds.layouts import SingleFile
from gpu_cache.core.verified import Record


class _Bytecode(SingleFile):
    name = "bytecode"
    env_var = names.BYTECODE_VAR
    read_only = ReadOnlyUse.FALLBACK
    enabled_by = "bytecode_cache"
    needs_hook = sealed = True
    last_use = "when the .pyc file was written (Python never rewrites a current one)"

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        """Each ``.pyc`` file under the folder (key: its path below it); Python writes it
        through a temporary file and a rename, so a ``.pyc`` is whole, and a leftover temporary
        older than the grace period is broken."""
        out = []
        now = time.time()
        base = os.fspath(folder)
        skip = len(base) + 1
        pending = [base]
        while pending:
            for name, path, info in safe_io.listing(pending.pop()):
                if stat.S_ISDIR(info.st_mode):
                    pending.append(path)  # (a link to a folder is an entry: never followed)
                    continue
                found = self._file(name, path, info, now, grace_seconds, skip)
                if found is not None:
                    out.append(found)
        return out

    def _file(self, name: str, path: str, info: os.stat_result, now: float, grace_seconds: float,
              skip: int) -> Entry | None:
        temporary = not name.endswith(".pyc")
        if temporary and abs(now - info.st_mtime) < grace_seconds:
            return None  # an interpreter may be writing it (one dated far ahead is not: a clock's)
        problem = None
        if not stat.S_ISREG(info.st_mode):
            problem = "not a regular file"
        elif temporary:
            problem = "temporary file of an interpreter that was killed"
        return Entry(self, path[skip:], name.split(".", 1)[0], info.st_size, info.st_mtime,
                     problem, path, path=path)


KIND = _Bytecode()
