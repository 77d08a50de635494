"""Why did the ptxas shim miss (issue 34)? Compare a missed call's key parts with the entries
the cache holds for the same PTX.

A record's ``ptxas.missed`` names each call that ran the real ptxas, with its key parts: the
kernel, the ptxas (its version line and file digest), the options without file names, and a
digest of the input. Each entry of ``<cache root>/ptxas`` keeps the same parts in its header.
An entry for the same input with other parts names what changed; none means the PTX itself
was never assembled here (the kernel, its shapes or block sizes, or the jax-triton or Triton
that wrote it, changed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_cache.core.kinds.explaining import AgainstEntries, compared

#: What each changed key part means, as the first words of a cause.
PART_HINTS = {
    "ptxas": "another ptxas release ran it (PATH, the image, or a CUDA wheel changed)",
    "ptxas_digest": "another ptxas file ran it (another install of the same release, or a "
                    "wrapper script that changed)",
    "options": "jaxlib passed other options (JAX_TRITON_PTXAS_EXTRA_FLAGS, "
               "JAX_TRITON_PTXAS_DEVICE_DEBUG, or another compute capability: -arch)",
}


class Entries:
    """The cache's entries, read once: their keys, and their key parts by input digest."""

    def __init__(self, folder: Path | None) -> None:
        from gpu_cache.core.kinds import ptxas_format as ptxas_cache

        self.keys: set[str] = set()
        self.by_input: dict[str, list[dict[str, str]]] = {}
        if folder is None:
            return
        for entry in ptxas_cache.scan(folder, grace_seconds=0.0):
            if entry.problem is None and entry.parts:
                self.keys.add(entry.key.removesuffix(".ptxas"))
                self.by_input.setdefault(entry.parts.get("input", ""), []).append(entry.parts)

    def explain(self, item: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        return explain_item(item, self)


def explain_item(item: dict[str, Any], entries: Entries) -> dict[str, Any]:
    """The explanation of one missed call (a record's ``ptxas.missed`` item), shaped like a
    JAX key's (``compared_with`` stays None: the causes say what the entry had)."""
    parts = item.get("parts") if isinstance(item.get("parts"), dict) else {}
    name, key = str(item.get("name") or "?"), str(item.get("key") or "")
    result: dict[str, Any] = {"name": name, "key": key, "compared_with": None, "changed": [], "causes": []}
    why = item.get("why")
    if isinstance(why, str) and why.startswith("exit code"):
        result["causes"].append(f"the real ptxas failed ({why}): a failed run is not kept")
    if key in entries.keys:
        result["causes"].append("its entry is in the cache now: another process kept it meanwhile "
                                "(the same kernel assembled by several processes at once), or this "
                                "process could not read it")
        return result
    same_input = entries.by_input.get(str(parts.get("input") or "\0"), [])
    if not same_input:
        result["causes"].append(f"no entry holds this PTX of {name}: a first assembly here (was the "
                                "kernel part of the warm-up workload?); other shapes, block sizes, "
                                "or another jax-triton or Triton write other PTX")
        return result
    result["changed"], causes = compared(parts, same_input, PART_HINTS)
    result["causes"] += causes
    return result


class PtxasExplain(AgainstEntries):
    """Each missed call compared with the cache's entries of the same PTX."""

    missed_words = "ptxas runs of jax-triton kernels in the process (one by one below)"
    entries = Entries
