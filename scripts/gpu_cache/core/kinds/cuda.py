"""The CUDA driver's cache as a kind: the whole folder is one entry (the driver bounds it
itself, ``CUDA_CACHE_MAXSIZE``); one whose layout is not recognised is counted but never
removed. (The format: :mod:`gpu_cache.core.kinds.cuda_format`.)"""

from __future__ import annotations

from pathlib import Path

from gpu_cache.core import names
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record


class _Cuda(Kind):
    name = "cuda"
    env_var = names.CUDA_CACHE_PATH_VAR
    read_only = ReadOnlyUse.FALLBACK
    unsealed_why = "the driver rewrites its cache in place and checks it itself"
    read_is_use = True
    last_use = "the newest modification or access time of any of its files (the whole cache is one entry)"

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        from gpu_cache.core.kinds import cuda_format as cuda_cache

        found = cuda_cache.scan(folder)
        if found is None:
            return []
        name = cuda_cache.LAYOUT if found.recognised else \
            f"(layout not recognised: {found.why_not}; counted, never pruned)"
        return [Entry(self, cuda_cache.LAYOUT, name, found.size, found.last_use, None, found,
                      removable=found.recognised, path=str(folder))]

    def _remove(self, folder: Path, entry: Entry) -> None:
        """The whole cache (the driver starts a new one); never one whose layout is not
        recognised."""
        from gpu_cache.core.kinds import cuda_format as cuda_cache

        assert isinstance(entry.source, cuda_cache.CudaCache)
        cuda_cache.remove(folder, entry.source)


KIND = _Cuda()
