"""The startup hook's per-process records, as a kind of their own so that prune bounds them
like a cache (they are not one: nothing is served from them). Set up by env only with the
stats hook, its folder judged like every kind's (whoever can add a record there tells validate
what the jobs compiled, and the Triton replay which modules to import); a folder that cannot be
used turns records off (no node-local fallback: validate and stats read them under the root)."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from gpu_cache.core import names, safe_io
from gpu_cache.core.kinds.kind import Entry, ReadOnlyUse
from gpu_cache.core.kinds.layouts import SingleFile
from gpu_cache.core.verified import Record


class _Records(SingleFile):
    name = "records"
    env_var = names.RECORDS_VAR
    read_only = ReadOnlyUse.FALLBACK
    switch_off = (names.RECORDS_VAR, "")
    enabled_by = "stats_hook"
    needs_hook = True
    off_words = "are not kept"
    unsealed_why = "records are not code: every reader checks each field of one as it reads it"
    last_use = "when the process wrote it (the file's mtime)"

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        """Each ``*.json`` file is one entry (last use: when it was written); a half-written
        ``.*.json.tmp`` older than the grace period, or anything that is not a regular file,
        is broken."""
        now = time.time()
        out = []
        for name, path, info in safe_io.listing(folder):
            temporary = name.startswith(".") and name.endswith(".tmp")
            if not (name.endswith(".json") or temporary):
                continue
            problem = None
            if not stat.S_ISREG(info.st_mode):
                problem = "not a regular file"
            elif temporary:
                if now - info.st_mtime < grace_seconds:
                    continue  # a process may be writing it right now
                problem = "half-written record of a process that was killed or ran out of space"
            out.append(Entry(self, name, "record", info.st_size, info.st_mtime, problem, path, path=path))
        return out


KIND = _Records()
