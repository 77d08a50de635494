"""Statistics: what each cache holds, and how the recorded jobs used it."""

from __future__ import annotations

import heapq
import os
import time
from collections import Counter, defaultdict
from operator import attrgetter
from pathlib import Path
from typing import Any

from gpu_cache.config.settings import Settings
from gpu_cache.config.units import format_age, format_size
from gpu_cache.core import device, hook_records, kinds, safe_io, software, verified
from gpu_cache.core.entries import Entry
from gpu_cache.core.reports import Usage

TOP = 10


def cache_stats(settings: Settings) -> dict[str, Any]:
    """Entries, bytes, oldest and newest use per kind, top entries by size and by function,
    and hit/miss totals per rule and GPU type from the stats hook's records.

    Reads what prune reads, without verifying anything new; a kind's verification record
    (:mod:`gpu_cache.core.verified`) spares it manifests and ``-atime`` files read before, and
    what it reads now is added to the record (best effort: a read-only cache keeps its own).
    """
    root = settings.cache_root
    out: dict[str, Any] = {"cache_root": str(root) if root else None, "kinds": {}, "usage": {}}
    if root is None:
        return out
    now = time.time()
    for kind in kinds.PRUNABLE:
        registered = kinds.KINDS[kind]
        folder = registered.folder(root)
        # It verifies nothing: the record keeps what prune verified (complete=False). None
        # where the folder links out of the root: stats writes nothing there (#21).
        record = verified.Record.load(folder, complete=False) \
            if registered.verifies and _within(folder, root) else None
        found = kinds.scan(kind, folder, record=record)
        if record is not None:
            record.save()
        out["kinds"][kind] = summarise(found, now)
        out["kinds"][kind]["path"] = str(folder)
        out["kinds"][kind]["last_use_from"] = registered.last_use
    found_records = list(hook_records.read(hook_records.records_dir(root)))  # read once, for both
    out["usage"] = {axis: {name: u.as_dict() for name, u in groups.items()}
                    for axis, groups in usage(root, found_records).items()}
    out["software_mismatches"] = software_mismatches(root, found_records)
    out["outside_root"] = outside_root(root, found_records)
    out["runs"] = hook_records.runs(found_records)[:TOP]
    return out


def _within(folder: Path, root: Path) -> bool:
    try:
        safe_io.within(folder, root)
    except safe_io.Outside:
        return False
    return True


def device_seen(record: dict[str, Any]) -> str:
    """The device type a recorded process computed on (``h100``, ``cpu``; from JAX's device
    kinds), ``-`` when it did not say: the type a job really got when its partition may give
    it any of several."""
    kinds_seen = (record.get("device") or {}).get("kinds")
    if isinstance(kinds_seen, list) and kinds_seen and isinstance(kinds_seen[0], str):
        return device.gpu_type_of(kinds_seen[0])
    return "-"


def _under(path: str, root: Path) -> bool:
    folder = os.path.normpath(path)
    return os.path.isabs(folder) and (folder == str(root) or folder.startswith(str(root).rstrip("/") + "/"))


def outside_root(root: Path, loaded: list[dict[str, Any]] | None = None) -> list[str]:
    """One line per rule and folder of processes whose JAX cache folder was outside the
    cache root (the hook records the folder JAX really used: a program may set its own
    with a flag such as --jax_compilation_cache_dir), with their hits and the fix: gpu-cache
    neither warms nor prunes such a folder."""
    ours = kinds.KINDS["jax"].folder(root)
    found: dict[tuple[str, str, bool], list[int]] = {}
    for record in hook_records.read(hook_records.records_dir(root)) if loaded is None else loaded:
        section = hook_records.part(record, "jax")
        folder = section.get("cache_dir") if section else None
        if not isinstance(folder, str) or not folder or _under(folder, root):
            continue
        exported = record["env"].get("JAX_COMPILATION_CACHE_DIR")
        own_flag = not (isinstance(exported, str) and os.path.normpath(exported) == os.path.normpath(folder))
        counts = found.setdefault((record.get("rule") or "-", folder, own_flag), [0, 0, 0])
        counts[0] += 1
        counts[1] += hook_records.count(section.get("hits"))
        counts[2] += hook_records.count(section.get("hits")) + hook_records.count(section.get("misses"))
    lines = []
    for (rule, folder, own_flag), (n, hits, lookups) in sorted(found.items()):
        fix = ("its program sets its own folder (a flag such as --jax_compilation_cache_dir, or "
               "jax.config.update): drop that flag or point it at $JAX_COMPILATION_CACHE_DIR"
               if own_flag else
               "its JAX_COMPILATION_CACHE_DIR was set outside gpu-cache: unset it")
        lines.append(f"rule {rule} used {folder} (outside the cache root {root}) in {n} "
                     f"process{'es' if n != 1 else ''}, {hits} of {lookups} hits; gpu-cache neither "
                     f"warms nor prunes it: {fix} (gpu-cache's folder is {ours})")
    return lines


def summarise(found: list[Entry], now: float) -> dict[str, Any]:
    """One kind's part of :func:`cache_stats` (the counting, sums and extremes run in C)."""
    by_function = Counter(map(_NAME, found))
    top = by_function.most_common(TOP)
    wanted = {name for name, _count in top}
    bytes_by_function: Counter[str] = Counter()
    for entry in found:
        if entry.name in wanted:
            bytes_by_function[entry.name] += entry.size
    broken = [entry for entry in found if entry.problem]
    uses = list(map(_LAST_USE, found))
    return {
        "entries": len(found),
        "bytes": sum(map(_SIZE, found)),
        "broken": len(broken),
        # What prune would repair: incomplete or copied Triton groups, stale temporaries,
        # empty or truncated JAX entries, orphan halves.
        "broken_entries": [{"key": e.key, "name": e.name, "bytes": e.size, "problem": e.problem}
                           for e in broken[:TOP]],
        "oldest_use_age_seconds": round(now - min(uses), 1) if uses else None,
        "newest_use_age_seconds": round(now - max(uses), 1) if uses else None,
        "top_entries": [{"key": e.key, "name": e.name, "bytes": e.size}
                        for e in heapq.nlargest(TOP, found, key=_SIZE)],
        "by_function": [{"name": name, "entries": count, "bytes": bytes_by_function[name]}
                        for name, count in top],
    }


_NAME, _SIZE, _LAST_USE = attrgetter("name"), attrgetter("size"), attrgetter("last_use")


#: The rules of gpu-cache's own passes (warm_cache, validate_cache): their records tell
#: which software warmed and validated each GPU type.
OWN_RULES = ("warm_cache", "validate_cache")


def software_mismatches(root: Path, loaded: list[dict[str, Any]] | None = None) -> list[str]:
    """One line per (rule, software) of jobs whose software differs from the software that
    warmed and validated their GPU type's cache (from the records), with their hits: such
    jobs miss, since cache keys hold the jax/jaxlib and triton versions and the Python ABI.

    A record without a GPU type is compared with every type's warming software and named
    only when it differs from all of them.
    """
    warmed: dict[str, dict[str, Any]] = {}  # gpu_type -> software of its latest own pass
    warmed_on: dict[str, str] = {}  # gpu_type -> the device its own pass saw
    jobs = []
    if loaded is None:
        loaded = list(hook_records.read(hook_records.records_dir(root)))
    for record in sorted(loaded, key=lambda r: r["time"]):
        soft = record.get("software")
        if not isinstance(soft, dict):
            continue
        if record.get("rule") in OWN_RULES:
            warmed[record.get("gpu_type") or "-"] = soft
            warmed_on[record.get("gpu_type") or "-"] = device_seen(record)
        else:
            jobs.append((record, soft))
    found: dict[tuple[str, str, str], list[int]] = {}
    for record, soft in jobs:
        gpu_type = record.get("gpu_type")
        # A job without a type (its partition may give it any): the types warmed on the
        # device it got, else every type.
        same_device = [warmed[t] for t, seen in warmed_on.items() if seen == device_seen(record) != "-"]
        references = ([warmed[gpu_type]] if gpu_type in warmed
                      else same_device or list(warmed.values()))
        if not references or not all(software.differences(ref, soft) for ref in references):
            continue
        key = (record.get("rule") or "-", software.describe(soft), software.describe(references[0]))
        counts = found.setdefault(key, [0, 0, 0])
        for kind in kinds.OBSERVED:
            section = hook_records.part(record, kind)
            if section is not None:
                counts[0] += hook_records.count(section.get("hits"))
                counts[1] += (hook_records.count(section.get("hits"))
                              + hook_records.count(section.get("misses")))
        counts[2] += 1
    return [f"warmed with {ref}; rule {rule} ran {ran}: {hits} of {lookups} hits in {n} "
            f"process{'es' if n != 1 else ''}; warm it in the jobs' own software (gpu_types: "
            "container, conda or python)"
            for (rule, ran, ref), (hits, lookups, n) in sorted(found.items())]


def usage(root: Path, loaded: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Usage]]:
    """Hits, misses, seconds saved and processes per rule (``by_rule``), per GPU type
    (``by_gpu_type``: the type a job was planned for, ``-`` when its partition may give it
    any) and per device it really computed on (``by_device``), from the stats hook's records
    under ``root`` (or those ``loaded`` from there already)."""
    groups: dict[str, dict[str, Usage]] = {"by_rule": defaultdict(Usage),
                                           "by_gpu_type": defaultdict(Usage),
                                           "by_device": defaultdict(Usage)}
    for record in hook_records.read(hook_records.records_dir(root)) if loaded is None else loaded:
        for axis, value in (("by_rule", record.get("rule")), ("by_gpu_type", record.get("gpu_type")),
                            ("by_device", device_seen(record))):
            bucket = groups[axis][f"{value or '-'}"]
            bucket.processes += 1
            for kind in kinds.OBSERVED:
                section = hook_records.part(record, kind)
                if section is not None:
                    bucket.hits[kind] = bucket.hits.get(kind, 0) + hook_records.count(section.get("hits"))
                    bucket.misses[kind] = (bucket.misses.get(kind, 0)
                                           + hook_records.count(section.get("misses")))
                    bucket.saved_seconds += hook_records.seconds(section.get("saved_seconds"))
    return {axis: dict(by) for axis, by in groups.items()}


def render(stats: dict[str, Any]) -> str:
    """The human-readable form of :func:`cache_stats`."""
    if stats["cache_root"] is None:
        return "caching is turned off (cache root 'none')\n"
    lines = [f"cache root: {stats['cache_root']}"]
    for kind, info in stats["kinds"].items():
        ages = ""
        if info["entries"]:
            ages = (f", last used {format_age(info['newest_use_age_seconds'])} to "
                    f"{format_age(info['oldest_use_age_seconds'])} ago")
        broken = f", {info['broken']} broken" if info["broken"] else ""
        lines.append(f"{kind:>8}: {info['entries']} entries, {format_size(info['bytes'])}{ages}{broken}")
        for row in info["by_function"][:5]:
            lines.append(f"          {row['entries']:>5} x {row['name']} ({format_size(row['bytes'])})")
        for row in info["broken_entries"]:
            lines.append(f"          broken: {row['key']} ({row['name']}): {row['problem']}")
    for axis, title in (("by_rule", "rule"), ("by_gpu_type", "GPU type"), ("by_device", "device seen")):
        groups = stats["usage"].get(axis) or {}
        if groups:
            lines.append(f"by {title}:")
            for name, counts in sorted(groups.items()):
                u = Usage.from_dict(counts)
                rate = f"{100 * u.hit_rate:.0f}%" if u.hit_rate is not None else "-"
                lines.append(f"  {name}: {u.total_hits} hits, {u.total_misses} misses ({rate} hit "
                             f"rate), {max(0.0, u.saved_seconds):.1f} s saved, {u.processes} processes")
    lines += [f"software mismatch: {line}" for line in stats.get("software_mismatches", [])]
    lines += [f"outside the cache root: {line}" for line in stats.get("outside_root", [])]
    if stats.get("runs"):
        lines.append("latest runs (for `gpu-cache doctor --explain --run-id`):")
        lines += [f"  {run['run_id']}: {run['rule'] or '-'} on {run['gpu_type'] or '-'}, "
                  f"{run['processes']} process(es), {format_age(time.time() - run['time'])} ago"
                  for run in stats["runs"]]
    return "\n".join(lines) + "\n"
