"""jaxlib's ptxas runs of jax-triton kernels as a kind (issue 34): the hook's ptxas shim keeps
each result as one file, written whole and read whole, so it needs no node-local tier; not
carried (entries are made where jaxlib launches kernels, on the GPU nodes themselves).
(The format: :mod:`gpu_cache.core.kinds.ptxas_format`.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpu_cache.core import names
from gpu_cache.core.kinds.kind import Entry, ReadOnlyUse
from gpu_cache.core.kinds.layouts import SingleFile
from gpu_cache.core.kinds.ptxas_explain import PtxasExplain
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


KIND = _Ptxas(explain=PtxasExplain)
