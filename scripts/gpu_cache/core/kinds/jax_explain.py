"""Why did a JAX computation miss? Diff the cache-key parts of two runs and name the cause
(the JAX kind's part of ``gpu-cache doctor --explain`` and ``validate``).

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
from typing import TYPE_CHECKING, Any

from gpu_cache.core import hook_records
from gpu_cache.core.kinds.explaining import Explain, Seen
from gpu_cache.core.kinds.kind import in_tier

if TYPE_CHECKING:
    from gpu_cache.core.reports import Missed

KIND = "jax"  # the section of a record this module reads

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
    part = record.get(KIND)
    parts = part.get("key_parts") if isinstance(part, dict) else None
    return parts if isinstance(parts, dict) else {}


def _key_context(record: dict[str, Any]) -> dict[str, Any]:
    context = (record.get(KIND) or {}).get("key_context")
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
    folder = (record.get(KIND) or {}).get("cache_dir")
    return folder if isinstance(folder, str) and folder else None


def _same_cache(here: str, there: str) -> bool:
    """Whether two JAX cache folders hold one cache: the same folder, or a root's folder and
    that root's node-local tier (issue 23: a job with the tier reads the root on a miss)."""
    here, there = os.path.normpath(here), os.path.normpath(there)
    if here == there:
        return True
    return any(in_tier(a, os.path.dirname(b), KIND) for a, b in ((here, there), (there, here)))


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


def _missed_keys(record: dict[str, Any], earlier: list[dict[str, Any]]) -> list[str]:
    """The keys a record's process missed: those the hook named, else (a jax that names none)
    those of its keys no earlier process computed, as many as it missed."""
    part = record.get(KIND) or {}
    missed = part.get("missed")
    named = [m.get("key") for m in missed if isinstance(m, dict)] if isinstance(missed, list) else []
    named = [key for key in named if isinstance(key, str) and key]
    if named:
        return named
    before = {key for other in earlier for key in _key_parts(other)}
    return [key for key in _key_parts(record) if key not in before][:hook_records.count(part.get("misses"))]


class Known:
    """What the processes before the one being explained computed: JAX keys, and the records
    by computation name (the only ones :func:`explain_key` compares with)."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.by_name: dict[str, list[dict[str, Any]]] = {}

    def add(self, record: dict[str, Any]) -> None:
        for key in _key_parts(record):
            self.keys.add(key)
            named = self.by_name.setdefault(_name_of(key), [])
            if not named or named[-1] is not record:
                named.append(record)

    def explain(self, key: str, record: dict[str, Any]) -> dict[str, Any]:
        return explain_key(key, record, self.by_name.get(_name_of(key), []))


def known(seen: Seen) -> Known:
    """What ``seen`` holds of JAX."""
    if KIND not in seen.by_kind:
        seen.by_kind[KIND] = Known()
    return seen.by_kind[KIND]


class JaxExplain(Explain):
    """Each miss against the closest earlier key of the same computation name."""

    def record(self, record: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"kind": KIND, **explain_key(key, record, earlier)} for key in _missed_keys(record, earlier)]

    def missed(self, miss: Missed, record: dict[str, Any], seen: Seen) -> dict[str, Any]:
        return known(seen).explain(miss.key, record)

    def unnamed(self, record: dict[str, Any], rest: int, seen: Seen, room: int
                ) -> tuple[str, int, list[dict[str, Any]]]:
        """Explained are those of the process's keys that no earlier process computed (at most
        ``room``): its jax did not name the computations that missed."""
        soft = record.get("software")
        version = soft.get("jax") if isinstance(soft, dict) else None
        which = f"jax {version}" if isinstance(version, str) else "this jax"
        first = [key for key in _key_parts(record) if key not in known(seen).keys]
        if not first:
            return (f"{which} does not name the computations that missed, and every key the process "
                    "computed was computed before: their entries were not in its cache folder (not "
                    "written, pruned, or another folder)", rest, [])
        inferred = [known(seen).explain(key, record) for key in first[:min(rest, room)]]
        return (f"{which} does not name the computations that missed: explained here are those of "
                "its keys that no earlier process computed", rest, inferred)

    def seen(self, record: dict[str, Any], seen: Seen) -> None:
        known(seen).add(record)
