"""tokamax's autotuning results as a kind (issue 24): one file per (tokamax, jax, device kind)
in its version folder; the hook saves them in a warm process and enters the matching one in every
job that imports tokamax. (The format: :mod:`gpu_cache.core.kinds.autotune_format`.)"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache.core import hook_records, names
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse, texts
from gpu_cache.core.verified import Record

if TYPE_CHECKING:
    from gpu_cache.core.kinds.carrying import Carried, ManifestEntry, Writer

#: How many missed lookups a problem line names.
NAMED = 5


class _Autotune(Kind):
    name = "autotune"
    env_var = names.AUTOTUNE_VAR
    read_only = ReadOnlyUse.READ
    carried = sealed = True
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


    # --- carry (host only: gpu_cache.core.kinds.autotune_carry) ---------------------------------

    carry_fields = ("tokamax", "jax")  # the versions the result names
    carry_device = None  # each result names its device kind, and only that device reads it

    def carry_entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        from gpu_cache.core.kinds import autotune_carry

        return autotune_carry.entries(self, folder, wanted)

    def carry_folder(self, key: str) -> str:
        return key.rpartition("/")[0]  # its version folder

    def carry_names(self, key: str, files: Collection[str]) -> bool:
        """One result file in its version folder, named as the key says."""
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        return bool(autotune_cache.KEY_RE.fullmatch(key)) and set(files) == {key.rpartition("/")[2]}

    def carry_whole(self, file_name: str) -> tuple[int, bool] | None:
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        return autotune_cache.RESULT_LIMIT, False  # read as a job reads it, in a dry run

    def carry_member(self, entry: ManifestEntry, file_name: str, data: bytes) -> str | None:
        from gpu_cache.core.kinds import autotune_carry

        return autotune_carry.problem_of(data, entry.key)

    def carry_writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        from gpu_cache.core.kinds import autotune_carry

        return autotune_carry.writers(folder, dir_fd)

    def recorded_keys(self, record: dict[str, Any]) -> set[str]:
        """The results a record's process loaded, and the one of its device kind where it saved
        one, in its versions' folder."""
        from gpu_cache.core.kinds import autotune_format as autotune_cache

        tuning = self.section(record) or {}
        versions = texts(tuning.get("versions"))
        if len(versions) != 2:
            return set()
        found = set(texts(tuning.get("loaded")))
        device = record.get("device")
        if str(tuning.get("save")).startswith("saved ") and isinstance(device, dict):
            found |= {autotune_cache.file_name(name) for name in texts(device.get("kinds"))}
        folder = autotune_cache.version_folder(*versions)
        return {f"{folder}/{name}" for name in found}

    def software_of(self, identity: dict[str, Any]) -> tuple[Any, ...]:
        """A result loads only in the tokamax and jax that made it."""
        return (identity.get("tokamax"), identity.get("jax"))

    def software_words(self, identity: dict[str, Any]) -> str:
        if not identity.get("tokamax"):
            return f"no tokamax (Python {identity.get('python') or '?'})"
        return f"tokamax {identity['tokamax']} with jax {identity.get('jax') or 'none'}"

    def entries_software(self, entries: list[ManifestEntry]) -> list[dict[str, Any]] | None:
        """Each result names its own versions: they are what must fit (newest first)."""
        made = sorted(entries, key=lambda e: -e.last_use)
        versions = dict.fromkeys((e.fields.get("tokamax"), e.fields.get("jax")) for e in made)
        return [{"tokamax": t, "jax": j} for t, j in versions if t and j]


KIND = _Autotune()
