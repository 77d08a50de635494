"""Why did a jax-triton kernel miss (issue 34)? Diff its key's parts with an earlier run's.

The startup hook records, per kernel key it looked up (``jax_triton.key_parts``), the kernel's
name, the target, jax-triton's version and a hash of each part of the key: Triton's own key
(its build), the kernel's source, its specialisation (argument types, constants, alignment),
ptxas and the target, the parsed options, Triton's cache-invalidating variables and the
platform. A miss is explained against the closest earlier key of the same kernel name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_cache.core import hook_records
from gpu_cache.core.kinds.explaining import Explain, Seen
from gpu_cache.core.names import JAX_TRITON_VAR

if TYPE_CHECKING:
    from gpu_cache.core.reports import Missed

KIND = "jax_triton"
#: What each key part means when it changed.
PART_HINTS = {
    "jax-triton": "another jax-triton version is installed",
    "triton": "another Triton build is installed (its sources or libtriton differ: Triton's own key)",
    "kernel source": "the kernel's source, or a function or global it uses, changed",
    "specialisation": "the kernel was called with other argument types or constants (block sizes, "
                      "sizes passed as constexpr), or other argument alignment",
    "ptxas and target": "another GPU (compute capability) or another ptxas (TRITON_PTXAS_PATH, or "
                        "another Triton wheel's)",
    "options": "other compile options (num_warps, num_stages, num_ctas, enable_fp_fusion), or a "
               "TRITON_* variable that sets one (ptxas options, the libdevice path)",
    "environment": "Triton's cache-invalidating variables differ (TRITON_DEFAULT_FP_FUSION, "
                   "TRITON_DISABLE_LINE_INFO, ...): export the same ones when warming and in the jobs",
    "platform": "another platform (CUDA or ROCm)",
    "target": "another compute capability",
}
_NOT_PARTS = ("name",)


def key_parts(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The record's jax-triton key parts by key (the valid ones)."""
    section = hook_records.part(record, KIND) or {}
    parts = section.get("key_parts")
    if not isinstance(parts, dict):
        return {}
    return {k: v for k, v in parts.items() if isinstance(k, str) and isinstance(v, dict)}


def _who(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record.get(k) for k in ("time", "host", "pid", "rule", "gpu_type", "run_id")}


def _closest(name: str, parts: dict[str, Any], record: dict[str, Any],
             earlier: list[dict[str, Any]]) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    best: tuple[int, float, str, dict[str, Any], dict[str, Any]] | None = None
    for other in earlier:
        if other is record:
            continue
        for other_key, other_parts in key_parts(other).items():
            if other_parts.get("name") != name:
                continue
            names = (set(parts) | set(other_parts)) - set(_NOT_PARTS)
            differ = sum(1 for p in names if parts.get(p) != other_parts.get(p))
            candidate = (differ, -float(other.get("time") or 0.0), other_key, other_parts, other)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    return None if best is None else best[2:]


def _specific(changed: list[str], parts: dict[str, Any], other_parts: dict[str, Any],
              now: dict[str, Any], before: dict[str, Any], environment: list[str]) -> list[str]:
    """Sentences naming the concrete difference, where the parts and records show it
    (``environment``: the variables the kind's piece declares change its keys)."""
    causes = []
    env_now, env_before = now.get("env") or {}, before.get("env") or {}
    if "target" in changed:
        causes.append(f"the target changed from {other_parts.get('target')} to {parts.get('target')}: "
                      "warm on (or for) the GPU type the jobs run on")
    if "jax-triton" in changed:
        causes.append(f"jax-triton changed from {other_parts.get('jax-triton')} to {parts.get('jax-triton')}")
    if "environment" in changed:
        for name in environment:
            if env_now.get(name) != env_before.get(name):
                causes.append(f"{name} changed from {env_before.get(name)!r} to {env_now.get(name)!r}")
    return causes


def explain_kernel(key: str, record: dict[str, Any], earlier: list[dict[str, Any]],
                   environment: list[str]) -> dict[str, Any]:
    """Why the kernel key ``key`` of ``record``'s process missed, against ``earlier`` records:
    the changed key parts and a cause for each (``compared_with`` None: no earlier run
    looked this kernel up); ``environment``: the piece's ``key-environment``."""
    parts = key_parts(record).get(key)
    name = str((parts or {}).get("name") or "?")
    result: dict[str, Any] = {"name": name, "key": key, "compared_with": None, "changed": [], "causes": []}
    if parts is None:
        result["causes"] = ["the stats hook recorded no key parts for this kernel (its record is "
                            "full, or an older gpu-cache wrote it)"]
        return result
    found = _closest(name, parts, record, earlier)
    if found is None:
        result["causes"] = [f"no earlier run looked up kernel {name}: a first compile (was it part "
                            "of the warm-up workload, at the jobs' shapes and block sizes?)"]
        return result
    other_key, other_parts, other = found
    result["compared_with"] = {"key": other_key, **_who(other)}
    if other_key == key:
        result["causes"] = ["the same key was looked up before, but its entry was not in the cache: "
                            "it was not written (a read-only or full folder: the earlier process "
                            "warned), it was pruned, or the runs used different kernel folders "
                            f"({JAX_TRITON_VAR})"]
        return result
    names = [p for p in parts if p not in _NOT_PARTS] + [p for p in other_parts if p not in parts]
    changed = [p for p in names if p not in _NOT_PARTS and parts.get(p) != other_parts.get(p)]
    result["changed"] = changed
    result["causes"] = _specific(changed, parts, other_parts, record, other, environment) + \
        [f"{p}: {PART_HINTS.get(p, 'this key part changed')}" for p in changed]
    return result


class JaxTritonExplain(Explain):
    """Each missed kernel against the closest earlier key of the kernel of its name."""

    missed_words = "jax-triton kernels compiled in the process (one by one below)"

    def record(self, record: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        missed = hook_records.missed_of(self.kind.section(record) or {}, self.kind.name)
        environment = self.kind.piece.key_environment
        return [explain_kernel(miss.key, record, earlier, environment) for miss in missed if miss.key]

    def problem_line(self, explained: dict[str, Any]) -> str:
        return f"{self.kind.name}: kernel {explained['name']} missed: {explained['causes'][0]}"

    def missed(self, miss: Missed, record: dict[str, Any], seen: Seen) -> dict[str, Any]:
        earlier = seen.by_kind.get(self.kind.name, {}).get(miss.name, [])
        return explain_kernel(miss.key, record, earlier, self.kind.piece.key_environment)

    def seen(self, record: dict[str, Any], seen: Seen) -> None:
        """The records by the names of the kernels they keep key parts of."""
        by_kernel = seen.by_kind.setdefault(self.kind.name, {})
        for parts in key_parts(record).values():
            named = by_kernel.setdefault(str(parts.get("name")), [])
            if not named or named[-1] is not record:
                named.append(record)
