"""``gpu-cache doctor --explain``: why did computations miss? A kind that explains its misses has
an explain part (``kind.explain``, :class:`gpu_cache.core.kinds.explaining.Explain`: JAX diffs the
cache-key parts of two runs, Inductor its graphs' FX key parts, jax-triton its kernels' key parts,
...); this module picks the processes to explain and accounts for every miss that ``gpu-cache
stats`` counts, those of a kind that explains none as their records name them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_cache.commands import stats
from gpu_cache.core import hook_records, kinds, software
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import Seen
from gpu_cache.core.kinds.explaining import Explain
from gpu_cache.core.shown import shown_lines


def explain_records(all_records: list[dict[str, Any]], run_id: str | None = None,
                    limit: int = 20) -> list[dict[str, Any]]:
    """Explain the misses of one run (``run_id``), or else of the latest record with misses
    that a kind explains, against every record written before them. At most ``limit``
    explanations. (A record of a jax that names no miss has its misses inferred, as
    :func:`account` does: the keys it computed that no earlier process computed.)"""
    ordered = sorted(all_records, key=lambda r: float(r.get("time") or 0.0))
    if run_id is not None:
        targets = [r for r in ordered if r.get("run_id") == run_id]
    else:
        targets = next(([r] for r in reversed(ordered) if any(_misses(kind, r) for kind in kinds.ALL)), [])
    out: list[dict[str, Any]] = []
    for record in targets:
        start = float(record.get("time") or 0.0)
        earlier = [r for r in ordered if float(r.get("time") or 0.0) < start and r is not record]
        for kind in kinds.ALL:
            if kind.explain is not None and len(out) < limit:
                out += kind.explain.record(record, earlier)[:limit - len(out)]
    return out


def _misses(kind: kinds.Kind, record: dict[str, Any]) -> bool:
    """Whether the record names or counts misses of ``kind`` that the kind explains."""
    section = kind.section(record) if kind.observed and kind.explain is not None else None
    return bool(section) and bool(section.get("missed") or hook_records.count(section.get("misses"))) \
        and bool(kind.explain.record(record, []))


def _records(cache_root: Path, run_id: str | None) -> list[dict[str, Any]]:
    found = list(hook_records.read(kinds.records_dir(cache_root)))
    if run_id is not None and not any(r.get("run_id") == run_id for r in found):
        latest = [run["run_id"] for run in hook_records.runs(found)[:5]]
        raise UsageError(f"no records of run {run_id!r} under {cache_root}; latest runs: "
                         f"{', '.join(latest) or 'none'} (`gpu-cache stats` lists them)")
    return found


#: At most this many missed computations are explained one by one per rule and kind.
KEYS_PER_CAUSE = 20
#: Why the warm pass misses: that is its job.
WARMING = ("the warm pass compiles what the cache lacks (expected: a warm step that finds "
           "everything only re-checks)")


def account(found: list[dict[str, Any]], cache_root: Path, now: float | None = None) -> list[dict[str, Any]]:
    """Every miss that ``gpu-cache stats`` counts, per rule and kind (the same counts as its
    ``by_rule``), split by cause: the warm pass's own compiles, a cache folder outside the
    cache root, software other than what warmed the type (both as stats words them, with
    when a finding was last seen once it no longer holds), and otherwise the missed
    computations one by one (:meth:`Explain.misses`, at most :data:`KEYS_PER_CAUSE` per
    rule and kind)."""
    ordered = sorted(found, key=lambda r: float(r.get("time") or 0.0))
    findings = {f.key: f.text for f in stats.outside_findings(cache_root, ordered, now)
                + stats.mismatch_findings(cache_root, ordered, now)}
    warmed, warmed_on = stats.warmed_software(ordered)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    seen = Seen(cache_root)
    observed = [kind for kind in kinds.ALL if kind.observed]
    for record in ordered:
        rule = record.get("rule") or "-"
        for kind in observed:
            section = kind.section(record)
            misses = hook_records.count(section.get("misses")) if section else 0
            if not misses:
                continue
            group = groups.setdefault((rule, kind.name), {"rule": rule, "kind": kind.name, "misses": 0,
                                                          "processes": 0, "causes": {}})
            group["misses"] += misses
            group["processes"] += 1
            folder = stats.outside_folder(record, cache_root, kind)
            reference = stats.mismatch_of(record, warmed, warmed_on)
            if record.get("rule") == "warm_cache":
                causes = [(WARMING, misses, [])]
            elif folder is not None:
                causes = [(findings[rule, folder[0]], misses, [])]
            elif reference is not None:
                ran = software.describe(record["software"])
                causes = [(findings[rule, ran, software.describe(reference)], misses, [])]
            else:
                room = KEYS_PER_CAUSE - sum(len(c["keys"]) for c in group["causes"].values())
                # a kind that explains none: its misses as the record names them
                explain = kind.explain or Explain(kind)
                causes = explain.misses(record, section, misses, seen, room)
            for cause, count, keys in causes:
                entry = group["causes"].setdefault(cause, {"cause": cause, "misses": 0, "processes": 0,
                                                           "keys": []})
                entry["misses"] += count
                entry["processes"] += 1
                entry["keys"] += keys
        for kind in kinds.ALL:
            if kind.explain is not None:
                kind.explain.seen(record, seen)
    return [{**g, "causes": sorted(g["causes"].values(), key=lambda c: -c["misses"])}
            for _key, g in sorted(groups.items())]


def account_cache(cache_root: Path, run_id: str | None = None) -> dict[str, Any]:
    """``doctor --explain``: :func:`account` of the records under ``cache_root`` (of one run
    with ``run_id``), and :func:`explain_records` (the latest process that missed, or the run).

    Raises:
        UsageError: ``run_id`` names no recorded run.
    """
    found = _records(cache_root, run_id)
    chosen = found if run_id is None else [r for r in found if r.get("run_id") == run_id]
    return {"by_rule": account(chosen, cache_root), "explain": explain_records(found, run_id)}


def _key_lines(item: dict[str, Any], indent: str) -> list[str]:
    other = item["compared_with"]
    against = (f" (vs {other['key'][:60]} from {other.get('rule') or other.get('run_id') or '-'} on "
               f"{other.get('host')})" if other else "")
    changed = ", ".join(item["changed"]) or "-"
    lines = [f"{indent}{item['name']}: changed key parts: {changed}{against}"]
    return lines + [f"{indent}  - {cause}" for cause in item["causes"]]


def render(explanations: list[dict[str, Any]]) -> str:
    """The human-readable form of :func:`explain_records`."""
    if not explanations:
        return "no recorded misses to explain one by one\n"
    return shown_lines(line for item in explanations for line in _key_lines(item, ""))


def render_account(report: dict[str, Any], shown: int = 5) -> str:
    """The human-readable form of :func:`account_cache`: per rule and kind, the misses of
    ``gpu-cache stats`` and their causes, ``shown`` computations per cause."""
    if not report["by_rule"]:
        return "no recorded misses to explain\n"
    lines = ["misses by rule, as `gpu-cache stats` counts them:"]
    for group in report["by_rule"]:
        lines.append(f"{group['rule']}: {group['misses']} {group['kind']} misses in "
                     f"{stats.processes_text(group['processes'])}")
        for cause in group["causes"]:
            where = stats.processes_text(cause["processes"])
            lines.append(f"  {cause['misses']} in {where}: {cause['cause']}")
            for item in cause["keys"][:shown]:
                lines += _key_lines(item, "    ")
            if len(cause["keys"]) > shown:
                lines.append(f"    ... {len(cause['keys']) - shown} more (--json lists them)")
    return shown_lines(lines)
