"""The verdict's proof that the warm cache computes what a fresh compile computes (issue 40,
docs/outputs.md).

The cold pass (every cache off: each program compiled fresh) is the reference. Each run of
the validate pass (a fresh process that hits the cache) must reproduce its shape's outputs:
bit-identical ("identical"), or with ``validate.outputs: tolerant`` no farther apart than two
runs of the same compiled program in one process ("within run-to-run noise"), or than
``validate.outputs_tolerance`` of the outputs' largest magnitude ("within tolerance": a fresh
compile on a GPU autotunes again and may choose other algorithms, whose rounding differs;
measured on an H200, docs/outputs.md). Anything else fails the verdict ("outputs differ",
or "NaN where the cold pass had none"), names the entries that run's processes were served,
and sets them aside so that the next job compiles them again. The runs' figures come from
:mod:`gpu_cache.core.outputs`, in the jobs' software.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpu_cache.commands.common import warn
from gpu_cache.config.settings import Settings
from gpu_cache.core import kinds
from gpu_cache.core.reports import PhaseResult, RunResult
from gpu_cache.core.set_aside import set_aside
from gpu_cache.core.shown import shown
from gpu_cache.reports import Verdict

IDENTICAL = "identical"
NOISE = "within run-to-run noise"
TOLERANCE = "within tolerance"
DIFFER = "outputs differ"
NAN = "NaN where the cold pass had none"
UNPROVEN = "not proven"
#: Outcomes that fail the verdict.
FAILING = (DIFFER, NAN)


def figure(value: Any) -> float | None:
    """A figure of a run's outputs report (``"inf"`` is infinite; anything else unknown)."""
    if value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def noise_of(found: Mapping[str, Any], reference: Mapping[str, Any]) -> float:
    """The run-to-run noise a comparison allows: the larger spread of the two processes' own
    two runs of one compiled program (0 where neither ran twice)."""
    spreads = [figure(found.get("spread")), figure(reference.get("spread"))]
    return max([s for s in spreads if s is not None], default=0.0)


def outcome(run: RunResult, mode: str, tolerance: float = 0.0) -> dict[str, Any] | None:
    """One shape's proof from its validate run (None: nothing to say, as when the run failed,
    which is a problem of its own); ``tolerance``: the relative difference ``tolerant`` allows
    beyond the run-to-run noise."""
    found = run.outputs
    if found is None or (not run.ok and found.get("error")):
        return None
    served = found.get("served") if isinstance(found.get("served"), dict) else None
    shape: dict[str, Any] = {"workload": run.workload, "shape": run.shape, "served": served}
    reference = found.get("reference")
    if isinstance(reference, dict) and reference.get("untrusted"):
        return {**shape, "outcome": UNPROVEN, "untrusted": True,
                "why": f"its reference was ignored: {str(reference['untrusted'])[:300]}"}
    if found.get("error") or not isinstance(reference, dict):
        why = found.get("error") or "the cold pass kept no outputs of this shape to compare with"
        return {**shape, "outcome": UNPROVEN, "why": str(why)[:300]}
    noise = noise_of(found, reference)
    shape.update(digest=found.get("digest"), reference_digest=reference.get("digest"),
                 nonfinite=found.get("nonfinite"), noise=noise if math.isfinite(noise) else "inf")
    if reference.get("digest") == found.get("digest"):
        return {**shape, "outcome": IDENTICAL}
    max_abs, nans = figure(reference.get("max_abs")), figure(reference.get("new_nonfinite")) or 0
    shape.update(max_abs=reference.get("max_abs"), max_rel=reference.get("max_rel"),
                 mismatch=reference.get("mismatch"))
    # Values of the same shapes and types, without a new NaN: only then may they be close.
    comparable = max_abs is not None and not reference.get("mismatch") and not nans
    # An infinite noise (a process whose two runs differ in shape or NaN) tolerates nothing.
    close = comparable and 0 < max_abs <= noise < math.inf
    if close and mode != IDENTICAL:
        return {**shape, "outcome": NOISE}
    max_rel = figure(reference.get("max_rel"))
    if (mode != IDENTICAL and comparable and math.isfinite(max_abs) and max_rel is not None
            and max_rel <= tolerance):
        return {**shape, "outcome": TOLERANCE, "tolerance": tolerance}
    if served == {}:  # its processes compiled everything themselves: not the cache's doing
        return {**shape, "outcome": UNPROVEN, "why": (
            "its outputs differ from the cold pass's although the cache served its processes "
            "nothing: the program is not deterministic from process to process")}
    if nans > 0:
        return {**shape, "outcome": NAN, "new_nonfinite": reference.get("new_nonfinite")}
    why = "within run-to-run noise, but validate.outputs is identical" if close else None
    return {**shape, "outcome": DIFFER, **({"why": why} if why else {})}


def served_text(served: Mapping[str, Any]) -> str:
    """The entries a run was served, as a problem line names them."""
    parts = [f"{kind} {key}" for kind, keys in sorted(served.items()) if isinstance(keys, list)
             for key in keys[:5]]
    more = sum(max(0, len(keys) - 5) for keys in served.values() if isinstance(keys, list))
    return ", ".join(parts) + (f" and {more} more" if more else "")


def problem_of(shape: Mapping[str, Any]) -> str:
    """The problem line of a shape whose outputs differ."""
    where = f"workload {shape['workload']}" + ("" if shape["shape"] == "-" else f" shape {shape['shape']}")
    if shape["outcome"] == NAN:
        what = (f"{NAN}: {where} gave {shape.get('new_nonfinite')} NaN or infinite value(s) "
                "from the cache where a fresh compile gave finite ones")
    else:
        how = shape.get("mismatch") or (f"max abs difference {shape.get('max_abs')}, relative "
                                        f"{shape.get('max_rel')}; run-to-run noise {shape.get('noise')}")
        extra = f"; {shape['why']}" if shape.get("why") else ""
        what = f"{DIFFER}: {where} computes other outputs from the cache than a fresh compile ({how}{extra})"
    served = shape.get("served")
    if served is None:
        return (f"{what}. Its processes left no record of the entries they were served (the startup "
                "hook was not in them: stats_hook, or a PYTHONPATH the job replaced), so none was set aside")
    return f"{what}. It was served {served_text(served)}: set aside, the next job compiles them again"


def judge(settings: Settings, cold: PhaseResult | None, warm: PhaseResult) -> dict[str, Any]:
    """The verdict's ``outputs`` section from the validation passes (not yet set aside)."""
    mode = settings.validate.outputs
    if mode == "off":
        return {"mode": mode}
    tolerance = settings.validate.outputs_tolerance
    shapes = [found for found in (outcome(run, mode, tolerance) for run in warm.runs) if found is not None]
    if not shapes:
        return {"mode": mode, "shapes": []}
    reference = ("the cold pass of this validation (every cache off)" if cold is not None and not cold.reused
                 else f"the cold pass kept for the same workloads, shapes, software and device "
                      f"({cold.reused})" if cold is not None else "none: no cold pass ran")
    counts = {name: sum(1 for s in shapes if s["outcome"] == name)
              for name in (IDENTICAL, NOISE, TOLERANCE, DIFFER, NAN, UNPROVEN)}
    return {"mode": mode, "reference": reference, "counts": counts, "shapes": shapes}


def apply(settings: Settings, verdict: Verdict, phases: Mapping[str, PhaseResult | None]) -> None:
    """Judge the outputs of the validation passes into ``verdict`` (its ``outputs`` section,
    a problem per shape whose outputs differ, a note per shape not proven), and set aside the
    entries the failing shapes' processes were served."""
    warm = phases.get("validate")
    if warm is None or warm.unscheduled:
        return
    section = judge(settings, phases.get("cold"), warm)
    failing = [s for s in section.get("shapes", []) if s["outcome"] in FAILING]
    unproven = [s for s in section.get("shapes", []) if s["outcome"] == UNPROVEN]
    verdict.notes += [f"outputs of workload {s['workload']} shape {s['shape']} not proven: {s['why']}"
                      for s in unproven[:5]]
    untrusted = next((s for s in unproven if s.get("untrusted")), None)
    if untrusted is not None:  # one line: a reference no one may act on never fails a verdict
        warn("outputs proof: %s", shown(untrusted["why"]))
    if failing:
        verdict.problems += [problem_of(s) for s in failing]
        verdict.passed, verdict.status = False, "failed"
        section["set_aside"], errors = set_aside_served(settings, failing)
        verdict.problems += errors
    verdict.outputs = section


def set_aside_served(settings: Settings, failing: list[dict[str, Any]]
                     ) -> tuple[dict[str, list[str]], list[str]]:
    """Set aside every entry the failing shapes' processes were served, per kind."""
    if settings.cache_root is None:
        return {}, []
    wanted: dict[str, set[str]] = {}
    for shape in failing:
        for kind, keys in (shape.get("served") or {}).items():
            wanted.setdefault(kind, set()).update(k for k in keys if isinstance(k, str))
    done: dict[str, list[str]] = {}
    errors: list[str] = []
    for name, keys in sorted(wanted.items()):
        try:
            kind = kinds.named(name)
        except KeyError:  # a kind this gpu-cache does not know (a newer hook's record)
            continue
        aside, failed = set_aside(settings.cache_root, kind, keys)
        errors += failed
        if aside:
            done[name] = aside
    return done, errors


def described(section: Mapping[str, Any], workload: str | None = None) -> str | None:
    """The proof in a few words (of one workload's shapes where given), for the summary and
    the report's plot: ``outputs: 3 identical, 1 differ``; None where none was made."""
    shapes = [s for s in section.get("shapes") or [] if isinstance(s, dict)
              and (workload is None or s.get("workload") == workload)]
    if not shapes:
        return None if workload else ("outputs not compared (validate.outputs: off)"
                                      if section.get("mode") == "off" else None)
    words = {IDENTICAL: "identical", NOISE: "within noise", TOLERANCE: "within tolerance", DIFFER: "DIFFER",
             NAN: "NaN", UNPROVEN: "not proven"}
    counts = {word: sum(1 for s in shapes if s.get("outcome") == name) for name, word in words.items()}
    return "outputs: " + ", ".join(f"{n} {word}" for word, n in counts.items() if n)
