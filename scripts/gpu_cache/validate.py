"""Validate: re-run a GPU type's workloads in fresh processes and prove the cache serves them.

The verdict passes only when every run succeeded, nothing missed and nothing new was
written. A miss names the computation (from the stats hook, or from the new entry's
file name when the process is not ours) so the user knows what to look at.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, TextIO

from gpu_cache import device, env, explain
from gpu_cache.settings import Settings
from gpu_cache.targets import device_problems, gpu_types
from gpu_cache.warm import Phase, job_info, run_phase

KINDS = ("jax", "triton")
#: How many missed computations a problem line names before it says "and N more".
NAMED_MISSES = 5


def cold_environ(exports: env.Exports, scratch: Path) -> dict[str, str]:
    """A job environment with every cache off or empty: the honest cold baseline."""
    environ = env.job_environ(exports)
    environ.pop("GPU_CACHE_RECORDS", None)
    environ.update({
        "JAX_ENABLE_COMPILATION_CACHE": "false",
        "TRITON_CACHE_DIR": str(scratch / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "CUDA_CACHE_DISABLE": "1",
    })
    return environ


def _kind_counts(phase: Phase, kind: str) -> dict[str, Any]:
    recorded = phase.recorded.get(kind, {})
    new = phase.new_keys.get(kind, [])
    return {
        "hits": int(recorded.get("hits", 0)),
        "misses": max(int(recorded.get("misses", 0)), len(new)),
        "new_entries": len(new),
        "processes_observed": int(recorded.get("processes", 0)),
    }


def _missed(phase: Phase, kind: str) -> list[dict[str, str]]:
    """Missed computations by key: the hook's names, then new entries it did not see."""
    by_key: dict[str, dict[str, str]] = {}
    for miss in phase.recorded.get(kind, {}).get("missed", []):
        by_key.setdefault(miss.get("key", ""), {"kind": kind, "name": miss.get("name", "?"),
                                                "key": miss.get("key", "")})
    for key in phase.new_keys.get(kind, []):
        name = key.rsplit("-", 1)[0] if kind == "jax" else key
        by_key.setdefault(key, {"kind": kind, "name": name, "key": key})
    return list(by_key.values())


def judge(counts: dict[str, dict[str, Any]], missed: list[dict[str, str]],
          failures: list[str], cache_problems: list[str]) -> list[str]:
    """The problems that fail a validation, each a sentence a user can act on."""
    problems = list(cache_problems) + list(failures)
    for kind in KINDS:
        if counts[kind]["misses"]:
            names = [m["name"] for m in missed if m["kind"] == kind]
            shown = ", ".join(names[:NAMED_MISSES])
            more = f" and {len(names) - NAMED_MISSES} more" if len(names) > NAMED_MISSES else ""
            problems.append(
                f"{kind}: {counts[kind]['misses']} compilation(s) missed in a fresh process after "
                f"warming: {shown}{more}. Their cache key changes between runs (a value baked "
                "into the program, an environment or flag difference, or a different GPU count); "
                "`gpu-cache doctor --explain` names which key part changed"
            )
    return problems


def validate(settings: Settings, gpu_type: str, log: TextIO) -> dict[str, Any]:
    """Validate the cache of ``gpu_type`` and return the verdict (validate/{gpu_type}.json).

    Raises:
        UsageError: the GPU type or one of its workloads is unknown.
    """
    exports = env.resolve(settings)
    env.warn_once(exports)
    cache_problems = [f"{kind}: {why}" for kind, why in exports.problems.items()
                      if kind in ("jax", "all")]
    cold_seconds = None
    cold_runs: list[dict[str, Any]] = []
    if settings.config.get("validate", {}).get("measure_cold", True):
        with tempfile.TemporaryDirectory(prefix="gpu-cache-cold-") as scratch:
            cold = run_phase(settings, gpu_type, "cold", cold_environ(exports, Path(scratch)), log,
                             record=False)
        cold_seconds = round(cold.seconds, 3)
        cold_runs = cold.runs_as_dicts()
    warm = run_phase(settings, gpu_type, "validate", env.job_environ(exports), log)
    counts = {kind: _kind_counts(warm, kind) for kind in KINDS}
    missed = [m for kind in KINDS for m in _missed(warm, kind)]
    seen = device.detect()
    expected = gpu_types(settings).get(gpu_type)
    if expected is not None:
        cache_problems += device_problems(expected, seen)
    problems = judge(counts, missed, warm.failures(), cache_problems)
    explanations: list[dict[str, Any]] = []
    if counts["jax"]["misses"] and settings.cache_root is not None:
        explanations = explain.explain_cache(settings.cache_root, warm.run_id)
        problems += [f"jax: {e['name']} missed: {e['causes'][0]}"
                     for e in explanations[:NAMED_MISSES] if e["causes"]]
    observed = any(counts[k]["processes_observed"] for k in KINDS)
    notes = [] if observed else [
        "hits were not observed: the workloads ran no Python process with the stats hook "
        "(misses still count from new cache entries)"]
    warm_seconds = round(warm.seconds, 3)
    return {
        "gpu_type": gpu_type,
        "device": seen.as_dict(),
        "passed": not problems,
        "hits": sum(counts[k]["hits"] for k in KINDS),
        "misses": sum(counts[k]["misses"] for k in KINDS),
        "new_entries": sum(counts[k]["new_entries"] for k in KINDS),
        "cold_seconds": cold_seconds,
        "warm_seconds": warm_seconds,
        "speedup": round(cold_seconds / warm_seconds, 2) if cold_seconds and warm_seconds else None,
        "problems": problems,
        "notes": notes,
        # Everything the cache environment fell back from or adjusted (node-local folders,
        # read-only roots, refused folders, low space), also when it does not fail validation.
        "cache_warnings": exports.messages(),
        "missed": missed,
        "explain": explanations,
        "runs": warm.runs_as_dicts(),
        "cold_runs": cold_runs,
        "cache_root": str(settings.cache_root),
        "job": job_info(),
        **counts,
    }
