"""tokamax's autotuning results as a kind (issue 24): one file per (tokamax, jax, device kind)
in its version folder; the hook saves them in a warm process and enters the matching one in every
job that imports tokamax. (The format: :mod:`gpu_cache.core.kinds.autotune_format`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_cache.core import hook_records, names
from gpu_cache.core.kinds.autotune_carry import AutotuneCarry
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record

#: How many missed lookups a problem line names.
NAMED = 5


class _Autotune(Kind):
    name = "autotune"
    env_var = names.AUTOTUNE_VAR
    read_only = ReadOnlyUse.READ
    sealed = True
    hits_field = "entries"  # results entered (config sets), counted as hits
    last_use = "when the warm step last wrote the result (the file's mtime)"

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        return [Entry(self, e.key, e.device_kind, e.size, e.last_use, e.problem, e, path=e.path)
                for e in autotune_cache.scan(folder, grace_seconds)]

    def _remove(self, folder: Path, entry: Entry) -> None:
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        assert isinstance(entry.source, autotune_cache.AutotuneEntry)
        autotune_cache.remove(folder, entry.source)

    def section(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """What the hook's piece says about autotuning (issue 24): results entered (``entries``:
        config sets, counted as hits) and lookups that missed. (A record of gpu-cache 0.2.0 has
        it in the part its piece was named by, ``tokamax``.)"""
        found = hook_records.part(record, self.name) or hook_records.part(record, "tokamax")
        tuning = found.get("autotuning") if found else None
        return tuning if isinstance(tuning, dict) else None

    def validation_problems(self, totals: Any) -> list[str]:
        """A process that missed tokamax's autotuning cache used heuristic configs (other
        kernels than the warm step tuned) or tuned on its own."""
        if totals is None or not totals.misses:
            return []
        missed = sorted({m.name for m in totals.missed})
        return [f"autotune: {totals.misses} tokamax autotuning lookup(s) missed in a fresh process "
                f"after warming ({', '.join(missed[:NAMED]) or 'ops not named'}): the warm step "
                "did not tune these shapes on this GPU type, or ran another tokamax or jax version"]


KIND = _Autotune(carry=AutotuneCarry)
