"""The layouts that several kinds share: a kind picks one and gets its whole-entry removal
(docs/kinds.md). A kind whose layout is its own (JAX's file pairs, Triton's key folders)
implements ``_entries`` and ``_remove`` itself."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from gpu_cache.core import safe_io
from gpu_cache.core.kinds.kind import Entry, Kind


def remove_named(folder: str | os.PathLike[str], key: str, path: str | os.PathLike[str]) -> None:
    """Remove the whole entry ``key`` (at ``path``, below ``folder``) of a kind whose entries are
    folders or files by name (vLLM's, torch_extensions'): a folder renamed into the trash first (a
    process that mapped its files keeps them), then deleted there; one left in the trash deleted;
    a file, link or node unlinked, never followed.

    Raises:
        OSError: it could not be removed.
    """
    from gpu_cache.core.kinds import inductor_format

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(path)
    elif key.startswith(safe_io.TRASH_DIR_NAME + "/"):
        shutil.rmtree(path)  # fd-based: never follows a link inside
    else:
        inductor_format.rename_away(os.path.abspath(folder), key)


class SingleFile(Kind):
    """Each entry is one file (its key: its path below the kind's folder): removed by
    unlinking that name; a link or node there is removed itself, never followed; a process
    that needs the entry again writes or compiles it anew."""

    def _remove(self, folder: Path, entry: Entry) -> None:
        try:
            os.unlink(folder / entry.key)
        except FileNotFoundError:
            pass
