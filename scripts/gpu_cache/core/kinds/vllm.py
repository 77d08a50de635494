"""vLLM's own compile cache root as a kind (issue 31): one entry per torch.compile hash folder,
and every other name at the top of its root. (The format: :mod:`gpu_cache.core.kinds.vllm_format`.)"""

from __future__ import annotations

from pathlib import Path

from gpu_cache.core import names
from gpu_cache.core.kinds import layouts
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record


class _Vllm(Kind):
    name = "vllm"
    env_var = names.VLLM_CACHE_ROOT_VAR
    read_only = ReadOnlyUse.FALLBACK
    sealed = True
    # vLLM makes and writes torch_compile_cache/<hash>/rank_<i>_<j>/<model part>/.
    inner_folders = ("torch_compile_cache", "torch_compile_cache/*", "torch_compile_cache/*/*",
                     "torch_compile_cache/*/*/*")
    read_is_use = True
    last_use = ("the newest modification or access time of the entry's files (vLLM marks no hit; a "
                "hit reads them)")

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        from gpu_cache.core.kinds import vllm_format as vllm_cache

        return [Entry(self, e.key, e.name, e.size, e.last_use, e.problem, e, path=e.path)
                for e in vllm_cache.scan(folder)]

    def _remove(self, folder: Path, entry: Entry) -> None:
        """A folder renamed away first."""
        assert entry.path is not None
        layouts.remove_named(folder, entry.key, entry.path)


KIND = _Vllm()
