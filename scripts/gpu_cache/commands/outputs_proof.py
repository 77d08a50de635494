"""The verdict's proof that the cache serves the very compile it holds (issues 40 and 47,
docs/outputs.md).

The reference is the writer's: the warm process that compiled a shape's entries kept its
outputs (two runs, for its own noise) with the key and bytes of every entry it used
(:mod:`gpu_cache.core.references`). Each run of the validate pass that is served those entries
must reproduce them: bit-identical ("identical"), or within the writer's (and its own)
run-to-run noise ("within run-to-run noise", with the figure); with ``validate.outputs:
tolerant``, a floating-point array may also lie within ``validate.outputs_tolerance`` of its own
magnitude ("within tolerance": an explicit opt-in; integers, booleans and the places of NaN or
infinity are always compared exactly). Anything else fails the verdict ("outputs differ", or
"NaN where the writer had none"), names the entries, and sets them aside so that the next job
compiles them again. A reference whose entries are gone, or that another account may have
written, proves nothing ("not proven"), and never fails a verdict. The cold pass (every cache
off) is a figure: how far the cached program lies from a fresh compile, never a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_cache.commands.common import warn
from gpu_cache.config.settings import Settings
from gpu_cache.core import kinds
from gpu_cache.core.outputs import figure
from gpu_cache.core.reports import PhaseResult, RunResult
from gpu_cache.core.set_aside import set_aside
from gpu_cache.core.shown import shown
from gpu_cache.reports import Verdict

IDENTICAL = "identical"
NOISE = "within run-to-run noise"
TOLERANCE = "within tolerance"
DIFFER = "outputs differ"
NAN = "NaN where the writer had none"
UNPROVEN = "not proven"
#: Outcomes that fail the verdict.
FAILING = (DIFFER, NAN)
#: What a shape's report keeps of the comparison's figures.
FIGURES = ("max_abs", "max_rel", "noise", "spread", "mismatch", "new_nonfinite", "fresh_compile")


def outcome(run: RunResult, mode: str, tolerance: float = 0.0) -> dict[str, Any] | None:
    """One shape's proof from its validate run (None: nothing to say, as when the run failed,
    which is a problem of its own); ``tolerance``: with ``tolerant``, the relative difference a
    floating-point array may show beyond its run-to-run noise."""
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
        why = found.get("error") or "no reference was compared (a gpu-cache older than its warm pass?)"
        return {**shape, "outcome": UNPROVEN, "why": str(why)[:300]}
    shape.update({k: reference[k] for k in FIGURES if reference.get(k) is not None},
                 digest=found.get("digest"), reference_digest=reference.get("digest"),
                 nonfinite=found.get("nonfinite"), entries=reference.get("entries"))
    if reference.get("entries") not in ("same", "changed"):
        fixed = {"next_warm_proves": True} if reference.get("next_warm_proves") is True else {}
        why = str(reference.get("why") or "no reference")[:400]
        return {**shape, "outcome": UNPROVEN, "why": why, **fixed}
    shape.update(_judged(reference, found.get("digest"), mode, tolerance, served))
    if shape["outcome"] in FAILING:  # what is set aside: entries no warm compiled, else all it was served
        suspects = reference.get("suspects") if reference.get("entries") == "changed" else None
        shape["suspects"] = suspects if isinstance(suspects, dict) else served
    return shape


def _judged(reference: Mapping[str, Any], digest: Any, mode: str, tolerance: float,
            served: dict[str, Any] | None) -> dict[str, Any]:
    """The outcome of a run served the reference's entries (or entries no warm compiled under
    its keys), from the runner's figures."""
    if reference.get("digest") == digest:
        return {"outcome": IDENTICAL}
    if reference.get("mismatch"):
        return {"outcome": DIFFER}
    if (figure(reference.get("new_nonfinite")) or 0) > 0:
        return {"outcome": NAN}
    if reference.get("within_noise") is True:
        return {"outcome": NOISE}
    rel = figure(reference.get("beyond_noise_rel"))
    exact = reference.get("exact_differs") is not False  # integers, booleans, NaN places: never tolerated
    if mode == "tolerant" and not exact and rel is not None and rel <= tolerance:
        return {"outcome": TOLERANCE, "tolerance": tolerance}
    if served == {} and reference.get("entries") == "same":  # no entry served: not the cache's doing
        return {"outcome": UNPROVEN, "why": (
            "its outputs differ from the writer's although neither was served any entry: the "
            "program is not deterministic from process to process")}
    return {"outcome": DIFFER}


def served_text(served: Mapping[str, Any]) -> str:
    """The entries a run was served, as a problem line names them."""
    parts = [f"{kind} {key}" for kind, keys in sorted(served.items()) if isinstance(keys, list)
             for key in keys[:5]]
    more = sum(max(0, len(keys) - 5) for keys in served.values() if isinstance(keys, list))
    return ", ".join(parts) + (f" and {more} more" if more else "")


def problem_of(shape: Mapping[str, Any]) -> str:
    """The problem line of a shape whose outputs differ."""
    where = f"workload {shape['workload']}" + ("" if shape["shape"] == "-" else f" shape {shape['shape']}")
    writer = "the warm process that compiled its entries"
    if shape["outcome"] == NAN:
        what = (f"{NAN}: {where} gave {shape.get('new_nonfinite')} NaN or infinite value(s) "
                f"from the cache where {writer} gave finite ones")
    else:
        how = shape.get("mismatch") or (f"max abs difference {shape.get('max_abs')}, relative "
                                        f"{shape.get('max_rel')}; run-to-run noise {shape.get('noise')}")
        what = f"{DIFFER}: {where} computes other outputs from the cache than {writer} ({how})"
    suspects = shape.get("suspects")
    if suspects is None:
        return (f"{what}. Its processes left no record of the entries they were served (the startup "
                "hook was not in them: stats_hook, or a PYTHONPATH the job replaced), so none was set aside")
    if shape.get("entries") == "changed":
        what += ". The bytes of these entries are not what any warm process compiled"
    return f"{what}. It was served {served_text(suspects)}: set aside, the next job compiles them again"


def judge(settings: Settings, cold: PhaseResult | None, warm: PhaseResult) -> dict[str, Any]:
    """The verdict's ``outputs`` section from the validation passes (not yet set aside)."""
    mode = settings.validate.outputs
    if mode == "off":
        return {"mode": mode}
    tolerance = settings.validate.outputs_tolerance
    shapes = [found for found in (outcome(run, mode, tolerance) for run in warm.runs) if found is not None]
    if not shapes:
        return {"mode": mode, "shapes": []}
    counts = {name: sum(1 for s in shapes if s["outcome"] == name)
              for name in (IDENTICAL, NOISE, TOLERANCE, DIFFER, NAN, UNPROVEN)}
    return {"mode": mode, "reference": "the warm process that compiled each shape's entries",
            "counts": counts, "shapes": shapes, "seconds": warm.proof_seconds,
            **({"fresh_compile": fresh} if (fresh := fresh_compile(shapes)) else {})}


def fresh_compile(shapes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How far the cached programs lie from a fresh compile's (the cold pass's outputs, where
    kept): a figure, never a failure."""
    found = [s["fresh_compile"] for s in shapes if isinstance(s.get("fresh_compile"), dict)]
    if not found:
        return None
    rels = [r for r in (figure(f.get("max_rel")) for f in found if not f.get("identical")) if r is not None]
    return {"shapes": len(found), "identical": sum(1 for f in found if f.get("identical")),
            "max_rel": max(rels) if rels else 0.0,
            "other": sum(1 for f in found if f.get("mismatch") or f.get("new_nonfinite"))}


def apply(settings: Settings, verdict: Verdict, phases: Mapping[str, PhaseResult | None]) -> None:
    """Judge the outputs of the validation passes into ``verdict`` (its ``outputs`` section,
    a problem per shape whose outputs differ, a note per shape not proven), and set aside the
    entries of the failing shapes."""
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
    """Set aside the entries of the failing shapes, per kind: those whose bytes no warm process
    compiled, where the run was served such; else every entry its processes were served."""
    if settings.cache_root is None:
        return {}, []
    wanted: dict[str, set[str]] = {}
    for shape in failing:
        for kind, keys in (shape.get("suspects") or {}).items():
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


def fresh_text(section: Mapping[str, Any]) -> str | None:
    """The fresh-compile figure in words: ``fresh compile: 2 of 3 bit-identical, the others
    within 6.4e-4 of their magnitude``; None where the cold pass kept no outputs."""
    fresh = section.get("fresh_compile")
    if not isinstance(fresh, dict) or not fresh.get("shapes"):
        return None
    text = f"fresh compile: {fresh.get('identical')} of {fresh.get('shapes')} bit-identical"
    if fresh.get("identical") != fresh.get("shapes"):
        text += (f", {fresh['other']} of other shapes or NaN" if fresh.get("other") else "") + \
            f", the others within {fresh.get('max_rel'):.2g} of their magnitude"
    return text
