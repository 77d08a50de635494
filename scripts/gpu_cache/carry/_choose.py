"""Which entries pack takes, and what warmed them: the records of warm and validate passes.

Records are written by jobs into the cache root, so every field is checked for its type before
it is used (a list where a text or a number belongs is ignored, never hashed: #21).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpu_cache.core import hook_records, names, software
from gpu_cache.core.caches import autotune as autotune_cache

from ._format import ManifestEntry, printable


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _texts(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _minor(version: Any) -> str | None:
    """``3.11`` from ``3.11.7``."""
    return ".".join(str(version).split(".")[:2]) if version else None


def _version_tuple(version: Any) -> tuple[int, ...]:
    parts = []
    for piece in str(version or "").split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def keys_of(record: Mapping[str, Any], kind: str) -> set[str]:
    """The keys a record's process hit or wrote for one kind (autotuning results: those it
    loaded, and the one of its device kind where it saved one, in its versions' folder)."""
    if kind == "autotune":
        tuning = hook_records.autotuning_of(dict(record)) or {}
        versions = _texts(tuning.get("versions"))
        if len(versions) != 2:
            return set()
        names = set(_texts(tuning.get("loaded")))
        device = record.get("device")
        if str(tuning.get("save")).startswith("saved ") and isinstance(device, dict):
            names |= {autotune_cache.file_name(name) for name in _texts(device.get("kinds"))}
        folder = autotune_cache.version_folder(*versions)
        return {f"{folder}/{name}" for name in names}
    section = hook_records.part(dict(record), kind)
    if section is None:
        return set()
    missed = section.get("missed")
    found = set(_texts(section.get("hit_keys"))) | (
        {m["key"] for m in missed if isinstance(m, dict) and isinstance(m.get("key"), str)}
        if isinstance(missed, list) else set())
    if kind == "inductor":  # FX graph keys, as the inventory names their key folders
        return {f"fxgraph/{key[1:3]}/{key}" for key in found}
    return found


def dropped(record: Mapping[str, Any], kind: str) -> bool:
    """Whether a record lists only its first keys of a kind (the hook bounds its lists)."""
    section = hook_records.part(dict(record), kind) or {}
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
        module = BUILTINS[name][0]
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
    for record in hook_records.read(hook_records.records_dir(root)):
        if record.get("rule") not in names.OWN_RULES:
            continue
        if gpu_type is not None and record.get("gpu_type") != gpu_type:
            continue
        if matcher is not None and not matcher(record.get("argv")):
            continue
        found.append(record)
    return sorted(found, key=lambda r: r["time"])


def relevant(kind: str, identity: Mapping[str, Any]) -> tuple[Any, ...]:
    """The parts of a software identity that a kind's keys depend on."""
    if kind == "jax":  # jaxlib is in the key; the compression (zstandard or zlib) too
        return (identity.get("jax"), identity.get("jaxlib"), bool(identity.get("zstandard")))
    if kind == "autotune":  # a result loads only in the tokamax and jax that made it
        return (identity.get("tokamax"), identity.get("jax"))
    if kind == "inductor":  # torch's version is in every key; its pickles need the same Python
        return (identity.get("torch"), _minor(identity.get("python")))
    if kind == "jax_triton":  # its key holds jax-triton's version and Triton's build
        return (identity.get("jax-triton"), identity.get("triton"), _minor(identity.get("python")))
    if kind == "triton":  # the wheel's build and ABI
        return (identity.get("triton"), _minor(identity.get("python")))
    return ()  # another kind's keys hold the software that made them: nothing to compare


def describe_for(kind: str, identity: Mapping[str, Any]) -> str:
    """The software a kind's keys depend on, in words: ``jax 0.10.2 (jaxlib 0.10.2, zstd)``."""
    if kind == "jax":
        if not identity.get("jax"):
            words = f"no jax (Python {identity.get('python') or '?'})"
        else:
            compression = "zstd" if identity.get("zstandard") else "zlib"
            words = f"jax {identity['jax']} (jaxlib {identity.get('jaxlib') or '?'}, {compression})"
    elif kind == "autotune":
        words = (f"tokamax {identity['tokamax']} with jax {identity.get('jax') or 'none'}"
                 if identity.get("tokamax") else f"no tokamax (Python {identity.get('python') or '?'})")
    elif kind == "inductor":
        words = (f"torch {identity['torch']} on Python {_minor(identity.get('python'))}"
                 if identity.get("torch") else f"no torch (Python {identity.get('python') or '?'})")
    elif kind == "jax_triton" and not identity.get("jax-triton"):
        words = f"no jax-triton (Python {identity.get('python') or '?'})"
    elif kind == "jax_triton":
        words = (f"jax-triton {identity['jax-triton']} with triton {identity.get('triton') or 'none'} "
                 f"on Python {_minor(identity.get('python'))}")
    elif not identity.get("triton"):
        words = f"no triton (Python {identity.get('python') or '?'})"
    else:
        words = f"triton {identity['triton']} on Python {_minor(identity.get('python'))}"
    return printable(words)


def software_section(chosen: list[ManifestEntry],
                     used: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(software, device) of the manifest, from the records that name the packed keys."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    sources: dict[str, str] = {}
    gpu_types: dict[str, set[str]] = {}
    platforms: set[str] = set()
    device_kinds: set[str] = set()
    device_counts: set[int] = set()
    xla_caches: set[str | None] = set()
    keys: dict[str, set[str]] = {}
    for entry in chosen:
        keys.setdefault(entry.kind, set()).add(entry.key)
    for kind, packed in keys.items():
        if kind == "autotune":  # each result names its own versions: they are what must fit
            made = sorted(chosen, key=lambda e: -e.last_use)
            versions = dict.fromkeys(e.versions for e in made if e.kind == kind and e.versions)
            by_kind[kind] = [{"tokamax": t, "jax": j} for t, j in versions]
            sources[kind] = "the results' own versions"
            continue
        naming = [r for r in used if keys_of(r, kind) & packed]
        identities: list[dict[str, Any]] = []
        for record in reversed(naming):  # newest first
            identity = record.get("software")
            if isinstance(identity, dict) and all(relevant(kind, identity) != relevant(kind, i)
                                                  for i in identities):
                identities.append(identity)
            gpu_types.setdefault(kind, set()).add(record.get("gpu_type") or "?")  # text: cleaned
            if kind == "jax":
                dev = record["device"]  # a mapping: cleaned
                platform, count = _text(dev.get("platform")), _whole(dev.get("count"))
                platforms.update([platform] if platform else [])
                device_counts.update([count] if count is not None else [])
                device_kinds.update(_texts(dev.get("kinds")))
                xla_caches.add(_text(record["env"].get("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES")))
        if identities:
            by_kind[kind], sources[kind] = identities, "records of warm and validate passes"
        else:
            by_kind[kind] = [software.identity()]
            sources[kind] = "packing interpreter (no record names these entries)"
    newest = next((ids[0] for kind, ids in by_kind.items() if ids and kind != "autotune"),
                  software.identity())
    path_in_key = None
    if "jax" in by_kind:
        old = _version_tuple(by_kind["jax"][0].get("jax"))
        if xla_caches:  # unknown without records
            path_in_key = bool(old) and old < (0, 11) and bool(xla_caches - {"none"})
    soft = {"identity": newest, "by_kind": by_kind, "source": sources, "jax_path_in_key": path_in_key}
    all_types = sorted(set().union(*gpu_types.values())) if gpu_types else []
    dev = {
        "gpu_type": all_types[0] if len(all_types) == 1 else None,
        "gpu_types": all_types,
        "name": ", ".join(sorted(device_kinds)) or None,
        "jax": {"gpu_types": sorted(gpu_types.get("jax", set())), "platforms": sorted(platforms),
                "device_kinds": sorted(device_kinds), "device_counts": sorted(device_counts)},
        "triton": {"gpu_types": sorted(gpu_types.get("triton", set())),
                   "targets": sorted({e.target for e in chosen if e.kind == "triton" and e.target})},
        "autotune": {"device_kinds": sorted({e.name for e in chosen if e.kind == "autotune" and e.name})},
        "jax_triton": {"gpu_types": sorted(gpu_types.get("jax_triton", set())),
                       "targets": sorted({e.target for e in chosen if e.kind == "jax_triton" and e.target})},
    }
    return soft, dev
