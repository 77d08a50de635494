"""jax-triton's Triton kernels as a kind (issue 34): compiled while JAX lowers, in every process;
the startup hook keeps each (its PTX) as one file and loads it in every later process.
(The format: :mod:`gpu_cache.core.kinds.jax_triton_format`.)"""

from __future__ import annotations

from pathlib import Path

from gpu_cache.core import names
from gpu_cache.core.kinds.jax_triton_carry import JaxTritonCarry
from gpu_cache.core.kinds.jax_triton_explain import JaxTritonExplain
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record


class _JaxTriton(Kind):
    name = "jax_triton"
    env_var = names.JAX_TRITON_VAR
    read_only = ReadOnlyUse.READ
    needs_hook = sealed = True
    last_use = "the entry's mtime, which the startup hook sets on every hit"

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        """One entry per file, named by its kernel."""
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        return [Entry(self, e.key, e.name, e.size, e.last_use, e.problem, e, path=e.path)
                for e in kernel_cache.scan(folder, grace_seconds, verify_after)]

    def _remove(self, folder: Path, entry: Entry) -> None:
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        assert isinstance(entry.source, kernel_cache.KernelEntry)
        kernel_cache.remove(folder, entry.source)

    def present(self, folder: Path, key: str) -> bool:
        return (folder / key).is_file()


KIND = _JaxTriton(carry=JaxTritonCarry, explain=JaxTritonExplain)
