"""Inventory and whole-entry removal for vLLM's cache root (``VLLM_CACHE_ROOT``, issue 31).

Pure standard library. vLLM keeps its torch.compile artifacts in
``<root>/torch_compile_cache/<hash>/rank_<i>_<j>/<model part>/`` (its compiled graphs, its
``vllm_compile_cache.py`` index and the Inductor and Triton files it wrote there), where
``<hash>`` is vLLM's hash of everything that changes the compile (its configs, torch's
config, the model's code, and the ``env_hash`` of some environment variables: two engines
that differ there get folders of their own); newer vLLMs also keep
``torch_compile_cache/torch_aot_compile/<hash>/``. One hash folder is one entry: vLLM reads
it as a whole (its index names the files beside it), so it is removed whole, renamed into
``.gpu-cache-trash`` first (atomic: a reader sees all of it or nothing). Anything else at the
top of the root (model info, other caches of vLLM's) is an entry per name. A link or
something that is not a regular file or folder is counted as broken and never followed.

Last use: vLLM marks nothing on a hit; an entry's last use is the newest modification or
access time of its files (a hit reads them).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from gpu_cache.core import safe_io

COMPILE = "torch_compile_cache"
#: A folder of ``torch_compile_cache`` whose children are the entries.
AOT_COMPILE = "torch_aot_compile"


@dataclass
class VllmEntry:
    """One whole entry: ``key`` its path below the root, ``path`` the file or folder."""

    key: str
    name: str
    path: str
    size: int
    last_use: float
    problem: str | None = None


def _entry(key: str, name: str, path: str, info: os.stat_result) -> VllmEntry:
    if stat.S_ISDIR(info.st_mode):
        size, _files, newest = safe_io.tree_size(path, access_times=True)
        return VllmEntry(key, name, path, size, newest or info.st_mtime)  # an empty one: its own
    if stat.S_ISREG(info.st_mode):
        return VllmEntry(key, name, path, info.st_size, max(info.st_mtime, info.st_atime))
    return VllmEntry(key, name, path, 0, info.st_mtime,
                     f"{safe_io.describe(info.st_mode)} in the cache folder (never followed)")


def scan(folder: str | os.PathLike[str]) -> list[VllmEntry]:
    """Every entry of vLLM's cache root ``folder`` (none where it is missing)."""
    root = os.fspath(folder)
    entries = []
    for name, path, info in safe_io.listing(root):
        if name == safe_io.TRASH_DIR_NAME and stat.S_ISDIR(info.st_mode):
            for left, left_path, left_info in safe_io.listing(path):
                found = _entry(f"{name}/{left}", "(trash)", left_path, left_info)
                found.problem = "left over from an interrupted removal"
                entries.append(found)
        elif name == COMPILE and stat.S_ISDIR(info.st_mode):
            for child, child_path, child_info in safe_io.listing(path):
                if child == AOT_COMPILE and stat.S_ISDIR(child_info.st_mode):
                    entries += [_entry(f"{COMPILE}/{child}/{h}", f"torch.compile (AOT) {h}", p, i)
                                for h, p, i in safe_io.listing(child_path)]
                else:
                    ranks = sorted(r for r, _p, i in safe_io.listing(child_path) if stat.S_ISDIR(i.st_mode))
                    entries.append(_entry(f"{COMPILE}/{child}", f"torch.compile {child} "
                                          f"({', '.join(ranks) or 'no ranks'})", child_path, child_info))
        else:
            entries.append(_entry(name, f"(other: {name})", path, info))
    return entries
