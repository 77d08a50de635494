"""The CUDA driver's PTX JIT cache (``CUDA_CACHE_PATH``, by default ``~/.nv/ComputeCache``).

Pure standard library. The driver keeps the cache itself, bounded by ``CUDA_CACHE_MAXSIZE``
(256 MiB by default): an ``index`` file at the top, which every process that JIT-compiles
opens read-write, and the compiled binaries in two levels of one-hex-digit folders, each file
named by a hex hash (``<dir>/index``, ``<dir>/7/a/e0943aa8a566c2``; seen in ``strace`` of the
driver: a miss creates the file in place with ``O_WRONLY|O_CREAT|O_TRUNC``, a hit opens it
read-only). NVIDIA documents the variables, not the format of the index, and says to delete
the folder to clear the cache.

So gpu-cache never removes single files (the index would then name files that are gone, with
effects no document states). The whole cache is one entry: its bytes, and as last use the
newest modification or access time of its files (the index is rewritten as the driver uses
it). Prune removes it whole (the index first, then the hashed folders, each renamed into
``.gpu-cache-trash`` and deleted there) when it was unused longer than ``max_age`` or is larger
than ``max_size``; the driver then starts a new one. A folder whose contents do not look like
this layout (another driver version's, or files put there by hand) is counted and never
removed: ``removable`` is False.

Not yet checked against a real driver's cache: the layout above is from the documentation
and traces; fill it once on a GPU machine (a PTX-only kernel) and compare.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass

from gpu_cache.core import safe_io, verified

INDEX = "index"
#: A hashed folder (one hex digit; two accepted) and a cached binary's name.
FOLDER_RE = re.compile(r"^[0-9a-fA-F]{1,2}$")
FILE_RE = re.compile(r"^[0-9a-fA-F]+$")
LAYOUT = "ComputeCache"


@dataclass
class CudaCache:
    """What :func:`scan` found: the cache as one entry."""

    size: int
    files: int
    last_use: float
    recognised: bool
    why_not: str | None  # what did not fit the layout
    names: list[str]  # top-level names that belong to the cache (index and hashed folders)


def scan(folder: str | os.PathLike[str]) -> CudaCache | None:
    """The cache in ``folder`` (None: missing or empty). One ``lstat`` per name."""
    root = os.fspath(folder)
    try:
        top = list(os.scandir(root))
    except OSError:
        return None
    size = files = 0
    newest = 0.0
    why_not: str | None = None
    names: list[str] = []
    pending: list[tuple[str, int]] = []
    for item in top:
        if item.name in (verified.NAME, safe_io.TRASH_DIR_NAME):
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except OSError:
            continue
        names.append(item.name)
        if item.name == INDEX and stat.S_ISREG(info.st_mode):
            pass
        elif FOLDER_RE.fullmatch(item.name) and stat.S_ISDIR(info.st_mode):
            pending.append((item.path, 1))
        elif why_not is None:
            why_not = f"unexpected {item.name!r} at the top"
        size, files, newest = _add(info, size, files, newest)
    while pending:
        path, depth = pending.pop()
        for name, child, info in safe_io.listing(path):
            if stat.S_ISDIR(info.st_mode):
                if depth == 1 and FOLDER_RE.fullmatch(name):
                    pending.append((child, 2))
                else:
                    why_not = why_not or f"unexpected folder {child[len(root) + 1:]!r}"
                    pending.append((child, 3))
                continue
            expected = depth == 2 and FILE_RE.fullmatch(name) and stat.S_ISREG(info.st_mode)
            if why_not is None and not expected:
                why_not = f"unexpected {child[len(root) + 1:]!r}"
            size, files, newest = _add(info, size, files, newest)
    if not names:
        return None
    if why_not is None and INDEX not in names:
        why_not = "no index file"
    return CudaCache(size, files, newest, why_not is None, why_not, sorted(names))


def _add(info: os.stat_result, size: int, files: int, newest: float) -> tuple[int, int, float]:
    """Count one name: a file's bytes, and its times (a folder's access time moves whenever
    it is listed, by this scan too: only its modification time counts)."""
    if stat.S_ISREG(info.st_mode):
        return size + info.st_size, files + 1, max(newest, info.st_mtime, info.st_atime)
    return size, files, max(newest, info.st_mtime)


def remove(folder: str | os.PathLike[str], cache: CudaCache) -> None:
    """Remove the whole cache: the index first (a driver starting now begins a new cache),
    then each hashed folder, each renamed into the trash and deleted there. Refuses a cache
    whose layout was not recognised.

    Raises:
        OSError: something could not be moved or deleted.
    """
    if not cache.recognised:
        raise OSError(f"the CUDA cache's layout was not recognised ({cache.why_not}); not removed")
    root = os.fspath(folder)
    order = [INDEX] + [name for name in cache.names if name != INDEX]
    with safe_io.open_dir(root, follow=True) as root_fd:
        trash_fd = safe_io.trash_fd(root_fd)
        try:
            for name in order:
                target = f"{name}.{os.getpid()}.{time.time_ns()}"
                try:
                    os.rename(name, target, src_dir_fd=root_fd, dst_dir_fd=trash_fd)
                except FileNotFoundError:
                    continue
            for leftover in os.listdir(trash_fd):  # this removal's, and any an earlier one left
                safe_io.delete_in(trash_fd, leftover)
        finally:
            os.close(trash_fd)
