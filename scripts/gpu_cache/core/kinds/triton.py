"""Triton's kernel cache as a kind: the key-folder layout (one folder per key, whole when its
``__grp__`` manifest and every child it names are there), removed whole through the trash; a
read-only root is read as a seed. (The format: :mod:`gpu_cache.core.kinds.triton_format`.)"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache.core import hook_records, names, safe_io
from gpu_cache.core.kinds.explaining import Explain, Seen
from gpu_cache.core.kinds.kind import Entry, Exported, Kind, ReadOnlyUse
from gpu_cache.core.kinds.triton_carry import TritonCarry
from gpu_cache.core.verified import Record

if TYPE_CHECKING:
    from gpu_cache.core.reports import Missed


#: How long the replay of recorded Triton kernels may take.
REPLAY_TIMEOUT_SECONDS = 3600.0


class _Triton(Kind):
    name = "triton"
    env_var = names.TRITON_CACHE_DIR_VAR
    read_only = ReadOnlyUse.SEED
    own_check = sealed = True
    last_use = "the newest mtime in the key folder; the startup hook touches the folder on every hit"

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        """Key folders, stale writers' temporary folders, and trash left by a removal."""
        from gpu_cache.core.kinds import triton_format as triton_cache

        try:
            inventory = triton_cache.scan(folder, record)
        except triton_cache.TritonCacheError:
            return []  # not a folder: doctor and env report it
        now = inventory.scanned_at
        out = []
        for item in inventory.entries:
            problem = None
            if not item.complete or item.points_outside:
                # Triton writes the group manifest last: a young incomplete group may be mid-write.
                if now - item.mtime < grace_seconds:
                    continue
                problem = "; ".join(item.problems) or "incomplete group"
            out.append(Entry(self, item.key, item.kernel or item.kind, item.bytes, item.mtime,
                             problem, item, path=item.folder))
        for temp in inventory.temp_dirs:
            if temp.age_seconds >= grace_seconds:
                out.append(Entry(self, f"{temp.key}/{temp.path.name}", "(temporary)", temp.bytes,
                                 now - temp.age_seconds, "stale temporary folder of a killed writer", temp))
        for other in inventory.others:
            found = self._other(other, now, grace_seconds)
            if found is not None:
                out.append(found)
        return out

    def _other(self, other: Any, now: float, grace_seconds: float) -> Entry | None:
        """A top-level name that is no key folder, as a broken entry (or None: not one)."""
        if other.kind == "trash":
            return Entry(self, other.path.name, "(trash)", other.bytes, 0.0,
                         "left over from an interrupted removal", other)
        if other.kind == "file":
            try:
                info = other.path.lstat()
            except OSError:
                return None
            if not stat.S_ISREG(info.st_mode):  # Triton reads only its key folders: never opened
                what = safe_io.describe(info.st_mode)
                return Entry(self, other.path.name, f"({what})", 0, info.st_mtime,
                             f"{what} in the cache folder (never opened; prune removes it itself)", other,
                             path=str(other.path))
            if not other.path.name.startswith(names.TEMP_PREFIX) or now - info.st_mtime < grace_seconds:
                return None  # a stray file Triton never reads; a younger temporary may be mid-promotion
            return Entry(self, other.path.name, "(temporary)", other.bytes, info.st_mtime,
                         "stale temporary file of an interrupted promotion from a node-local tier", other)
        if other.kind == "symlink":
            # Triton writes real folders only; a link would make it load (or write) elsewhere.
            return Entry(self, other.path.name, "(symbolic link)", 0, 0.0,
                         "a symbolic link in the cache folder (never followed; prune removes "
                         "the link itself)", other, path=str(other.path))
        return None

    def _remove(self, folder: Path, entry: Entry) -> None:
        """A key folder is renamed into a trash folder (atomic on one filesystem) and then
        deleted, so a reader finds either the whole group or none of it."""
        from gpu_cache.core.kinds import triton_format as triton_cache

        source = entry.source
        if isinstance(source, triton_cache.TritonEntry):
            triton_cache.remove_entry(folder, source.key)
        elif isinstance(source, triton_cache.TempDir):
            triton_cache.remove_temp_dir(source)
        elif isinstance(source, triton_cache.OtherPath) and source.kind == "symlink":
            if source.path.is_symlink():  # (a trash link is replaced by a folder on first use)
                try:
                    source.path.unlink()  # the link itself, never what it points to
                except FileNotFoundError:
                    pass
        elif isinstance(source, triton_cache.OtherPath) and source.kind == "file":
            try:
                source.path.unlink()  # a promotion's temporary file (never followed)
            except FileNotFoundError:
                pass
        else:
            triton_cache.empty_trash(folder)

    def present(self, folder: Path, key: str) -> bool:
        return (folder / key).is_dir()

    def exports(self, folder: Path, settings: Any, network_fs: str | None, tier: bool) -> Exported:
        """Triton's dump/override folders live under TRITON_HOME: kept out of $HOME. Triton >= 3.4
        then keeps autotuning results (``<kernel>.autotune.json``) in its cache (issue 24); the
        job's Triton, in its image, decides: an older one ignores it."""
        return Exported({names.TRITON_HOME_VAR: str(folder.parent / "triton-home"),
                         names.TRITON_AUTOTUNING_VAR: "1"})

    def seed_exports(self, folder: Path) -> dict[str, str]:
        return {names.TRITON_SEED_VAR: str(folder), names.TRITON_MANAGER_VAR: names.SEED_MANAGER}

    def warm_steps(self, records: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
        """The replay, when the records describe Triton kernels or autotune choices: it compiles
        them on all the job's cores at once and writes the choices (issue 26,
        docs/single-flight.md)."""
        from gpu_cache.core.kinds import triton_replay

        if not (triton_replay.kernels(records) or triton_replay.autotuned(records)):
            return []
        return [("triton-replay", "{python} -m gpu_cache.workloads.triton_replay", REPLAY_TIMEOUT_SECONDS)]

    def stats_extra(self, found: list[Entry]) -> dict[str, Any]:
        from gpu_cache.core.kinds import triton_format as triton_cache

        return {"autotune_results": triton_cache.autotune_results(found)}


class _TritonExplain(Explain):
    """A kernel compiled in a process: a first compile, or one an earlier process used."""

    missed_words = "Triton kernels compiled in the process (one by one below)"

    def missed(self, miss: Missed, record: dict[str, Any], seen: Seen) -> dict[str, Any]:
        cause = ("an earlier process used this kernel's entry: it was removed since (pruned) or that "
                 "process used another Triton folder" if miss.key in seen.by_kind.get(self.kind.name, ()) else
                 f"no earlier process compiled {miss.name}: a first compile (was it part of the warm-up "
                 "workload?)")
        return {"name": miss.name, "key": miss.key, "compared_with": None, "changed": [], "causes": [cause]}

    def seen(self, record: dict[str, Any], seen: Seen) -> None:
        """The keys of the kernels the process used or compiled."""
        section = self.kind.section(record)
        if section is not None:
            keys = seen.by_kind.setdefault(self.kind.name, set())
            keys.update(k for k in section.get("hit_keys") or [] if isinstance(k, str))
            keys.update(m.key for m in hook_records.missed_of(section, self.kind.name))


KIND = _Triton(carry=TritonCarry, explain=_TritonExplain)
