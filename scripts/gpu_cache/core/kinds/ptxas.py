"""jaxlib's ptxas runs of jax-triton kernels as a kind (issue 34): the hook's ptxas shim keeps
each result as one file, written whole and read whole, so it needs no node-local tier; not
carried (entries are made where jaxlib launches kernels, on the GPU nodes themselves).
(The format: :mod:`gpu_cache.core.kinds.ptxas_format`.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpu_cache.core import names
from gpu_cache.core.kinds.kind import Entry, ReadOnlyUse, Seen
from gpu_cache.core.kinds.layouts import SingleFile
from gpu_cache.core.verified import Record


class _Ptxas(SingleFile):
    name = "ptxas"
    env_var = names.PTXAS_VAR
    read_only = ReadOnlyUse.READ
    switch_off = (names.PTXAS_VAR, "")
    enabled_by = "ptxas_cache"
    recorded = needs_hook = sealed = True
    last_use = "the entry file's mtime, which the shim sets on every hit"

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        """Each result (named by its kernel) and each identity file is one entry; every
        result's header is checked whole, and ``verify_after``: the sha256 of those used after
        that time."""
        from gpu_cache.core.kinds import ptxas_format as ptxas_cache

        return [Entry(self, e.key, e.name, e.size, e.last_use, e.problem, e,
                      path=os.path.join(folder, e.key))
                for e in ptxas_cache.scan(folder, grace_seconds, verify_after)]

    def present(self, folder: Path, key: str) -> bool:
        return (folder / f"{key}.ptxas").is_file()

    def doctor_report(self, exports_values: dict[str, str]) -> dict[str, Any] | None:
        """Which ptxas the jobs' XLA and jaxlib run, and whether the shim comes first."""
        from gpu_cache.core.kinds import ptxas_lookup

        return ptxas_lookup.report(self.env_var, exports_values)

    def doctor_lines(self, report: dict[str, Any]) -> list[str]:
        from gpu_cache.core.kinds import ptxas_lookup

        return ptxas_lookup.render(report)

    # --- explain (host only: gpu_cache.core.kinds.ptxas_explain) --------------------------------

    def explain_run(self, cache_root: Path, records: list[dict[str, Any]], run_id: str | None,
                    limit: int = 20) -> tuple[list[dict[str, Any]], list[str]]:
        """The shim's misses of the run, each compared with the cache's entries of the same PTX:
        problem lines only (by the last cause: what changed, or why there was none)."""
        from gpu_cache.core.kinds import ptxas_explain

        entries = ptxas_explain.Entries(self.folder(cache_root))
        explained = [ptxas_explain.explain_item(item, entries) for record in records
                     if run_id is None or record.get("run_id") == run_id
                     for item in ptxas_explain.missed_items(self.section(record) or {})][:limit]
        return [], [f"{self.name}: {e['name']} missed: {e['causes'][-1]}" for e in explained if e["causes"]]

    def explain_misses(self, record: dict[str, Any], section: dict[str, Any], misses: int,
                       seen: Seen, room: int) -> list[tuple[str, int, list[dict[str, Any]]]]:
        """Each missed call compared with the cache's entries of the same PTX (issue 34)."""
        from gpu_cache.core.kinds import ptxas_explain

        if self.name not in seen.by_kind:  # the cache's entries, read at the first use
            seen.by_kind[self.name] = ptxas_explain.Entries(
                None if seen.cache_root is None else self.folder(seen.cache_root))
        items = ptxas_explain.missed_items(section)[:misses]
        keys = [ptxas_explain.explain_item(item, seen.by_kind[self.name]) for item in items[:room]]
        out = [("ptxas runs of jax-triton kernels in the process (one by one below)", len(items), keys)]
        if misses - len(items):
            out.append(self.unnamed(record, misses - len(items), seen, room - len(keys)))
        return [cause for cause in out if cause[1]]


KIND = _Ptxas()
