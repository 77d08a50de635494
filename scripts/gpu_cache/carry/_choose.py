"""Which entries pack takes, and what warmed them: the records of warm and validate passes.

Records are written by jobs into the cache root, so every field is checked for its type before
it is used (a list where a text or a number belongs is ignored, never hashed: #21).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpu_cache.core import hook_records, kinds, names, software
from gpu_cache.core.kinds import Kind
from gpu_cache.core.kinds.carrying import ManifestEntry


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _texts(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def dropped(record: Mapping[str, Any], kind: Kind) -> bool:
    """Whether a record lists only its first keys of a kind (the hook bounds its lists)."""
    section = hook_records.part(dict(record), kind.name) or {}
    counts = section.get("dropped")
    return isinstance(counts, dict) and any(hook_records.count(v) for k, v in counts.items()
                                            if k in ("hit_keys", "missed"))


def workload_matcher(settings: Any, name: str) -> Callable[[Any], bool]:
    """Whether a record's process ran workload ``name``: its script (``argv[0]``, which the
    record keeps) is the built-in workload's module file, or a script or ``-m`` module the
    workload's command names. A ``python -c`` workload cannot be told apart.

    Raises:
        UsageError: no such workload.
    """
    from gpu_cache.config.workloads import BUILTINS, resolve_workload

    workload = resolve_workload(settings, name)
    if workload.builtin:
        module = BUILTINS[name].module
        suffix = "/" + module.replace(".", "/") + ".py"
        return lambda argv: bool(argv) and isinstance(argv, list) and isinstance(argv[0], str) \
            and argv[0].endswith(suffix)
    try:
        tokens = shlex.split(workload.command.replace("{", "").replace("}", ""))
    except ValueError:
        tokens = workload.command.split()
    modules = [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "-m"]
    scripts = {t for t in tokens if t.endswith(".py")}
    script_names = {os.path.basename(t) for t in scripts}

    def matches(argv: Any) -> bool:
        if not argv or not isinstance(argv, list) or not isinstance(argv[0], str) \
                or argv[0] in ("", "-c", "-"):
            return False
        first = argv[0]
        if first in scripts or os.path.basename(first) in script_names:
            return True
        return any(first.endswith("/" + m.replace(".", "/") + ending)
                   for m in modules for ending in (".py", "/__main__.py"))

    return matches


def own_records(root: Path, gpu_type: str | None,
                matcher: Callable[[Any], bool] | None) -> list[dict[str, Any]]:
    """The records of warm and validate passes (of one GPU type, of one workload), oldest first."""
    found = []
    for record in hook_records.read(kinds.records_dir(root)):
        if record.get("rule") not in names.OWN_RULES:
            continue
        if gpu_type is not None and record.get("gpu_type") != gpu_type:
            continue
        if matcher is not None and not matcher(record.get("argv")):
            continue
        found.append(record)
    return sorted(found, key=lambda r: r["time"])


def software_section(chosen: list[ManifestEntry],
                     used: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(software, device) of the manifest, from the records that name the packed keys (or, for
    a kind whose entries name their own software, from the entries)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    sources: dict[str, str] = {}
    path_in_key: dict[str, bool | None] = {}
    device: dict[str, dict[str, Any]] = {}
    device_kinds: set[str] = set()
    packed: dict[Kind, list[ManifestEntry]] = {}
    named_own: set[Kind] = set()  # kinds whose entries name their software themselves
    for entry in chosen:
        packed.setdefault(entry.kind, []).append(entry)
    for kind, entries in packed.items():
        keys = {e.key for e in entries}
        naming = [r for r in used if kind.carry.recorded_keys(r) & keys]
        own = kind.carry.entries_software(entries)
        if own is not None:
            by_kind[kind.name], sources[kind.name] = own, "the entries' own versions"
            named_own.add(kind)
        else:
            by_kind[kind.name], sources[kind.name] = _identities(kind, naming)
            path_in_key[kind.name] = kind.carry.path_in_key(by_kind[kind.name][0], naming)
        device[kind.name] = _device(kind, entries, naming)
        device_kinds.update(device[kind.name].get("device_kinds", ()) if kind.carry.device else ())
    newest = next((by_kind[k.name][0] for k in packed if k not in named_own), software.identity())
    soft = {"identity": newest, "by_kind": by_kind, "source": sources, "path_in_key": path_in_key}
    all_types = sorted(set().union(*(d.get("gpu_types", ()) for d in device.values())))
    dev = {"gpu_type": all_types[0] if len(all_types) == 1 else None, "gpu_types": all_types,
           "name": ", ".join(sorted(device_kinds)) or None, **device}
    return soft, dev


def _identities(kind: Kind, naming: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Every distinct software (as far as ``kind``'s keys depend on it) of the records that name
    its entries, newest first, and where that came from."""
    identities: list[dict[str, Any]] = []
    for record in reversed(naming):  # newest first
        identity = record.get("software")
        if isinstance(identity, dict) and all(kind.carry.software_of(identity) != kind.carry.software_of(i)
                                              for i in identities):
            identities.append(identity)
    if identities:
        return identities, "records of warm and validate passes"
    return [software.identity()], "packing interpreter (no record names these entries)"


def _device(kind: Kind, entries: list[ManifestEntry], naming: list[dict[str, Any]]) -> dict[str, Any]:
    """What the manifest says of the GPU of a kind's entries (:attr:`Carry.device`): the
    GPU types of the passes that wrote them; the device those passes saw, or the targets the
    entries were compiled for; for entries that each name their device kind, those."""
    if kind.carry.device is None:
        return {"device_kinds": sorted({e.name for e in entries if e.name})}
    out: dict[str, Any] = {"gpu_types": sorted({r.get("gpu_type") or "?" for r in naming})}  # text: cleaned
    if kind.carry.device == "device":
        devices = [r["device"] for r in naming]  # a mapping: cleaned
        out.update(platforms=sorted({p for d in devices if (p := _text(d.get("platform")))}),
                   device_kinds=sorted({k for d in devices for k in _texts(d.get("kinds"))}),
                   device_counts=sorted({c for d in devices if (c := _whole(d.get("count"))) is not None}))
    else:
        out["targets"] = sorted({e.target for e in entries if e.target})
    return out
