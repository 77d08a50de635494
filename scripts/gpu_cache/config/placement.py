"""Where a GPU type's warm and check jobs run, as the workflow asks Snakemake for it: their
SLURM resources, the ``--deadline`` of an optional type's jobs, whether a job runs no
workload (an optional type whose first attempt found no node: "unscheduled"), and the one
retry that makes such a job end that way, and their memory. ``workflow/rules/common.smk``
wires these into its rules; the logic is here, so that it is tested without Snakemake
(tests/test_placement.py).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gpu_cache.config.settings import PLACEMENT_RESOURCES, GpuType, Settings
from gpu_cache.config.workloads import workloads_of
from gpu_cache.core.errors import UsageError

#: The resource an optional type's deadline goes into (with the type's own, if any).
DEADLINE_RESOURCE = "slurm_extra"
#: Memory of a job that runs no workload (an optional type's unscheduled retry), in MB.
SKIPPED_MEM_MB = 1000
#: Resources Snakemake cannot leave unset for one wildcard: every type sets them, or none.
SIZED_RESOURCES = ("mem_mb", "runtime")


#: Host memory (MB) of one run of a built-in workload at a shape, where it is known. An
#: AlphaFold 3 fold of N tokens: AlphaPulldownSnakemake's sizing of its structure_inference jobs,
#: mem_safety_factor x (base + per_token_sq x N^2), with its AlphaFold 3 defaults (1.25, 8000 MB,
#: 0.0045 MB): 15 899 MB for 1024 tokens.
RUN_MEMORY_MB: dict[str, Callable[[int], int]] = {
    "alphafold3": lambda tokens: math.ceil(1.25 * (8000 + 0.0045 * tokens**2)),
}


def memory_mb(settings: Settings, gpu_type: str, phase: str) -> int | None:
    """The mem_mb a warm or check job (``phase``) of ``gpu_type`` needs where every run of it
    has a known size (:data:`RUN_MEMORY_MB`): the runs a job makes at once, added up (warm:
    ``warm.parallel`` of them, by default all its shapes side by side; check: one at a time,
    so its largest). None: not known (the executor's default applies)."""
    runs = []
    for workload in workloads_of(settings, gpu_type):
        size = RUN_MEMORY_MB.get(workload.name) if workload.builtin else None
        if size is None:
            return None
        runs += [size(int(shape)) for shape in workload.shapes]
    at_once = (settings.warm.parallel or len(runs)) if phase == "warm" else 1
    return sum(sorted(runs, reverse=True)[:at_once]) or None


def sized(settings: Settings, types: Mapping[str, GpuType], phase: str) -> dict[str, GpuType]:
    """``types`` with ``mem_mb`` in their resources where they leave it out and
    :func:`memory_mb` knows it for ``phase`` (a type's own value wins)."""
    out = {}
    for name, spec in types.items():
        mem = None if "mem_mb" in spec.resources else memory_mb(settings, name, phase)
        out[name] = replace(spec, resources={**spec.resources, "mem_mb": mem}) if mem else spec
    return out


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
        return (f"its job did not finish on a {gpu_type} node within "
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
