"""The short end-of-run summary: verdict, hits, misses, cold vs warm, cache size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_cache.errors import UsageError
from gpu_cache.units import format_size


def _load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def render(validations: list[Path], prune: Path | None) -> str:
    """A few lines per GPU type and one per cache kind.

    Raises:
        UsageError: a file cannot be read as JSON.
    """
    lines = ["gpu-cache summary"]
    for path in validations:
        v = _load(path)
        cold = f"{v['cold_seconds']:.1f} s" if v.get("cold_seconds") is not None else "not measured"
        speedup = f" ({v['speedup']:.1f}x)" if v.get("speedup") else ""
        verdict = "PASSED" if v["passed"] else "FAILED"
        lines.append(f"  {v['gpu_type']} on {v['device']['name']}: {verdict}: {v['hits']} hits, "
                     f"{v['misses']} misses, {v['new_entries']} new entries; cold {cold}, "
                     f"warm {v['warm_seconds']:.1f} s{speedup}")
        lines += [f"    problem: {p}" for p in v.get("problems", [])]
    if prune is not None:
        p = _load(prune)
        verb = "would remove" if p.get("dry_run") else "removed"
        for kind in ("jax", "triton"):
            k = p.get(kind)
            if isinstance(k, dict):
                lines.append(f"  {kind} cache: {format_size(k['bytes_after'])} in "
                             f"{k['entries_before'] - k['entries_removed']} entries after pruning "
                             f"({verb} {k['entries_removed']}, {format_size(k['bytes_removed'])})")
        lines += [f"    prune: {problem}" for problem in p.get("problems", [])]
    return "\n".join(lines) + "\n"
