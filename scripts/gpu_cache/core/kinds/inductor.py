"""Inductor's cache (torch.compile) as a kind: code files of one key with its lock, FX graph
and AOTAutograd key folders, Triton's kernels under ``triton/``; each kernel library is checked
whole (its ELF headers). (The format: :mod:`gpu_cache.core.kinds.inductor_format`.)"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache.core import names
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse, Seen
from gpu_cache.core.verified import Record

if TYPE_CHECKING:
    from gpu_cache.core.kinds.carrying import Carried, ManifestEntry, Writer
    from gpu_cache.core.reports import Missed

#: The key folders of FX graphs: each one compile (a graph also writes code files and an
#: AOTAutograd entry).
FX_GRAPHS = "fxgraph/"


class _Inductor(Kind):
    name = "inductor"
    env_var = names.INDUCTOR_CACHE_DIR_VAR
    read_only = ReadOnlyUse.FALLBACK
    own_check = sealed = carried = True
    read_is_use = True
    own_compile_field = None  # compile_seconds: Dynamo's backend calls, waits and hits included
    last_use = ("the newest modification or access time of the entry's files (Inductor marks no "
                "hit; a hit reads them, which moves the access time where the mount keeps it, at "
                "most daily with relatime)")

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        """With ``verify_after``, each C++ kernel library is checked to be whole (once per file
        state, by ``record``)."""
        from gpu_cache.core.kinds import inductor_format as inductor_cache

        return [Entry(self, e.key, e.name, e.size, e.last_use, e.problem, e,
                      path=e.paths[0] if e.paths else None)
                for e in inductor_cache.scan(folder, grace_seconds, verify_after is not None, record)]

    def _remove(self, folder: Path, entry: Entry) -> None:
        """A code entry under its lock; a key folder renamed away first (EBUSY: being compiled
        right now)."""
        from gpu_cache.core.kinds import inductor_format as inductor_cache

        assert isinstance(entry.source, inductor_cache.InductorEntry)
        inductor_cache.remove(folder, entry.source)

    def files(self, entry: Entry) -> list[str]:
        """The entry's files or key folder, not its lock."""
        from gpu_cache.core.kinds import inductor_format as inductor_cache

        assert isinstance(entry.source, inductor_cache.InductorEntry)
        return [path for path in entry.source.paths if path != entry.source.lock]

    def compiled(self, keys: list[str]) -> list[str]:
        """Its FX graphs, by their key."""
        return [key.rsplit("/", 1)[-1] for key in keys if key.startswith(FX_GRAPHS)]

    # --- explain (host only: gpu_cache.core.kinds.inductor_explain, issue 31) ------------------

    missed_words = "graphs the process compiled (one by one below)"

    def explain_record(self, record: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The FX graphs the process missed."""
        from gpu_cache.core.kinds import inductor_explain

        section = self.section(record) or {}
        missed = section.get("missed")
        keys = [m["key"] for m in missed if isinstance(m, dict) and isinstance(m.get("key"), str)
                and m["key"]] if isinstance(missed, list) else []
        return [inductor_explain.explain_key(key, record, earlier) for key in keys]

    def explain_missed(self, miss: Missed, record: dict[str, Any], seen: Seen) -> dict[str, Any]:
        from gpu_cache.core.kinds import inductor_explain

        earlier = seen.by_kind.get(self.name, {}).get(miss.name, [])
        return inductor_explain.explain_key(miss.key, record, earlier)

    def seen(self, record: dict[str, Any], seen: Seen) -> None:
        """The records by the names of the graphs they keep key parts of."""
        from gpu_cache.core.kinds import inductor_explain

        graphs = seen.by_kind.setdefault(self.name, {})
        for graph in set(inductor_explain.names(record)):
            graphs.setdefault(graph, []).append(record)


    # --- carry (host only: gpu_cache.core.kinds.inductor_carry) ---------------------------------

    def carry_entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        from gpu_cache.core.kinds import inductor_carry

        return inductor_carry.entries(self, folder, wanted)

    def carry_folder(self, key: str) -> str:
        from gpu_cache.core.kinds import inductor_carry

        return inductor_carry.folder_of(key)

    def carry_names(self, key: str, files: Collection[str]) -> bool:
        from gpu_cache.core.kinds import inductor_carry

        return inductor_carry.names_ok(key, files)

    def carry_writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        from gpu_cache.core.kinds import inductor_carry

        return inductor_carry.writers(folder, dir_fd)

    def recorded_keys(self, record: dict[str, Any]) -> set[str]:
        """FX graph keys, as the inventory names their key folders."""
        return {f"{FX_GRAPHS}{key[1:3]}/{key}" for key in super().recorded_keys(record)}

    def software_of(self, identity: dict[str, Any]) -> tuple[Any, ...]:
        """torch's version is in every key; its pickles need the same Python."""
        from gpu_cache.core import software

        return (identity.get("torch"), software.minor(identity.get("python")))

    def software_words(self, identity: dict[str, Any]) -> str:
        from gpu_cache.core import software

        if not identity.get("torch"):
            return f"no torch (Python {identity.get('python') or '?'})"
        return f"torch {identity['torch']} on Python {software.minor(identity.get('python'))}"


KIND = _Inductor()
