"""Preflight checks: can each cache folder be used, what is it on, and what will the jobs see."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from contextlib import nullcontext
from typing import Any

from gpu_cache.commands import common
from gpu_cache.commands.stats import outside_root
from gpu_cache.config import cluster, host_join, placement, targets
from gpu_cache.config.settings import Settings
from gpu_cache.config.units import format_age, format_size
from gpu_cache.core import device, kinds, software
from gpu_cache.core.errors import UsageError
from gpu_cache.core.shown import shown_lines
from gpu_cache.jobenv import env, fs


def slurm_source() -> str | None:
    """Which cluster ``sinfo`` answered for, and from which configuration: ``cluster NAME
    (config PATH)``, as ``scontrol show config`` reports them (a node of another cluster
    may read that one's configuration, e.g. a configless ``/run/slurm/conf``). None where
    ``scontrol`` does not tell."""
    try:
        out = cluster.bounded_output(["scontrol", "show", "config"])
    except (OSError, subprocess.SubprocessError):
        return None
    found = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    found = {name.strip(): value.strip() for name, value in found.items()}
    name, conf = found.get("ClusterName"), found.get("SLURM_CONF")
    if not name and not conf:
        return None
    return f"cluster {name or '?'} (config {conf or '?'})"


def preflight(settings: Settings) -> dict[str, Any]:
    """Check every cache kind's folder (creating it, unless within :func:`fs.diagnosis`) and
    collect what decides cache keys.

    ``ok`` is False when a kind cannot use its folder (it then runs without a cache or on
    a node-local fallback, as ``exports.problems`` says); ``warnings`` are worth reading
    but do not stop caching. Never raises for filesystem trouble.
    """
    report: dict[str, Any] = {"cache_root": str(settings.cache_root) if settings.cache_root else None,
                              "shared_group": settings.shared_group,
                              "kinds": {}, "warnings": [], "ok": True}
    exports = env.resolve(settings)
    if settings.cache_root is None:
        report["warnings"].append("caching is turned off (cache root 'none')")
    else:
        for kind in kinds.ALL:
            # resolve probed the kinds it exports; one the user pointed elsewhere is probed here
            # (a kind it does not export, such as the hook's records without the stats hook: not)
            check = exports.checks.get(kind.name) or (env.check_kind(settings, kind)
                                                      if kind.exported and kind.enabled(settings) else None)
            if check is not None:
                report["kinds"][kind.name] = check.as_dict()
                report["ok"] = report["ok"] and check.problem is None
    report["exports"] = exports.as_dict()
    report["single_flight"] = exports.single_flight.as_dict()
    report["tier"] = exports.tier.as_dict()
    report["warnings"] += exports.messages()  # problems, fallbacks, adjustments, low space
    # Jobs whose JAX used another folder (their own --jax_compilation_cache_dir): never warmed.
    report["outside_root"] = outside_root(settings.cache_root) if settings.cache_root else []
    report["warnings"] += report["outside_root"]  # those that still hold (stats lists them all)
    here, types = device.detect(), targets.gpu_types(settings)
    report["device"] = here.as_dict()
    offers, silent = cluster.query()
    offered = cluster.gres_by_partition(offers) if offers is not None else None
    report["gres"] = targets.gres_mapping(types, offered) if offered is not None else None
    report["warnings"] += [silent] if silent else []  # sinfo did not answer in time, or left lines unread
    report["slurm"] = slurm_source() if offers is not None else None
    # Types no node can take as their type's and this machine is not: their validation would fail.
    report["warnings"] += cluster.unreachable(types, here, offers)
    # What each type's warm and check jobs will ask for (the workflow's jobs read it here).
    report["placement"] = {name: placement.planned(settings, name, offers or ()) for name in types}
    # A mem_mb or a run no node can take: its jobs are refused, or the run is left out (cold).
    report["problems"] = [line for found in report["placement"].values() for line in found["problems"]]
    report["ok"] = report["ok"] and not report["problems"]
    for kind in kinds.ALL:  # what a kind says beyond its folder (ptxas: which one jobs run)
        part = kind.doctor_report(exports.values)
        if part is not None:
            report[kind.name] = part
    identity = software.identity()  # the key fields' versions, as stats and explain compare them
    report["versions"] = {name: identity.get(name) for name in software.key_fields()}
    report["key_environment"] = {name: os.environ.get(name) for name in kinds.KEY_ENVIRONMENT}
    return report


def render(report: dict[str, Any]) -> str:
    """The human-readable form of :func:`preflight`."""
    lines = [f"cache root: {report['cache_root'] or 'none (caching off)'}"]
    for kind, check in report["kinds"].items():
        free = format_size(check["free_bytes"]) if check["free_bytes"] is not None else "?"
        state = "ok" if check["problem"] is None else f"PROBLEM: {check['problem']}"
        if check["problem"] is None and check["read_only"]:
            state = "read-only"
        elif check["problem"] is None and check.get("missing"):
            state = "missing (`gpu-cache env` or `doctor --fix` would create it)"
        network = ", network" if check["network"] else ""
        lines.append(f"{kind:>9}: {state} ({check['fs_type']} [{check['family']}{network}], {free} free, "
                     f"{check['mode']} group {check['group']}) {check['path']}")
    flight = report.get("single_flight") or {}
    if flight.get("enabled"):
        scope = "; per node: locks hold within one node" if flight.get("per_node") else ""
        wait = format_age(float(flight["timeout_seconds"]))
        lines.append(f"single-flight: on, {flight['mode']} mode (locks in {flight['locks']}; "
                     f"{flight['why']}; a waiter compiles itself after {wait}{scope})")
    elif flight:
        lines.append(f"single-flight: off ({flight.get('problem')})")
    tier = report.get("tier") or {}
    if tier.get("on"):
        free = f", {format_size(tier['free_bytes'])} free" if tier.get("free_bytes") is not None else ""
        lines.append(f"local tier: on in {tier['local']} ({tier.get('fs_type', '?')}{free}, bound "
                     f"{format_size(int(tier['max_bytes']))}; {tier['why']}): jobs' "
                     f"{', '.join(kinds.names_of(kinds.TIERED))} caches work there, fed from and promoted "
                     "to the root")
    elif tier:
        state = f"PROBLEM: {tier['problem']}" if tier.get("problem") else tier.get("why")
        lines.append(f"local tier: off ({state})")
    dev = report["device"]
    where = f"{dev['count']} x {dev['name']}" if dev["count"] else dev["name"]
    known = [f"{what} {dev[name]}" for name, what in (("compute_capability", "compute capability"),
                                                      ("driver", "driver")) if dev.get(name)]
    lines.append(f"   device: {where} (gpu_type {', '.join([dev['gpu_type'], *known])})")
    if report.get("gres") is not None:
        source = report.get("slurm") or "a cluster scontrol does not name"
        lines.append(f"    slurm: sinfo answered for {source}")
    lines += [f"     gres: {line}" for line in report.get("gres") or []]
    lines += [f"placement: {line}" for name, found in (report.get("placement") or {}).items()
              if (line := placement_line(name, found))]
    lines += [line for kind in kinds.ALL if isinstance(report.get(kind.name), dict)
              for line in kind.doctor_lines(report[kind.name])]
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    lines.append(f" versions: {versions}")
    lines += [f"  warning: {w}" for w in report["warnings"]]
    lines += [f"  PROBLEM: {p}" for p in report.get("problems") or []]
    for kind, fixed in report.get("fixed", {}).items():
        lines.append(f"    fixed: {kind}: removed {fixed['entries_removed']} broken entries, "
                     f"repaired {fixed['repaired']}")
    failed = [] if all(c["problem"] is None for c in report["kinds"].values()) else \
        ["some caches cannot be used (jobs still run)"]
    failed += ["some jobs cannot run as configured (PROBLEM above)"] if report.get("problems") else []
    lines.append("result: " + ("; ".join(failed) or "ok"))
    return shown_lines(lines)


def placement_line(gpu_type: str, found: dict[str, Any]) -> str | None:
    """What a type's warm and check jobs ask for (``placement.planned``), where gpu-cache sizes
    them or plans its warm to run nothing, in one line (None: neither)."""
    check = f"check one at a time in {format_size(found['check_mb'] << 20)}" if found.get("check_mb") else ""
    left = f" ({len(found['left_out'])} left out: PROBLEM below)" if found.get("left_out") else ""
    if found.get("skip"):
        return f"{gpu_type}: its warm job runs no workload and asks for no GPU: {found['skip']}" + \
            (f"; {check}{left}" if check else "")
    if not found.get("warm_mb"):
        return None
    runs = len(found.get("runs_mb") or ())
    budget = f" of {format_size(found['budget_mb'] << 20)}" if found.get("budget_mb") else ""
    return (f"{gpu_type}: warm runs {found['warm_parallel']} of its {runs} runs at once in "
            f"{format_size(found['warm_mb'] << 20)}{budget}{left}; {check}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON report here")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a cache is unusable")
    parser.add_argument("--explain", action="store_true",
                        help="account for every miss `gpu-cache stats` counts, by rule and cause, and "
                             "explain why computations missed: diff their cache-key parts against "
                             "earlier runs' (from the stats hook's records)")
    parser.add_argument("--run-id", help="with --explain: the run whose misses to explain "
                                         "(default: every record; key by key, the latest that missed)")
    parser.add_argument("--fix", action="store_true",
                        help="also remove broken entries (empty or truncated JAX entries, orphan halves, "
                             "stale temporaries), as prune does, keeping every good one")


def run(args: argparse.Namespace) -> int:
    settings = common.settings(args)
    if args.explain:
        return explain_misses(settings, args)
    with nullcontext() if args.fix else fs.diagnosis():  # a diagnosis changes nothing on disk
        report = preflight(settings)
    key = getattr(args, "config_key", None) or "gpu_cache"
    unjoined = host_join.unjoined(args.config, key) if getattr(args, "config", None) else None
    report["warnings"] += [unjoined] if unjoined else []  # gpu-cache's settings, no module block
    if args.fix and settings.cache_root is not None and settings.cache_root.is_dir():
        from gpu_cache.commands.prune import repair

        fixed = repair(settings)
        report["fixed"] = {kind.name: vars(fixed.kinds[kind.name]) for kind in kinds.PRUNABLE}
        report["warnings"] += fixed.problems
    if args.output:
        common.emit(report, args.output, to_stdout=False)
    sys.stdout.write(common.dumps(report) if args.json else render(report))
    return 0 if report["ok"] or args.no_fail else 1


def explain_misses(settings: Settings, args: argparse.Namespace) -> int:
    """``doctor --explain``: every miss accounted for, by rule and cause (``explain``)."""
    from gpu_cache.commands import explain

    if settings.cache_root is None:
        raise UsageError("--explain needs a cache root (caching is turned off)")
    report = explain.account_cache(settings.cache_root, args.run_id)
    if args.output:
        common.emit(report, args.output, to_stdout=False)
    sys.stdout.write(common.dumps(report) if args.json else explain.render_account(report))
    return 0
