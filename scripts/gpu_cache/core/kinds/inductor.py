"""Inductor's cache (torch.compile) as a kind: code files of one key with its lock, FX graph
and AOTAutograd key folders, Triton's kernels under ``triton/``; each kernel library is checked
whole (its ELF headers). (The format: :mod:`gpu_cache.core.kinds.inductor_format`.)"""

from __future__ import annotations

from pathlib import Path

from gpu_cache.core import names
from gpu_cache.core.kinds.inductor_carry import FX_GRAPHS, InductorCarry
from gpu_cache.core.kinds.inductor_explain import InductorExplain
from gpu_cache.core.kinds.kind import Entry, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record


class _Inductor(Kind):
    name = "inductor"
    env_var = names.INDUCTOR_CACHE_DIR_VAR
    read_only = ReadOnlyUse.FALLBACK
    own_check = sealed = True
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


KIND = _Inductor(carry=InductorCarry, explain=InductorExplain)
