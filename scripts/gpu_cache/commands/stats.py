"""Statistics: what each cache holds, and how the recorded jobs used it."""

from __future__ import annotations

import argparse
import heapq
import os
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple

from gpu_cache.commands import common
from gpu_cache.config.settings import Settings
from gpu_cache.config.units import format_age, format_size
from gpu_cache.core import device, hook_records, kinds, names, safe_io, software, verified
from gpu_cache.core.kinds import Entry, Kind
from gpu_cache.core.shown import shown_lines
from gpu_cache.reports import Usage

TOP = 10


def cache_stats(settings: Settings) -> dict[str, Any]:
    """Entries, bytes, oldest and newest use per kind, top entries by size and by function,
    and hit/miss totals per rule and GPU type from the stats hook's records.

    Reads what prune reads, without verifying anything new; a kind's verification record
    (:mod:`gpu_cache.core.verified`) spares it manifests and ``-atime`` files read before, and
    what it reads now is added to the record (best effort: a read-only cache keeps its own).
    """
    from gpu_cache.jobenv.env import root_problem

    root = settings.cache_root
    out: dict[str, Any] = {"cache_root": str(root) if root else None, "kinds": {}, "usage": {}}
    if root is None:
        return out
    out["problem"] = root_problem(settings)  # jobs cannot use it: doctor's reason
    now = time.time()
    for kind in kinds.ALL:
        folder = kind.folder(root)
        # It verifies nothing: the record keeps what prune verified (complete=False). None
        # where the folder links out of the root: stats writes nothing there (#21).
        record = verified.Record.load(folder, complete=False) \
            if kind.verifies and _within(folder, root) else None
        found = kind.scan(folder, record=record)
        if record is not None:
            record.save()
        out["kinds"][kind.name] = {**summarise(found, now), "path": str(folder),
                                   "last_use_from": kind.last_use, **kind.stats_extra(found)}
    out["tier"] = tier_stats(settings, now)
    found_records = list(hook_records.read(kinds.records_dir(root)))  # read once, for both
    out["usage"] = {axis: {name: u.as_dict() for name, u in groups.items()}
                    for axis, groups in usage(root, found_records).items()}
    # Findings that no longer hold are shown too, with when they were last seen (#25).
    out["software_mismatches"] = software_mismatches(root, found_records, stale=True)
    out["outside_root"] = outside_root(root, found_records, stale=True)
    out["runs"] = hook_records.runs(found_records)[:TOP]
    return out


def tier_stats(settings: Settings, now: float) -> dict[str, Any]:
    """This node's local tier of the cache root (issue 23): its folder, its bound, and per
    tiered kind what :func:`summarise` says (no kinds where this node has no tier). Entries
    there that the root lacks were not promoted (yet, or the root is read-only)."""
    from gpu_cache.jobenv import tier

    where = tier.location(settings)
    local = where.folder if where else None
    out: dict[str, Any] = {"local": str(local) if local else None,
                           "max_size": settings.local_tier.max_size, "kinds": {}}
    if local is None or not local.is_dir():
        return out
    for kind in kinds.ALL:
        folder = kind.folder(local)
        if kind.tiered and _within(folder, local):  # a link out of the tier is not read (#21)
            out["kinds"][kind.name] = {**summarise(kind.scan(folder), now), "path": str(folder)}
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
    """Whether ``path`` is the cache root's: under it, or its node-local tier (issue 23)."""
    folder = os.path.normpath(path)
    return os.path.isabs(folder) and (folder == str(root) or folder.startswith(str(root).rstrip("/") + "/")
                                      or kinds.in_tier_of(folder, root))


def outside_folder(record: dict[str, Any], root: Path, kind: Kind) -> tuple[str, bool] | None:
    """The cache folder of ``kind`` a recorded process used when it lies outside the cache root,
    and whether its program chose it (a flag such as --jax_compilation_cache_dir, or
    jax.config.update) rather than the kind's exported variable; None otherwise (or where the
    kind's hook records no folder)."""
    folder = kind.used_folder(record)
    if folder is None or _under(folder, root):
        return None
    exported = record["env"].get(kind.env_var)
    return folder, not (isinstance(exported, str) and os.path.normpath(exported) == os.path.normpath(folder))


def _last_seen(when: float, now: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(when))
    return f"{format_age(max(0.0, now - when))} ago ({stamp})"


def processes_text(n: int) -> str:
    return f"{n} process{'es' if n != 1 else ''}"


@dataclass
class _Seen:
    """What the recorded processes behind one finding add up to: how many, their hits and
    lookups, and when the last of them ran."""

    processes: int = 0
    hits: int = 0
    lookups: int = 0
    last: float = 0.0

    def add(self, record: dict[str, Any], sections: list[dict[str, Any]]) -> None:
        self.processes += 1
        for section in sections:
            hits = hook_records.count(section.get("hits"))
            self.hits += hits
            self.lookups += hits + hook_records.count(section.get("misses"))
        self.last = max(self.last, record["time"])


@dataclass
class _Tally:
    """The findings algorithm, for any kind of finding: the processes that show one, by its
    key (whose first part is their rule), and the times of the rule's processes that did not.
    A finding no longer holds once a process of its rule ran without it after the last that
    showed it."""

    found: dict[tuple[str, ...], _Seen] = field(default_factory=dict)
    fine: dict[str, list[float]] = field(default_factory=dict)

    def shows(self, key: tuple[str, ...], record: dict[str, Any], sections: list[dict[str, Any]]) -> None:
        self.found.setdefault(key, _Seen()).add(record, sections)

    def clear(self, rule: str, record: dict[str, Any]) -> None:
        self.fine.setdefault(rule, []).append(record["time"])

    def later(self, key: tuple[str, ...], seen: _Seen) -> int:
        """How many processes of the finding's rule ran without it since it was last seen."""
        return sum(1 for when in self.fine.get(key[0], []) if when > seen.last)


class Finding(NamedTuple):
    """A line of stats about some recorded processes; ``holds``: later processes did not
    make it untrue. ``key`` names what it is about: (rule, folder) or (rule, ran, warmed)."""

    key: tuple[str, ...]
    text: str
    holds: bool


def outside_findings(root: Path, loaded: list[dict[str, Any]] | None = None,
                     now: float | None = None) -> list[Finding]:
    """One line per rule and folder of processes whose cache folder of a kind was outside the
    cache root (for the kinds whose hook records the folder the tool really used), with their
    hits and the fix (gpu-cache neither warms nor prunes such a folder); and whether it still
    holds: it no longer does once later processes of the rule used the cache root (the line then
    says when it was last seen)."""
    loaded = list(hook_records.read(kinds.records_dir(root))) if loaded is None else loaded
    now = time.time() if now is None else now
    tally = _Tally()
    watched = [kind for kind in kinds.ALL if kind.records_folder]
    for record in loaded:
        rule = record.get("rule") or "-"
        for kind in watched:
            outside = outside_folder(record, root, kind)
            if outside is None:
                if kind.section(record) is not None:  # it used the root
                    tally.clear(rule, record)
                continue
            folder, own_flag = outside  # a key of text: "own" where its program chose the folder
            tally.shows((rule, folder, "own" if own_flag else "", kind.name), record,
                        [kind.section(record) or {}])
    lines = []
    for key, seen in sorted(tally.found.items()):
        rule, folder, own_flag, name = key
        said = (f"rule {rule} used {folder} (outside the cache root {root}) in "
                f"{processes_text(seen.processes)}, {seen.hits} of {seen.lookups} hits")
        later = tally.later(key, seen)
        if later:
            lines.append(Finding((rule, folder), f"{said}; last seen {_last_seen(seen.last, now)}; no "
                                 f"longer: its {processes_text(later)} since used the cache root", False))
            continue
        kind = kinds.named(name)
        lines.append(Finding((rule, folder), f"{said}; gpu-cache neither warms nor prunes it: "
                             f"{kind.outside_fix(bool(own_flag))} (gpu-cache's folder is "
                             f"{kind.folder(root)})", True))
    return lines


def outside_root(root: Path, loaded: list[dict[str, Any]] | None = None, stale: bool = False) -> list[str]:
    """The lines of :func:`outside_findings` that still hold (with ``stale``: all of them)."""
    return [f.text for f in outside_findings(root, loaded) if f.holds or stale]


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


def warmed_software(loaded: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """From the records of gpu-cache's own passes: the software of the latest that warmed or
    validated each GPU type, and the device it saw."""
    warmed: dict[str, dict[str, Any]] = {}
    warmed_on: dict[str, str] = {}
    for record in sorted(loaded, key=lambda r: r["time"]):
        if record.get("rule") in names.OWN_RULES and isinstance(record.get("software"), dict):
            warmed[record.get("gpu_type") or "-"] = record["software"]
            warmed_on[record.get("gpu_type") or "-"] = device_seen(record)
    return warmed, warmed_on


def mismatch_of(record: dict[str, Any], warmed: dict[str, dict[str, Any]],
                warmed_on: dict[str, str]) -> dict[str, Any] | None:
    """The software that warmed a job's GPU type when the job ran other software (a job
    without a type: the types warmed on the device it got, else every type, and only when
    it differs from all of them); None when it ran the same, or is one of gpu-cache's own."""
    soft = record.get("software")
    if not isinstance(soft, dict) or record.get("rule") in names.OWN_RULES:
        return None
    gpu_type = record.get("gpu_type")
    same_device = [warmed[t] for t, seen in warmed_on.items() if seen == device_seen(record) != "-"]
    references = [warmed[gpu_type]] if gpu_type in warmed else same_device or list(warmed.values())
    if not references or not all(software.differences(ref, soft) for ref in references):
        return None
    return references[0]


def mismatch_findings(root: Path, loaded: list[dict[str, Any]] | None = None,
                      now: float | None = None) -> list[Finding]:
    """One line per (rule, software) of jobs whose software differs from the software that
    warmed and validated their GPU type's cache (from the records), with their hits: such
    jobs miss, since cache keys hold the jax/jaxlib and triton versions and the Python ABI.
    And whether it still holds: it no longer does once later processes of the rule ran the
    software that warmed their type (the line then says when it was last seen)."""
    loaded = list(hook_records.read(kinds.records_dir(root))) if loaded is None else loaded
    now = time.time() if now is None else now
    warmed, warmed_on = warmed_software(loaded)
    tally = _Tally()
    for record in loaded:
        if record.get("rule") in names.OWN_RULES or not isinstance(record.get("software"), dict):
            continue
        reference = mismatch_of(record, warmed, warmed_on)
        rule = record.get("rule") or "-"
        if reference is None:
            tally.clear(rule, record)
            continue
        sections = [s for s in (kind.section(record) for kind in kinds.ALL if kind.observed) if s is not None]
        tally.shows((rule, software.describe(record["software"]), software.describe(reference)), record,
                    sections)
    lines = []
    for key, seen in sorted(tally.found.items()):
        rule, ran, ref = key
        said = (f"warmed with {ref}; rule {rule} ran {ran}: {seen.hits} of {seen.lookups} hits in "
                f"{processes_text(seen.processes)}")
        later = tally.later(key, seen)
        if later:
            lines.append(Finding(key, f"{said}; last seen {_last_seen(seen.last, now)}; no "
                                 f"longer: its {processes_text(later)} since ran the software that "
                                 "warmed it", False))
        else:
            lines.append(Finding(key, f"{said}; warm it in the jobs' own software "
                                 "(gpu_types: container, conda or python)", True))
    return lines


def software_mismatches(root: Path, loaded: list[dict[str, Any]] | None = None,
                        stale: bool = False) -> list[str]:
    """The lines of :func:`mismatch_findings` that still hold (with ``stale``: all of them)."""
    return [f.text for f in mismatch_findings(root, loaded) if f.holds or stale]


def usage(root: Path, loaded: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Usage]]:
    """Hits, misses, seconds saved, seconds waited on other processes' compiles and seconds
    compiled itself (:func:`flight_seconds`), and processes per rule (``by_rule``), per GPU type
    (``by_gpu_type``: the type a job was planned for, ``-`` when its partition may give it
    any) and per device it really computed on (``by_device``), from the stats hook's records
    under ``root`` (or those ``loaded`` from there already)."""
    groups: dict[str, dict[str, Usage]] = {"by_rule": defaultdict(Usage),
                                           "by_gpu_type": defaultdict(Usage),
                                           "by_device": defaultdict(Usage)}
    for record in hook_records.read(kinds.records_dir(root)) if loaded is None else loaded:
        for axis, value in (("by_rule", record.get("rule")), ("by_gpu_type", record.get("gpu_type")),
                            ("by_device", device_seen(record))):
            bucket = groups[axis][f"{value or '-'}"]
            bucket.processes += 1
            for kind in kinds.ALL:
                section = kind.section(record) if kind.observed else None
                if section is not None:
                    hits, misses = (hook_records.count(section.get(f)) for f in ("hits", "misses"))
                    bucket.hits[kind.name] = bucket.hits.get(kind.name, 0) + hits
                    bucket.misses[kind.name] = bucket.misses.get(kind.name, 0) + misses
                    bucket.saved_seconds += hook_records.seconds(section.get("saved_seconds"))
            waited, compiled = flight_seconds(record)
            bucket.waited_seconds += waited
            bucket.compiled_seconds += compiled
    return {axis: dict(by) for axis, by in groups.items()}


def flight_seconds(record: dict[str, Any]) -> tuple[float, float]:
    """What single-flight saved a recorded process and what it cost it: the seconds it waited
    for other processes' compiles (each kind's ``single_flight.wait_seconds``) and the seconds it
    compiled entries itself (each kind's :attr:`~gpu_cache.core.kinds.Kind.own_compile_field`)."""
    waited = compiled = 0.0
    for kind in kinds.ALL:
        section = kind.section(record) if kind.observed else None
        if section is None:
            continue
        flight = section.get("single_flight")
        if isinstance(flight, dict):
            waited += hook_records.seconds(flight.get("wait_seconds"))
        if kind.own_compile_field:
            compiled += hook_records.seconds(section.get(kind.own_compile_field))
    return waited, compiled


def flight_text(u: Usage) -> str:
    """``; 12.3 s waiting on other jobs' compiles, 40.1 s compiling their own`` where the
    processes waited or compiled (records of a hook that measured neither: nothing)."""
    if not (u.waited_seconds or u.compiled_seconds):
        return ""
    return (f"; {u.waited_seconds:.1f} s waiting on other jobs' compiles, "
            f"{u.compiled_seconds:.1f} s compiling their own")


def saved_text(u: Usage) -> str:
    """The compile time the hits saved, by JAX's own estimate (the compile time stored with
    each entry minus the time to load it): ``, 12.3 s saved``; ``, time saved not measured``
    when the estimate is not positive (entries that load about as slowly as they compiled,
    such as small programs on a CPU: "0.0 s saved" would read as "no gain"); nothing without
    hits."""
    if not u.total_hits:
        return ""
    return f", {u.saved_seconds:.1f} s saved" if u.saved_seconds > 0 else ", time saved not measured"


def _kind_lines(by_kind: dict[str, Any]) -> list[str]:
    """Each kind's row of :func:`render`, with its top functions and broken entries."""
    lines = []
    for kind, info in by_kind.items():
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
    return lines


def render(stats: dict[str, Any]) -> str:
    """The human-readable form of :func:`cache_stats`."""
    if stats["cache_root"] is None:
        return "caching is turned off (cache root 'none')\n"
    lines = [f"cache root: {stats['cache_root']}"]
    if stats.get("problem"):
        lines.append(f"  PROBLEM: {stats['problem']} (jobs do not use it; `gpu-cache doctor` says more)")
    lines += _kind_lines(stats["kinds"])
    tier = stats.get("tier") or {}
    if tier.get("kinds"):
        total = sum(info["bytes"] for info in tier["kinds"].values())
        lines.append(f"local tier (this node): {tier['local']}, {format_size(total)} of "
                     f"{format_size(tier['max_size'])}")
        lines += _kind_lines(tier["kinds"])
    for axis, title in (("by_rule", "rule"), ("by_gpu_type", "GPU type"), ("by_device", "device seen")):
        groups = stats["usage"].get(axis) or {}
        if groups:
            lines.append(f"by {title}:")
            for name, counts in sorted(groups.items()):
                u = Usage.from_dict(counts)
                rate = f"{100 * u.hit_rate:.0f}%" if u.hit_rate is not None else "-"
                lines.append(f"  {name}: {u.total_hits} hits, {u.total_misses} misses ({rate} hit "
                             f"rate){saved_text(u)}, {u.processes} processes{flight_text(u)}")
    lines += [f"software mismatch: {line}" for line in stats.get("software_mismatches", [])]
    lines += [f"outside the cache root: {line}" for line in stats.get("outside_root", [])]
    if stats.get("runs"):
        lines.append("latest runs (for `gpu-cache doctor --explain --run-id`):")
        lines += [f"  {run['run_id']}: {run['rule'] or '-'} on {run['gpu_type'] or '-'}, "
                  f"{run['processes']} process(es), {format_age(time.time() - run['time'])} ago"
                  for run in stats["runs"]]
    return shown_lines(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead")


def run(args: argparse.Namespace) -> int:
    from gpu_cache.jobenv.fs import require_folder_or_missing

    with kinds.no_cyclic_gc():  # millions of objects and no cycles
        settings = common.settings(args)
        if settings.cache_root is not None:
            require_folder_or_missing(settings.cache_root)
        report = cache_stats(settings)
        sys.stdout.write(common.dumps(report, compact=True) if args.json else render(report))
    return 0
