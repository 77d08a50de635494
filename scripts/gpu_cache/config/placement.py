"""Where a GPU type's warm and check jobs run, as the workflow asks Snakemake for it: their
SLURM resources, the ``--deadline`` of an optional type's jobs, whether a job runs no
workload (an optional type whose first attempt found no node: "unscheduled"), and the one
retry that makes such a job end that way, and their memory. ``workflow/rules/common.smk``
wires these into its rules; the logic is here, so that it is tested without Snakemake
(tests/test_placement.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpu_cache.config import cluster, targets
from gpu_cache.config.settings import PLACEMENT_RESOURCES, GpuType, Settings
from gpu_cache.config.units import format_size
from gpu_cache.config.workloads import plan_phase
from gpu_cache.core import runner
from gpu_cache.core.errors import UsageError
from gpu_cache.core.runner import Command, Plan

#: The resource an optional type's deadline goes into (with the type's own, if any).
DEADLINE_RESOURCE = "slurm_extra"
#: Memory of a job that runs no workload (an optional type's unscheduled retry), in MB.
SKIPPED_MEM_MB = 1000
#: Resources Snakemake cannot leave unset for one wildcard: every type sets them, or none.
SIZED_RESOURCES = ("mem_mb", "runtime")


@dataclass(frozen=True)
class JobSizes:
    """What a GPU type's warm and check jobs ask for where its runs' memory is known
    (:mod:`gpu_cache.config.memory`: one process of a built-in workload at its shape, measured):
    the warm job runs ``warm_parallel`` at once, as many of the largest as fit ``budget_mb`` (the
    type's own ``mem_mb``, else the largest node that can take the type, as ``sinfo`` says) and
    ``warm.parallel``, and asks for their sum; the check job runs one at a time and asks for the
    largest. ``runs_mb``: the runs the jobs make; ``left_out``: ``(workload, shape)`` of each run
    larger than the budget, which the jobs leave out where others fit (so that those are warmed);
    ``problems``: a line for each of those, and for a ``mem_mb`` larger than every node that can
    take the type (SLURM refuses its jobs)."""

    runs_mb: tuple[int, ...] | None = None
    budget_mb: int | None = None
    warm_parallel: int = 0
    warm_mb: int | None = None
    check_mb: int | None = None
    problems: tuple[str, ...] = ()
    left_out: tuple[tuple[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_sizes(settings: Settings, gpu_type: str,
              offers: tuple[cluster.Offer, ...] | None = None) -> JobSizes:
    """The sizes of ``gpu_type``'s warm and check jobs (:class:`JobSizes`); without a known size
    of every run, only ``warm.parallel`` (0: as many as the job's threads). ``offers``: what the
    cluster offers (``()``: no cluster; None: ask ``sinfo``).

    Raises:
        UsageError: the type names a workload that is unknown or a shape it cannot run.
    """
    spec = targets.gpu_types(settings)[gpu_type]
    plan = plan_phase(settings, gpu_type, "warm")
    own = spec.resources.get("mem_mb")
    largest = cluster.largest_memory(spec, cluster.query()[0] if offers is None else offers)
    problems = [_over_nodes(gpu_type, own, largest)] if own and largest is not None and own > largest else []
    if not plan.commands or any(c.memory_mb is None for c in plan.commands):
        return JobSizes(warm_parallel=settings.warm.parallel or 0, problems=tuple(problems))
    budget = own or largest
    over = [c for c in plan.commands if budget is not None and c.memory_mb > budget]
    # Where no run fits, none is left out: the jobs ask for what they need, SLURM refuses them,
    # and the verdict fails saying why (an empty warm would pass with nothing proven).
    runs = [c for c in plan.commands if c not in over] or list(plan.commands)
    ordered = sorted((c.memory_mb for c in runs), reverse=True)
    at_once = min(settings.warm.parallel or len(ordered), len(ordered))
    while budget is not None and at_once > 1 and sum(ordered[:at_once]) > budget:
        at_once -= 1
    left_out = tuple((c.workload, c.shape) for c in over) if len(runs) < len(plan.commands) else ()
    problems += [_too_large(gpu_type, c, budget, bool(own), bool(left_out)) for c in over]
    return JobSizes(tuple(c.memory_mb for c in runs), budget, at_once, own or sum(ordered[:at_once]),
                    own or ordered[0], tuple(problems), left_out)


def _over_nodes(gpu_type: str, own: int, largest: int) -> str:
    """A line for a type's own ``mem_mb`` that no node that can take it has (:func:`job_sizes`)."""
    return (f"GPU type {gpu_type}: its resources.mem_mb asks for {format_size(own << 20)}, more than the "
            f"largest node that can take it has ({format_size(largest << 20)}): SLURM refuses its warm "
            f"and check jobs; lower gpu_types.{gpu_type}.resources.mem_mb")


def _too_large(gpu_type: str, command: Command, budget: int, own: bool, left_out: bool) -> str:
    """A line for a run whose memory is over a type's budget (:func:`job_sizes`): left out of
    its jobs where other runs fit, else the reason they are refused."""
    where = "its resources.mem_mb" if own else "the largest node that can take it"
    also = "" if own else f", or give gpu_types.{gpu_type} a partition of larger nodes"
    then = ("it is left out of the type's warm and check jobs (its other runs are warmed), and jobs "
            "of that shape compile for themselves" if left_out else "its jobs would be refused")
    return (f"GPU type {gpu_type}: one run of {command.workload} at shape {command.shape} needs "
            f"{format_size(command.memory_mb << 20)}, more than {where} has "
            f"({format_size(budget << 20)}): {then}; drop {command.shape} from "
            f"workloads.{command.workload}.shapes{also}")


def job_plan(settings: Settings, gpu_type: str, phase: str, planned_jobs: Mapping[str, Any],
             record: bool = True, in_job_software: bool = False) -> Plan:
    """:func:`plan_phase` of a warm or check job: without the runs it leaves out (``left_out`` of
    ``planned_jobs``, :func:`planned`: larger than any node that can take the type)."""
    plan = plan_phase(settings, gpu_type, phase, record, in_job_software)
    left_out = [list(run) for run in planned_jobs.get("left_out") or ()]
    if not left_out:
        return plan
    return replace(plan, commands=tuple(c for c in plan.commands if [c.workload, c.shape] not in left_out))


def sizing_problems(settings: Settings, offers: tuple[cluster.Offer, ...] | None = None) -> list[str]:
    """The lines of :func:`job_sizes` of every type: a ``mem_mb`` or a run that no node can take.

    Raises:
        UsageError: a type names a workload that is unknown or a shape it cannot run.
    """
    return [line for name in targets.gpu_types(settings)
            for line in job_sizes(settings, name, offers).problems]


def sized(settings: Settings, types: Mapping[str, GpuType], phase: str,
          offers: tuple[cluster.Offer, ...] | None = None) -> dict[str, GpuType]:
    """``types`` with ``mem_mb`` in their resources where they leave it out and
    :func:`job_sizes` knows it for ``phase`` (a type's own value wins)."""
    out = {}
    for name, spec in types.items():
        sizes = job_sizes(settings, name, offers) if "mem_mb" not in spec.resources else JobSizes()
        mem = sizes.warm_mb if phase == "warm" else sizes.check_mb
        out[name] = replace(spec, resources={**spec.resources, "mem_mb": mem}) if mem else spec
    return out


def planned(settings: Settings, gpu_type: str, offers: tuple[cluster.Offer, ...] | None = None
            ) -> dict[str, Any]:
    """How ``gpu_type``'s warm and check jobs are planned: their sizes (:func:`job_sizes`) and
    ``skip``, why its warm job runs no workload and asks for no GPU (a passed verdict of the same
    plan holds: ``runner.planned_skip``; None: it warms). The preflight (``gpu-cache doctor``)
    writes it once per run, so that every evaluation of a job's resources, in Snakemake and in
    the job's own process, agrees."""
    sizes = job_sizes(settings, gpu_type, offers).as_dict()
    plan = job_plan(settings, gpu_type, "warm", sizes)
    return {**sizes, "skip": runner.planned_skip(settings.cache_root, plan)}


def planned_in(report: str | None, settings: Settings, gpu_type: str) -> dict[str, Any]:
    """:func:`planned` as the preflight report ``report`` has it, once it exists (its section
    ``placement``); planned here before (a dry run, whose jobs never run)."""
    if report and os.path.isfile(report):
        try:
            with open(report) as stream:
                found = json.load(stream)["placement"][gpu_type]
            if isinstance(found, dict):
                return found
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return planned(settings, gpu_type)


def optional_types(types: Mapping[str, GpuType]) -> list[str]:
    """The types the partition may lack: a job of them that found no node holds nothing back."""
    return [name for name, spec in types.items() if spec.is_optional]


def retries(types: Mapping[str, GpuType]) -> int:
    """Retries of warm_cache and check_cache: one when a type is optional, so that its job
    that found no node is retried as "unscheduled" (0: Snakemake's --retries applies)."""
    return 1 if optional_types(types) else 0


def skip_reason(gpu_type: str, spec: GpuType, warm_report: str | None, attempt: int) -> str | None:
    """Why a warm or check job of ``gpu_type`` runs no workload (None: it runs them): an
    optional type's later attempt (the first did not finish on a node of its type), or a check
    whose warm job (its report ``warm_report``) was unscheduled. Reads the report only once it
    exists."""
    if not spec.is_optional:
        return None
    if attempt > 1:
        return (f"its job did not finish on {targets.a_gpu(gpu_type)} node within "
                f"gpu_types.{gpu_type}.queue_wait (no such node, rejected by SLURM, or dropped "
                "at its --deadline; a job that started and failed is in its log)")
    if warm_report and os.path.isfile(warm_report):
        try:
            with open(warm_report) as stream:
                why = json.load(stream).get("unscheduled")
        except (OSError, ValueError, AttributeError):
            why = None
        if why:
            return f"its warm job was not scheduled ({why})"
    return None


def deadline(spec: GpuType) -> str | None:
    """The sbatch --deadline of an optional type's jobs (SLURM drops a job that cannot end
    before it): queue_wait plus the type's runtime (minutes). None without a runtime: SLURM
    judges a deadline against the job's time limit, which would then be the partition's
    default, so a deadline could drop every job at once."""
    if not spec.is_optional or not spec.resources.get("runtime"):
        return None
    return f"--deadline=now+{int(spec.queue_wait_seconds + 60 * spec.resources['runtime'])}"


def resource_names(types: Mapping[str, GpuType]) -> list[str]:
    """The resources the warm and check jobs ask for: each that any type sets, and the
    deadline's where a type has one.

    Raises:
        UsageError: a sized resource is set for some types but not all.
    """
    names = {name for spec in types.values() for name in spec.resources}
    if any(deadline(spec) for spec in types.values()):
        names.add(DEADLINE_RESOURCE)
    for name in sorted(names.intersection(SIZED_RESOURCES)):
        lacking = [gpu_type for gpu_type, spec in types.items() if name not in spec.resources]
        if lacking:
            raise UsageError(f"gpu_types: {name} is set for some GPU types but not for "
                             f"{', '.join(lacking)}; set it for every type or for none")
    return sorted(names)


def resource(name: str, spec: GpuType, skipped: Callable[[], bool]) -> Any:
    """One resource of a job of ``spec``: the type's own value (None: it asks for nothing);
    none that places it on a node, and little memory, when the job runs no workload
    (``skipped()``, asked only for those); the deadline added to the type's own
    ``slurm_extra``."""
    if name in PLACEMENT_RESOURCES and skipped():
        return None
    if name == "mem_mb" and name in spec.resources and skipped():
        return SKIPPED_MEM_MB  # (Snakemake needs a number here; the job writes one small file)
    due = deadline(spec) if name == DEADLINE_RESOURCE else None
    if due:
        return " ".join(filter(None, [spec.resources.get(name), due]))
    return spec.resources.get(name)


def first_request(settings: Settings, gpu_type: str, phase: str, planned_jobs: Mapping[str, Any]
                  ) -> dict[str, Any]:
    """The resources the first attempt of ``gpu_type``'s ``phase`` job (warm, check) asked SLURM
    for, as the workflow asks them (its memory as planned, the deadline, its threads)."""
    spec = targets.gpu_types(settings)[gpu_type]
    mem = spec.resources.get("mem_mb") or planned_jobs.get(f"{phase}_mb")
    if mem:
        spec = replace(spec, resources={**spec.resources, "mem_mb": mem})
    names = [*spec.resources, DEADLINE_RESOURCE]
    found = {name: resource(name, spec, lambda: False) for name in names}
    runs = len(job_plan(settings, gpu_type, "warm", planned_jobs).commands)
    found["threads"] = (planned_jobs.get("warm_parallel") or runs) if phase == "warm" else 1
    return {name: value for name, value in found.items() if value is not None}


def refusal_keys(settings: Settings, gpu_type: str, phase: str) -> dict[str, str]:
    """What the user sets to fix a refused ``phase`` job of ``gpu_type``: for its memory, its CPUs."""
    spec = targets.gpu_types(settings)[gpu_type]
    if "mem_mb" in spec.resources:
        memory = f"lower gpu_types.{gpu_type}.resources.mem_mb to what such a node has"
    else:
        memory = (f"gpu-cache sized it from the largest run; drop the largest shapes from the "
                  f"type's workloads (workloads.<name>.shapes) or set gpu_types.{gpu_type}.resources.mem_mb")
    if "cpus_per_task" in spec.resources:
        cpus = f"lower gpu_types.{gpu_type}.resources.cpus_per_task"
    elif phase == "warm":
        cpus = (f"set warm.parallel (a warm job asks for a CPU per run it makes at once) or "
                f"gpu_types.{gpu_type}.resources.cpus_per_task")
    else:
        cpus = f"set gpu_types.{gpu_type}.resources.cpus_per_task"
    return {"mem_mb": memory, "cpus": cpus}
