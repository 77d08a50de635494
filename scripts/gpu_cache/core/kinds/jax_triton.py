"""jax-triton's Triton kernels as a kind (issue 34): compiled while JAX lowers, in every process;
the startup hook keeps each (its PTX) as one file and loads it in every later process.
(The format: :mod:`gpu_cache.core.kinds.jax_triton_format`.)"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache.core import hook_records, names
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse, Seen
from gpu_cache.core.verified import Record

if TYPE_CHECKING:
    from gpu_cache.core.kinds.carrying import Carried, ManifestEntry, Writer
    from gpu_cache.core.reports import Missed


class _JaxTriton(Kind):
    name = "jax_triton"
    env_var = names.JAX_TRITON_VAR
    read_only = ReadOnlyUse.READ
    carried = needs_hook = sealed = True
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

    # --- carry (host only: gpu_cache.core.kinds.jax_triton_carry) -------------------------------

    carry_fields = ("target",)

    def carry_entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        from gpu_cache.core.kinds import jax_triton_carry

        return jax_triton_carry.entries(self, folder, wanted)

    def carry_names(self, key: str, files: Collection[str]) -> bool:
        from gpu_cache.core.kinds import jax_triton_carry

        return jax_triton_carry.names_ok(key, files)

    def carry_whole(self, file_name: str) -> tuple[int, bool] | None:
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        return kernel_cache.ENTRY_LIMIT, False  # read as the hook reads it, in a dry run

    def carry_member(self, entry: ManifestEntry, file_name: str, data: bytes) -> str | None:
        from gpu_cache.core.kinds import jax_triton_format as kernel_cache

        return kernel_cache.problem_in(data, entry.key)

    def carry_writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        from gpu_cache.core.kinds import jax_triton_carry

        return jax_triton_carry.writers(folder, dir_fd)

    def software_of(self, identity: dict[str, Any]) -> tuple[Any, ...]:
        """Its key holds jax-triton's version and Triton's build."""
        from gpu_cache.core import software

        return (identity.get("jax-triton"), identity.get("triton"), software.minor(identity.get("python")))

    def software_words(self, identity: dict[str, Any]) -> str:
        from gpu_cache.core import software

        if not identity.get("jax-triton"):
            return f"no jax-triton (Python {identity.get('python') or '?'})"
        return (f"jax-triton {identity['jax-triton']} with triton {identity.get('triton') or 'none'} "
                f"on Python {software.minor(identity.get('python'))}")

    # --- explain (host only: gpu_cache.core.kinds.jax_triton_explain) ---------------------------

    missed_words = "jax-triton kernels compiled in the process (one by one below)"

    def explain_record(self, record: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from gpu_cache.core.kinds import jax_triton_explain

        return [jax_triton_explain.explain_kernel(miss.key, record, earlier)
                for miss in hook_records.missed_of(self.section(record) or {}, self.name) if miss.key]

    def problem_line(self, explained: dict[str, Any]) -> str:
        return f"{self.name}: kernel {explained['name']} missed: {explained['causes'][0]}"

    def explain_missed(self, miss: Missed, record: dict[str, Any], seen: Seen) -> dict[str, Any]:
        from gpu_cache.core.kinds import jax_triton_explain

        earlier = seen.by_kind.get(self.name, {}).get(miss.name, [])
        return jax_triton_explain.explain_kernel(miss.key, record, earlier)

    def seen(self, record: dict[str, Any], seen: Seen) -> None:
        """The records by the names of the kernels they keep key parts of."""
        from gpu_cache.core.kinds import jax_triton_explain

        by_kernel = seen.by_kind.setdefault(self.name, {})
        for parts in jax_triton_explain.key_parts(record).values():
            named = by_kernel.setdefault(str(parts.get("name")), [])
            if not named or named[-1] is not record:
                named.append(record)


KIND = _JaxTriton()
