"""Why did a JAX computation miss? Diff the cache-key parts of two runs and name the cause.
(Inductor's graphs: :mod:`gpu_cache.commands.explain_inductor`, dispatched from here.)

The stats hook records, per JAX cache key, a hash of each part that
``jax._src.cache_key.get`` feeds into the key (computation, jaxlib version, backend version,
XLA flags, compile options, accelerator config, compression, custom hook), plus the
process's key-relevant environment (``XLA_FLAGS``, ``JAX_ENABLE_X64``,
``CUDA_VISIBLE_DEVICES``, the cache folder, the XLA-caches setting) and context (device
count and kinds, compression algorithm, jaxlib). A miss is explained by comparing its parts
with those of the closest earlier key of the same computation name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpu_cache.commands import explain_inductor, explain_kernels, explain_ptxas, stats
from gpu_cache.core import hook_records, kinds, software
from gpu_cache.core.errors import UsageError
from gpu_cache.core.reports import Missed
from gpu_cache.core.shown import shown_lines
from gpu_cache.jobenv.tier import in_tier_of

#: What each key part means when it changed, as the first words of a hint.
PART_HINTS = {
    "computation": "the program itself (its IR) changed: other shapes or dtypes "
                   "(JAX_ENABLE_X64), a value baked into the program, changed source code, or a "
                   "Pallas/Triton kernel whose Python file lies at another path (the path is part "
                   "of the kernel's IR)",
    "jax_lib version": "another jaxlib version is installed",
    "backend version": "another platform version (GPU driver, CUDA plugin or runtime)",
    "XLA flags": "XLA_FLAGS (or --xla_* command-line flags) differ",
    "compile_options": "the compile options differ (on jax <= 0.10 they hold the cache folder's "
                       "path unless XLA caches are 'none'; also replica/partition counts)",
    "accelerator_config": "the device topology differs: another number of visible devices "
                          "(CUDA_VISIBLE_DEVICES, --gres) or another device model; even a "
                          "single-device jit misses when the visible GPU count changes",
    "compression": "the compression algorithm differs: zstandard is importable in one "
                   "environment only (JAX then uses zstd, else zlib)",
    "custom_hook": "jax's custom cache-key hook returned something else",
}


def _name_of(key: str) -> str:
    return key.rsplit("-", 1)[0]


def _key_parts(record: dict[str, Any]) -> dict[str, dict[str, str]]:
    part = record.get("jax")
    parts = part.get("key_parts") if isinstance(part, dict) else None
    return parts if isinstance(parts, dict) else {}


def _key_context(record: dict[str, Any]) -> dict[str, Any]:
    context = (record.get("jax") or {}).get("key_context")
    return context if isinstance(context, dict) else {}


def _specific_causes(changed: list[str], now: dict[str, Any], before: dict[str, Any]) -> list[str]:
    """Sentences naming the concrete difference behind each changed part, where the
    records' environment and context show it."""
    env_now, env_before = now.get("env") or {}, before.get("env") or {}
    ctx_now, ctx_before = _key_context(now), _key_context(before)
    causes = []
    for part in changed:
        if part == "XLA flags" and env_now.get("XLA_FLAGS") != env_before.get("XLA_FLAGS"):
            causes.append(f"XLA_FLAGS changed from {env_before.get('XLA_FLAGS')!r} to "
                          f"{env_now.get('XLA_FLAGS')!r}: export the same XLA_FLAGS when warming "
                          "and in the jobs")
        elif part == "compile_options":
            dirs = (env_before.get("JAX_COMPILATION_CACHE_DIR"), env_now.get("JAX_COMPILATION_CACHE_DIR"))
            xla = (env_before.get("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"),
                   env_now.get("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"))
            if dirs[0] != dirs[1] and any(x != "none" for x in xla):
                causes.append(f"the cache folder's path is in the key (jax <= 0.10 with XLA caches "
                              f"{xla[0] or 'default'!s}/{xla[1] or 'default'!s}): {dirs[0]} vs "
                              f"{dirs[1]}; set xla_caches: none (JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"
                              "=none) or use the same path everywhere")
            elif xla[0] != xla[1]:
                causes.append(f"JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES changed from {xla[0]!r} to "
                              f"{xla[1]!r}")
        elif part == "accelerator_config":
            if (ctx_now.get("device_count"), ctx_now.get("device_kinds")) != (
                    ctx_before.get("device_count"), ctx_before.get("device_kinds")):
                causes.append(
                    f"visible devices changed from {ctx_before.get('device_count')} x "
                    f"{ctx_before.get('device_kinds')} to {ctx_now.get('device_count')} x "
                    f"{ctx_now.get('device_kinds')} (CUDA_VISIBLE_DEVICES "
                    f"{env_before.get('CUDA_VISIBLE_DEVICES')!r} -> "
                    f"{env_now.get('CUDA_VISIBLE_DEVICES')!r}): "
                    "warm with the same number of visible GPUs as the jobs")
        elif part == "compression" and ctx_now.get("compression") != ctx_before.get("compression"):
            causes.append(f"compression changed from {ctx_before.get('compression')} to "
                          f"{ctx_now.get('compression')}: install zstandard in both environments "
                          "or in neither")
        elif part == "computation" and env_now.get("JAX_ENABLE_X64") != env_before.get("JAX_ENABLE_X64"):
            causes.append(f"JAX_ENABLE_X64 changed from {env_before.get('JAX_ENABLE_X64')!r} to "
                          f"{env_now.get('JAX_ENABLE_X64')!r}, which changes dtypes in the program")
        elif part == "jax_lib version" and ctx_now.get("jaxlib") != ctx_before.get("jaxlib"):
            causes.append(f"jaxlib changed from {ctx_before.get('jaxlib')} to {ctx_now.get('jaxlib')}")
    return causes


def _cache_dir(record: dict[str, Any]) -> str | None:
    """The JAX cache folder a recorded process really used."""
    folder = (record.get("jax") or {}).get("cache_dir")
    return folder if isinstance(folder, str) and folder else None


def _same_cache(here: str, there: str) -> bool:
    """Whether two JAX cache folders hold one cache: the same folder, or a root's folder and
    that root's node-local tier (issue 23: a job with the tier reads the root on a miss)."""
    here, there = os.path.normpath(here), os.path.normpath(there)
    if here == there:
        return True
    return any(in_tier_of(a, os.path.dirname(b)) for a, b in ((here, there), (there, here)))


def _who(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record.get(k) for k in ("time", "host", "pid", "rule", "gpu_type", "run_id")}


def explain_key(key: str, record: dict[str, Any], earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """Explain why ``key`` (computed by the process of ``record``) missed, against
    ``earlier`` records (any order). The result names the changed key parts and a cause
    for each; ``compared_with`` is None when no earlier run computed the same name."""
    name = _name_of(key)
    parts = _key_parts(record).get(key)
    if not isinstance(parts, dict):
        parts = None
    result: dict[str, Any] = {"name": name, "key": key, "compared_with": None, "changed": [],
                              "causes": []}
    if parts is None:
        result["causes"] = ["the stats hook recorded no key parts for this key (jax internals "
                            "changed, or an older gpu-cache wrote the record)"]
        return result
    best: tuple[int, float, str, dict[str, Any]] | None = None
    for other in earlier:
        if other is record:
            continue
        for other_key, other_parts in _key_parts(other).items():
            if _name_of(other_key) != name or not isinstance(other_parts, dict):
                continue
            differ = sum(1 for p in set(parts) | set(other_parts) if parts.get(p) != other_parts.get(p))
            candidate = (differ, -float(other.get("time") or 0.0), other_key, other)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    if best is None:
        result["causes"] = [f"no earlier run computed {name}: a first compile (was it part of the "
                            "warm-up workload?)"]
        return result
    _differ, _t, other_key, other = best
    other_parts = _key_parts(other)[other_key]
    result["compared_with"] = {"key": other_key, **_who(other)}
    if other_key == key:
        here, there = (_cache_dir(record), _cache_dir(other))
        if here and there and not _same_cache(here, there):  # e.g. a job's own --jax_compilation_cache_dir
            result["causes"] = [f"the same key was computed before, but in another cache folder: "
                                f"this run used {here}, the earlier one {there} (`gpu-cache stats` "
                                "names folders outside the cache root)"]
            return result
        result["causes"] = ["the same key was computed before, but its entry was not in the cache: "
                            "it was not written (compile faster than "
                            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, smaller than "
                            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES, a failed write) or was pruned, "
                            "or the runs used different cache folders"]
        return result
    changed = [p for p in parts if parts.get(p) != other_parts.get(p)]
    changed += [p for p in other_parts if p not in parts]
    result["changed"] = changed
    specific = _specific_causes(changed, record, other)
    generic = [f"{p}: {PART_HINTS.get(p, 'this key part changed')}" for p in changed]
    result["causes"] = specific + generic
    return result


def _graphs_missed(record: dict[str, Any]) -> list[str]:
    """The FX graph keys a record's process missed (Inductor, issue 31)."""
    section = record.get("inductor")
    missed = section.get("missed") if isinstance(section, dict) else None
    return [m["key"] for m in missed if isinstance(m, dict) and isinstance(m.get("key"), str)
            and m["key"]] if isinstance(missed, list) else []


def explain_records(all_records: list[dict[str, Any]], run_id: str | None = None,
                    limit: int = 20) -> list[dict[str, Any]]:
    """Explain the JAX and Inductor misses of one run (``run_id``), or else of the latest
    record with misses, against every record written before them. At most ``limit``
    explanations. A record of a jax that names no miss has its misses inferred, as
    :func:`account` does: the keys it computed that no earlier process computed."""
    ordered = sorted(all_records, key=lambda r: float(r.get("time") or 0.0))
    if run_id is not None:
        targets = [r for r in ordered if r.get("run_id") == run_id]
    else:
        with_misses = [r for r in ordered if (r.get("jax") or {}).get("missed")
                       or hook_records.count((r.get("jax") or {}).get("misses"))
                       or _graphs_missed(r)]
        targets = with_misses[-1:]
    out: list[dict[str, Any]] = []
    for record in targets:
        start = float(record.get("time") or 0.0)
        earlier = [r for r in ordered if float(r.get("time") or 0.0) < start and r is not record]
        for key in _missed_keys(record, earlier):
            if len(out) < limit:
                out.append({"kind": "jax", **explain_key(key, record, earlier)})
        for key in _graphs_missed(record):
            if len(out) < limit:
                out.append(explain_inductor.explain_key(key, record, earlier))
    return out


def _missed_keys(record: dict[str, Any], earlier: list[dict[str, Any]]) -> list[str]:
    """The keys a record's process missed: those the hook named, else (a jax that names none)
    those of its keys no earlier process computed, as many as it missed."""
    part = record.get("jax") or {}
    missed = part.get("missed")
    named = [m.get("key") for m in missed if isinstance(m, dict)] if isinstance(missed, list) else []
    named = [key for key in named if isinstance(key, str) and key]
    if named:
        return named
    before = {key for other in earlier for key in _key_parts(other)}
    return [key for key in _key_parts(record) if key not in before][:hook_records.count(part.get("misses"))]


def explain_cache(cache_root: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """:func:`explain_records` over the records under ``cache_root``.

    Raises:
        UsageError: ``run_id`` names no recorded run (the message lists the latest ones).
    """
    return explain_records(_records(cache_root, run_id), run_id)


def _records(cache_root: Path, run_id: str | None) -> list[dict[str, Any]]:
    found = list(hook_records.read(hook_records.records_dir(cache_root)))
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


class _Seen:
    """What the processes before the one being explained computed: JAX keys (and the records
    by computation name, the only ones :func:`explain_key` compares with) and Triton keys.
    Grown record by record, so accounting for N records reads each once."""

    def __init__(self, cache_root: Path | None = None) -> None:
        self.jax: set[str] = set()
        self.by_name: dict[str, list[dict[str, Any]]] = {}
        self.triton: set[str] = set()
        self.graphs: dict[str, list[dict[str, Any]]] = {}  # Inductor graph name -> records
        self.by_kernel: dict[str, list[dict[str, Any]]] = {}  # jax-triton kernel name -> records
        self.cache_root = cache_root
        self._ptxas: explain_ptxas.Entries | None = None

    def ptxas(self) -> explain_ptxas.Entries:
        """The ptxas shim's entries under the cache root, read at the first use."""
        if self._ptxas is None:
            self._ptxas = explain_ptxas.Entries(self.cache_root)
        return self._ptxas

    def add(self, record: dict[str, Any]) -> None:
        for graph in set(explain_inductor.names(record)):
            self.graphs.setdefault(graph, []).append(record)
        for parts in explain_kernels.key_parts(record).values():
            named = self.by_kernel.setdefault(str(parts.get("name")), [])
            if not named or named[-1] is not record:
                named.append(record)
        for key in _key_parts(record):
            self.jax.add(key)
            named = self.by_name.setdefault(_name_of(key), [])
            if not named or named[-1] is not record:
                named.append(record)
        part = hook_records.part(record, "triton")
        if part is not None:
            self.triton.update(k for k in part.get("hit_keys") or [] if isinstance(k, str))
            self.triton.update(m.key for m in hook_records.missed_of(part, "triton"))

    def explain(self, key: str, record: dict[str, Any]) -> dict[str, Any]:
        return explain_key(key, record, self.by_name.get(_name_of(key), []))


def _triton_key(miss: Missed, seen: _Seen) -> dict[str, Any]:
    cause = ("an earlier process used this kernel's entry: it was removed since (pruned) or that "
             "process used another Triton folder" if miss.key in seen.triton else
             f"no earlier process compiled {miss.name}: a first compile (was it part of the warm-up "
             "workload?)")
    return {"name": miss.name, "key": miss.key, "compared_with": None, "changed": [], "causes": [cause]}


def account(found: list[dict[str, Any]], cache_root: Path, now: float | None = None) -> list[dict[str, Any]]:
    """Every miss that ``gpu-cache stats`` counts, per rule and kind (the same counts as its
    ``by_rule``), split by cause: the warm pass's own compiles, a JAX folder outside the
    cache root, software other than what warmed the type (both as stats words them, with
    when a finding was last seen once it no longer holds), and otherwise the missed
    computations one by one (:func:`explain_key`, at most :data:`KEYS_PER_CAUSE` per rule
    and kind): those the hook named, or, for a jax that names none, those inferred from the
    keys no earlier process computed."""
    ordered = sorted(found, key=lambda r: float(r.get("time") or 0.0))
    findings = {f.key: f.text for f in stats.outside_findings(cache_root, ordered, now)
                + stats.mismatch_findings(cache_root, ordered, now)}
    warmed, warmed_on = stats.warmed_software(ordered)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    seen = _Seen(cache_root)
    for record in ordered:
        rule = record.get("rule") or "-"
        for kind in kinds.OBSERVED:
            section = hook_records.part(record, kind)
            misses = hook_records.count(section.get("misses")) if section else 0
            if not misses:
                continue
            group = groups.setdefault((rule, kind), {"rule": rule, "kind": kind, "misses": 0,
                                                     "processes": 0, "causes": {}})
            group["misses"] += misses
            group["processes"] += 1
            folder = stats.outside_folder(record, cache_root) if kind == "jax" else None
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
                causes = _by_key(record, kind, section, misses, seen, room)
            for cause, count, keys in causes:
                entry = group["causes"].setdefault(cause, {"cause": cause, "misses": 0, "processes": 0,
                                                           "keys": []})
                entry["misses"] += count
                entry["processes"] += 1
                entry["keys"] += keys
        seen.add(record)
    return [{**g, "causes": sorted(g["causes"].values(), key=lambda c: -c["misses"])}
            for _key, g in sorted(groups.items())]


def _by_key(record: dict[str, Any], kind: str, section: dict[str, Any], misses: int, seen: _Seen,
            room: int) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """A process's misses of one kind explained computation by computation: (cause, how
    many, at most ``room`` explanations in all)."""
    named = hook_records.missed_of(section, kind)[:misses]
    if kind == "ptxas":  # issue 34: compared with the cache's entries of the same PTX
        items = explain_ptxas.missed_items(section)[:misses]
        keys = [explain_ptxas.explain_item(item, seen.ptxas()) for item in items[:room]]
        out = [("ptxas runs of jax-triton kernels in the process (one by one below)", len(items), keys)]
    elif kind == "triton":
        keys = [_triton_key(m, seen) for m in named[:room]]
        out = [("Triton kernels compiled in the process (one by one below)", len(named), keys)]
    elif kind == "inductor":
        keys = [explain_inductor.explain_key(m.key, record, seen.graphs.get(m.name, []))
                for m in named[:room]]
        out = [("graphs the process compiled (one by one below)", len(named), keys)]
    elif kind == explain_kernels.KIND:
        keys = [explain_kernels.explain_kernel(m.key, record, seen.by_kernel.get(m.name, []))
                for m in named[:room]]
        out = [("jax-triton kernels compiled in the process (one by one below)", len(named), keys)]
    else:
        keys = [seen.explain(m.key, record) for m in named[:room]]
        out = [("computations the process missed (one by one below)", len(named), keys)]
    rest = misses - len(named)
    if rest and kind == "jax":
        soft = record.get("software")
        version = soft.get("jax") if isinstance(soft, dict) else None
        which = f"jax {version}" if isinstance(version, str) else "this jax"
        first = [key for key in _key_parts(record) if key not in seen.jax]
        inferred = [seen.explain(key, record) for key in first[:min(rest, room - len(keys))]]
        out.append((f"{which} does not name the computations that missed: explained "
                    "here are those of its keys that no earlier process computed", rest, inferred)
                   if first else
                   (f"{which} does not name the computations that missed, and every key "
                    "the process computed was computed before: their entries were not in its cache "
                    "folder (not written, pruned, or another folder)", rest, []))
    elif rest:
        out.append(("the process compiled more than its record could name", rest, []))
    return [cause for cause in out if cause[1]]


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
        return "no recorded JAX or Inductor misses to explain\n"
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
