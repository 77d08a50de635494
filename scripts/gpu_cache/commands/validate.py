"""Validate: re-run a GPU type's workloads in fresh processes and prove the cache serves them.

The verdict passes only when every run succeeded, nothing missed and nothing new was
written. A miss names the computation (from the stats hook, or from the new entry's
file name when the process is not ours) so the user knows what to look at.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from gpu_cache.commands import common, outputs_proof
from gpu_cache.config import cluster, placement
from gpu_cache.config.settings import Settings
from gpu_cache.config.targets import a_gpu, device_problems, gpu_types
from gpu_cache.config.workloads import cold_pass, plan_phase, workloads_of
from gpu_cache.core import hook_records, kinds, remake, runner, safe_io, software
from gpu_cache.core.device import Device
from gpu_cache.core.errors import UsageError
from gpu_cache.core.kinds import Kind
from gpu_cache.core.reports import Missed, PhaseResult
from gpu_cache.core.shown import shown
from gpu_cache.jobenv import env
from gpu_cache.reports import KindCounts, Verdict

#: How many missed computations a problem line names before it says "and N more".
NAMED_MISSES = 5


def kind_counts(phase: PhaseResult, kind: Kind) -> KindCounts:
    """One kind's counts in a pass: misses from the records or from new entries (each
    compiled one: :meth:`Kind.compiled`), whichever saw more (a process without the hook
    still leaves new entries)."""
    recorded = phase.recorded.get(kind.name)
    new = phase.new_keys.get(kind.name, [])
    return KindCounts(
        hits=recorded.hits if recorded else 0,
        misses=max(recorded.misses if recorded else 0, len(kind.compiled(new))),
        new_entries=len(new),
        processes_observed=recorded.processes if recorded else 0,
    )


def missed_in(phase: PhaseResult, kind: Kind) -> list[Missed]:
    """Missed computations by key: the hook's names, then new entries it did not see."""
    by_key: dict[str, Missed] = {}
    recorded = phase.recorded.get(kind.name)
    for miss in recorded.missed if recorded else []:
        by_key.setdefault(miss.key, miss)
    for key in kind.compiled(phase.new_keys.get(kind.name, [])):
        by_key.setdefault(key, Missed(kind.name, kind.missed_name(key), key))
    return list(by_key.values())


def unobserved(phase: PhaseResult) -> list[str]:
    """A problem for each kind the workloads compile for but no process of the pass asked
    its cache about (only where the pass counted from records)."""
    problems = []
    for kind in phase.expects:
        totals = phase.recorded.get(kind)
        if totals is None or totals.hits + totals.misses or phase.new_keys.get(kind):
            continue
        problems.append(
            f"{kind}: no process asked the {kind} cache for anything, although the workloads "
            f"compile for {kind}: the startup hook did not run in them (PYTHONPATH removed, as "
            "in conda jobs, or not bound into their container) or they could not see the cache")
    return problems


def judge(counts: dict[str, KindCounts], missed: list[Missed],
          failures: list[str], cache_problems: list[str]) -> list[str]:
    """The problems that fail a validation, each a sentence a user can act on."""
    problems = list(cache_problems) + list(failures)
    for kind, count in counts.items():
        if count.misses:
            names = [m.name for m in missed if m.kind == kind]
            shown = ", ".join(names[:NAMED_MISSES])
            more = f" and {len(names) - NAMED_MISSES} more" if len(names) > NAMED_MISSES else ""
            problems.append(
                f"{kind}: {count.misses} compilation(s) missed in a fresh process after "
                f"warming: {shown}{more}. Their cache key changes between runs (a value baked "
                "into the program, an environment or flag difference, or a different GPU count); "
                "`gpu-cache doctor --explain` names which key part changed"
            )
    return problems


def kind_problems(phase: PhaseResult) -> list[str]:
    """The problems of the pass that only a kind can word (:meth:`Kind.validation_problems`:
    tokamax's autotuning lookups that missed, issue 24)."""
    return [line for kind in kinds.ALL for line in kind.validation_problems(phase.recorded.get(kind.name))]


def run_phases(settings: Settings, gpu_type: str, output: TextIO,
               environ: Mapping[str, str] | None = None) -> dict[str, PhaseResult | None]:
    """Run the validation passes of ``gpu_type`` in this interpreter's software: the cold
    pass (when ``validate.measure_cold``; every cache off) and the validate pass (the warmed
    cache, fresh processes). The workflow runs the same in the type's container or conda
    environment (``gpu-cache`` there is :mod:`gpu_cache.core.runner`).

    Raises:
        UsageError: the GPU type or one of its workloads is unknown.
    """
    environ = dict(os.environ if environ is None else environ)
    cold = None
    if cold_pass(settings, gpu_type):
        with tempfile.TemporaryDirectory(prefix="gpu-cache-cold-") as scratch:
            cold = runner.run_plan(plan_phase(settings, gpu_type, "cold", record=False), output,
                                   runner.cold_environ(environ, Path(scratch)))
    warm = runner.run_plan(plan_phase(settings, gpu_type, "validate"), output, environ)
    return {"cold": cold, "validate": warm}


def not_started(phase: PhaseResult, ran_with: Mapping[str, Any] | None = None) -> str | None:
    """A problem line when no workload run of ``phase`` ran to the end (each one exited
    with an error or timed out): the workloads could not even start in the software they
    ran with (``ran_with``, default the phase's), so the pass measured nothing. None when
    one run succeeded or none was made."""
    if not phase.runs or any(run.ok for run in phase.runs):
        return None
    said = next((run.error for run in reversed(phase.runs) if run.error), None)
    last = f"; the last one said: {said}" if said else ""
    return (f"no workload run of GPU type {phase.gpu_type} ran to the end ({len(phase.runs)} of "
            f"{len(phase.runs)} failed{last}). They ran with "
            f"{software.describe(phase.software if ran_with is None else ran_with)}: "
            f"give the type the jobs' own software (gpu_types.{phase.gpu_type}.container, conda or "
            "python), or fix the workload's command")


def unscheduled_verdict(gpu_type: str, phase: PhaseResult, exports: env.Exports,
                        refused: cluster.Refusal | None = None) -> Verdict:
    """The verdict of a type whose jobs did not run on a node of it: ``unscheduled`` where no
    node offers the type (an optional type then holds nothing back), else failed, with why SLURM
    refused it and the key that fixes it (``refused``: :func:`why_not_run`)."""
    if refused is not None and not refused.unscheduled:
        problems = [f"not warmed: {refused.reason}; jobs that land on {a_gpu(gpu_type)} compile for "
                    "themselves"]
    else:
        why = f"{phase.unscheduled} ({refused.reason})" if refused else phase.unscheduled
        problems = [f"not validated: {why}; jobs that land on {a_gpu(gpu_type)} compile for themselves "
                    "(and fill the cache)"]
    failed = refused is not None and not refused.unscheduled
    return Verdict(
        gpu_type=gpu_type, device=phase.device, passed=False, cold_seconds=None, warm_seconds=0.0,
        problems=problems, kinds={kind.name: KindCounts() for kind in kinds.OBSERVED},
        cache_warnings=exports.messages(), job=phase.job, software=phase.software,
        status="failed" if failed else "unscheduled", cache_root=phase.cache_root,
        not_warmed=refused.reason if failed else None)


def why_not_run(settings: Settings, gpu_type: str, warm_report: str | None,
                preflight: str | None) -> cluster.Refusal:
    """Why ``gpu_type``'s warm job (when its report says it was unscheduled), else its check
    job, did not run on a node of it: the request it made (as planned in the preflight) against
    what the cluster offers now."""
    warm_unscheduled = False
    if warm_report:
        try:
            warm_unscheduled = bool(PhaseResult.from_dict(safe_io.load_json(Path(warm_report))).unscheduled)
        except UsageError:
            warm_unscheduled = False
    phase = "warm" if warm_unscheduled else "check"
    planned_jobs = placement.planned_in(preflight, settings, gpu_type)
    request = placement.first_request(settings, gpu_type, phase, planned_jobs)
    spec = gpu_types(settings)[gpu_type]
    return cluster.refusal(gpu_type, spec, phase, request, cluster.query()[0],
                           placement.refusal_keys(settings, gpu_type, phase))


def judge_phases(settings: Settings, gpu_type: str, phases: Mapping[str, PhaseResult | None],
                 exports: env.Exports, refused: cluster.Refusal | None = None) -> Verdict:
    """The verdict on ``gpu_type`` from its validation passes (:func:`run_phases`); ``refused``:
    why its jobs did not run on a node of it, where they did not (:func:`why_not_run`)."""
    cold, warm = phases.get("cold"), phases["validate"]
    if not settings.validate.measure_cold:
        cold = None  # it ran as the outputs proof's reference alone (outputs_proof)
    assert warm is not None
    if warm.unscheduled:
        return unscheduled_verdict(gpu_type, warm, exports, refused)
    expected = gpu_types(settings).get(gpu_type)
    ran_with = dict(warm.software)
    if expected is not None and expected.container and ran_with.get("image"):
        ran_with["container"] = expected.container  # as the user wrote it, not the pulled file (#25)
    broken = not_started(warm, ran_with)
    # An observed kind that runs without its cache fails the verdict (on a node-local fallback
    # its misses show); "all": caching is off.
    cache_problems = [f"{name}: {why}" for name, why in exports.problems.items()
                      if name not in kinds.KINDS or (name in exports.off and kinds.named(name).observed)]
    observed = kinds.OBSERVED
    counts = {kind.name: kind_counts(warm, kind) for kind in observed}
    missed = [m for kind in observed for m in missed_in(warm, kind)]
    seen = Device(str(warm.device.get("name", "?")), str(warm.device.get("gpu_type", "?")),
                  int(warm.device.get("count") or 0)) if warm.device else None
    if expected is not None and seen is not None:
        cache_problems += device_problems(expected, seen)
    if broken:  # nothing was measured: what other jobs wrote meanwhile is no miss of this type
        problems = [broken, *warm.failures(), *cache_problems]
        counts = {kind.name: KindCounts() for kind in kinds.OBSERVED}
        missed = []
    else:
        problems = judge(counts, missed, warm.failures(), cache_problems) + unobserved(warm) \
            + kind_problems(warm)
    explanations, named = explain_misses(settings, warm, counts)
    problems += named
    observed = any(c.processes_observed for c in counts.values())
    notes = [f"cold time measured earlier for the same workloads, shapes, software and device "
             f"({cold.reused}); validate.measure_cold: always measures it every time"] \
        if cold is not None and cold.reused else []
    notes += [] if observed else [
        "hits were not observed: the workloads ran no Python process with the stats hook "
        "(misses still count from new cache entries)"]
    notes += unremembered(warm, counts) if not problems else []
    notes += confirmed_warm(phases.get("warm"))
    notes += [w.note for w in workloads_of(settings, gpu_type) if w.note] if expected is not None else []
    return Verdict(
        gpu_type=gpu_type,
        device=warm.device,
        passed=not problems,
        cold_seconds=round(cold.seconds, 3) if cold else None,
        warm_seconds=round(warm.seconds, 3),
        problems=problems,
        kinds=counts,
        notes=notes,
        cache_warnings=exports.messages(),
        missed=missed,
        explain=explanations,
        runs=warm.runs,
        cold_runs=cold.runs if cold else [],
        cache_root=str(settings.cache_root),
        job=warm.job,
        software=ran_with,
        status="error" if broken else ("failed" if problems else "passed"),
    )


def confirmed_warm(warm: PhaseResult | None) -> list[str]:
    """A note on the warm pass a check job ran first because its warm job was planned to run no
    workload (the host found a passed verdict of the same plan): held on the node, or not."""
    if warm is None:
        return []
    if warm.skipped:
        return ["its warm job was planned to run no workload and asked for no GPU (a passed verdict "
                "of the same workloads and shapes), and the check job confirmed that verdict on its node"]
    return ["its warm job was planned to run no workload, but on the check job's node the last "
            f"verdict did not hold ({warmed_why(warm)}): the check job warmed first, one run "
            f"at a time ({sum(warm.new_entries.values())} new entries)"]


def warmed_why(warm: PhaseResult) -> str:
    """Why a check job's warm pass ran (:func:`gpu_cache.core.runner.why_warmed`)."""
    return warm.why_warmed or "other software or device"


def warm_work(verdict: Verdict, warm_job: PhaseResult | None, check_warm: PhaseResult | None) -> None:
    """What this run's warm passes did that the validation's own counts do not show: the
    entries they re-made (no warm had compiled their bytes), and what the check job warmed
    first where its warm job was planned to run none."""
    verdict.remade = remake.merged(p.remade for p in (warm_job, check_warm) if p is not None)
    if check_warm is not None and not (check_warm.skipped or check_warm.unscheduled):
        verdict.warmed_again = {"new_entries": sum(check_warm.new_entries.values()),
                                "why": warmed_why(check_warm)}


def warm_report(path: str | None) -> PhaseResult | None:
    """The warm pass's report ``--warm`` names (None: none named).

    Raises:
        UsageError: it is not a workload runner's report.
    """
    if not path:
        return None
    try:
        return PhaseResult.from_dict(safe_io.load_json(Path(path)))
    except UsageError as exc:
        raise UsageError(f"--warm {path}: {exc}") from None


def explain_misses(settings: Settings, phase: PhaseResult, counts: Mapping[str, KindCounts]
                   ) -> tuple[list[dict], list[str]]:
    """Why the pass's computations of each kind that missed did (:meth:`Explain.run`, of each kind
    that explains its misses): the explanations, and a problem line for each of the first
    NAMED_MISSES of each kind."""
    if settings.cache_root is None:
        return [], []
    explanations: list[dict] = []
    problems: list[str] = []
    records: list[dict[str, Any]] | None = None
    for kind in kinds.ALL:
        if kind.observed and kind.explain is not None and counts[kind.name].misses:
            if records is None:  # read once, for every kind
                records = list(hook_records.read(kinds.records_dir(settings.cache_root)))
            found, lines = kind.explain.run(settings.cache_root, records, phase.run_id)
            explanations += found
            problems += lines[:NAMED_MISSES]
    return explanations, problems


def unremembered(phase: PhaseResult, counts: Mapping[str, KindCounts]) -> list[str]:
    """A note when a validation that hit cannot be remembered (:func:`remember` needs the keys
    of its hits), so that the next run on this root warms again."""
    if any(t.hit_keys for t in phase.recorded.values()) or not any(c.hits for c in counts.values()):
        return []
    return [f"the next run warms again: the startup hook learnt no key of these hits from "
            f"{software.describe(phase.software)} (its records say why), so warm.skip_when_valid "
            "cannot check that they are still in the cache"]


def remember(settings: Settings, verdict: Verdict, phase: PhaseResult) -> None:
    """Keep a passed verdict's inputs, so that the next warm step of the same inputs only
    re-checks: under the validate pass's fingerprint (runner.still_valid), and as its plan's
    latest (by which the host plans the next warm job without a GPU: runner.planned_skip);
    forget them when the verdict failed."""
    root, fingerprint = settings.cache_root, phase.fingerprint or ""
    markers = [runner.state_file(root, runner.PASSED, fingerprint),
               runner.state_file(root, runner.PLANNED, phase.plan_key) if phase.plan_key else None]
    if root is None or not fingerprint:
        return
    keys = {kind: totals.hit_keys for kind, totals in phase.recorded.items() if totals.hit_keys}
    # A shape the next warm would prove (its entries re-made: no warm compiled them) is no reason
    # to skip that warm: every later verdict would say "not proven" again.
    unproven = any(s.get("next_warm_proves") for s in verdict.outputs.get("shapes") or ())
    document = {"gpu_type": verdict.gpu_type, "run_id": phase.run_id, "keys": keys,
                "plan": phase.plan_key, "fingerprint": fingerprint, "software": phase.software,
                "device": phase.device}
    for marker in markers:
        if marker is None:
            continue
        if verdict.passed and keys and not unproven:  # what the next warm step checks is still there
            runner.save_state(marker, document)
            continue
        try:
            marker.unlink()
        except OSError:
            pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_phase_arguments(parser)
    parser.add_argument("--phases", metavar="FILE",
                        help="judge the passes the workload runner ran in the jobs' software "
                             "(the workflow's check_cache output) instead of running them here")
    parser.add_argument("--warm", metavar="FILE",
                        help="the warm pass's report (gpu-cache warm --output, the workflow's warm job): the "
                             "entries it re-made are counted in the verdict")
    parser.add_argument("--preflight", metavar="FILE",
                        help="with --phases: the preflight's report (what the jobs were planned to ask)")


def run(args: argparse.Namespace) -> int:
    settings = common.settings(args)
    gpu_type = common.gpu_type(settings, args.gpu_type)
    exports = env.resolve(settings)
    if args.phases:
        phases = load_phases(Path(args.phases))
    else:
        cold = "first with every cache off, then " if settings.validate.measure_cold else ""
        common.announce("validate", settings, gpu_type, f"each run in a fresh process, {cold}on the cache")
        env.warn_once(exports)
        with common.log_stream(args.log) as output:
            phases = run_phases(settings, gpu_type, output, env.job_environ(exports))
    refused = why_not_run(settings, gpu_type, args.warm, args.preflight) \
        if phases["validate"] is not None and phases["validate"].unscheduled else None
    verdict = judge_phases(settings, gpu_type, phases, exports, refused)
    warm_work(verdict, warm_report(args.warm), phases.get("warm"))
    if args.preflight:  # the runs its jobs left out (no node can take them), a mem_mb none has
        verdict.notes += placement.planned_in(args.preflight, settings, gpu_type).get("problems") or []
    outputs_proof.apply(settings, verdict, phases)
    remember(settings, verdict, phases["validate"])
    common.emit(verdict.as_dict(), args.output, to_stdout=args.output is None)
    if verdict.not_warmed:  # fixable, and the run fails for it at its end (summary)
        print(shown(f"gpu-cache: {gpu_type} {verdict.problems[0]}"), file=sys.stderr)
    elif verdict.outcome == "unscheduled":  # an optional type: not a failure, also when strict
        for problem in verdict.problems:
            print(shown(f"gpu-cache: {gpu_type} {problem}"), file=sys.stderr)
    elif not verdict.passed:
        for problem in verdict.problems:
            print(shown(f"gpu-cache: validation of {gpu_type} failed: {problem}"), file=sys.stderr)
        if settings.validate.strict:
            return 1
    return 0


def load_phases(path: Path) -> dict[str, PhaseResult | None]:
    """The validation passes the workload runner wrote (a mapping of phase to result, or
    one validate pass)."""
    data = safe_io.load_json(path)
    try:
        if isinstance(data, dict) and "validate" in data:
            return {name: None if value is None else PhaseResult.from_dict(value)
                    for name, value in data.items()}
        return {"validate": PhaseResult.from_dict(data)}
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None
