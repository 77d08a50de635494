"""The layouts that several kinds share: a kind picks one and gets its whole-entry removal
(docs/kinds.md). A kind whose layout is its own (JAX's file pairs, Triton's key folders)
implements ``_entries`` and ``_remove`` itself."""

from __future__ import annotations

import os
from pathlib import Path

from gpu_cache.core.kinds.kind import Entry, Kind


class SingleFile(Kind):
    """Each entry is one file (its key: its path below the kind's folder): removed by
    unlinking that name; a link or node there is removed itself, never followed; a process
    that needs the entry again writes or compiles it anew."""

    def _remove(self, folder: Path, entry: Entry) -> None:
        try:
            os.unlink(folder / entry.key)
        except FileNotFoundError:
            pass
