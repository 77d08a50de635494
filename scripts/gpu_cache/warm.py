"""Warm: run each workload of a GPU type once per shape, with the cache environment."""

from __future__ import annotations

import os
import socket
from typing import TextIO

from gpu_cache import device, env, jax_cache
from gpu_cache.reports import WarmReport
from gpu_cache.settings import Settings
from gpu_cache.workload import run_phase


def job_info() -> dict[str, str | None]:
    """Where this step ran: host and SLURM job, to find it in sacct."""
    return {"host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def warm(settings: Settings, gpu_type: str, output: TextIO) -> WarmReport:
    """Warm the caches for ``gpu_type`` (the workloads' output goes to ``output``). The
    caller checks what was written with :func:`broken_since` once the writes have settled.

    Raises:
        UsageError: the GPU type or one of its workloads is unknown.
    """
    exports = env.resolve(settings)
    env.warn_once(exports)
    phase = run_phase(settings, gpu_type, "warm", env.job_environ(exports), output)
    return WarmReport(
        gpu_type=gpu_type,
        device=device.detect().as_dict(),
        cache_root=str(settings.cache_root),
        job=job_info(),
        seconds=phase.seconds,
        runs=phase.runs,
        new_entries={kind: len(keys) for kind, keys in phase.new_keys.items()},
        problems=[f"{kind}: {why}" for kind, why in exports.problems.items()] + phase.failures(),
        kinds_without_cache=sorted(exports.problems),
        cache_warnings=exports.messages(),
    )


def broken_since(settings: Settings, since: float) -> list[str]:
    """A problem line when JAX entries written since ``since`` are empty or truncated
    (a full disk or a killed writer); JAX itself never repairs them. Entries younger than
    :data:`jax_cache.WRITE_GRACE_SECONDS` are not checked (they may be mid-write)."""
    if settings.cache_root is None:
        return []
    try:
        found = [e for e in jax_cache.scan(settings.cache_root / "jax", since - 1.0) if e.problem]
    except OSError:
        return []  # unreadable: env.resolve has reported the folder already
    if not found:
        return []
    return [f"jax: {len(found)} cache entries written now are broken ({found[0].problem}); "
            "is the disk full? `gpu-cache doctor --fix` or the next prune removes them"]
