"""Warm: run each workload of a GPU type once per shape, with the cache environment."""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, TextIO

from gpu_cache import device, entries, env, jax_cache, records
from gpu_cache.settings import Settings
from gpu_cache.targets import workloads_of
from gpu_cache.workload import RunResult, python_for, run_command


@dataclass
class Phase:
    """What one pass over a GPU type's workloads did to the cache."""

    runs: list[RunResult] = field(default_factory=list)
    new_keys: dict[str, list[str]] = field(default_factory=dict)
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    run_id: str = ""

    def failures(self) -> list[str]:
        return [f"workload {r.workload} shape {r.shape} "
                + ("timed out" if r.returncode is None else f"exited with code {r.returncode}")
                for r in self.runs if not r.ok]

    def runs_as_dicts(self) -> list[dict[str, Any]]:
        return [{"workload": r.workload, "shape": r.shape, "seconds": round(r.seconds, 3),
                 "returncode": r.returncode} for r in self.runs]


def run_phase(settings: Settings, gpu_type: str, phase: str, environ: Mapping[str, str],
              log: TextIO, record: bool = True) -> Phase:
    """Run every workload of ``gpu_type`` once per shape, in fresh processes.

    ``phase`` names the pass (warm, validate, cold) in progress lines and records; the
    records of this pass are told apart from all others by a run id of their own.
    """
    run_id = f"{phase}-{gpu_type}-{uuid.uuid4().hex[:12]}"
    child_env = dict(environ, GPU_CACHE_GPU_TYPE=gpu_type, GPU_CACHE_RUN_ID=run_id,
                     GPU_CACHE_RULE=f"{phase}_cache",
                     GPU_CACHE_TRITON_TARGETS=",".join(settings.config["triton_targets"]))
    if not record:
        child_env.pop("GPU_CACHE_RECORDS", None)
    python = python_for(settings)
    commands = [(w, shape, cmd) for w in workloads_of(settings, gpu_type)
                for shape, cmd in w.commands(python, gpu_type)]
    before = entries.snapshot(settings.cache_root)
    result = Phase(run_id=run_id)
    started = time.perf_counter()
    for number, (workload, shape, command) in enumerate(commands, 1):
        print(f"gpu-cache {phase} [{gpu_type}] {number}/{len(commands)}: {workload.name} "
              f"shape={shape} ...", end="", file=sys.stderr, flush=True)
        run = run_command(workload, shape, command, child_env, log)
        status = "ok" if run.ok else ("timed out" if run.returncode is None else f"exit {run.returncode}")
        print(f" {run.seconds:.1f} s, {status}", file=sys.stderr, flush=True)
        result.runs.append(run)
    result.seconds = time.perf_counter() - started
    after = entries.snapshot(settings.cache_root)
    result.new_keys = {kind: sorted(after[kind] - before[kind]) for kind in after}
    if record and settings.cache_root is not None and "GPU_CACHE_RECORDS" in child_env:
        result.recorded = records.totals(list(records.read(records.records_dir(settings.cache_root), run_id)))
    return result


def job_info() -> dict[str, str | None]:
    """Where this step ran: host and SLURM job, to find it in sacct."""
    return {"host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def warm(settings: Settings, gpu_type: str, log: TextIO) -> dict[str, Any]:
    """Warm the caches for ``gpu_type`` and return the warm report.

    Raises:
        UsageError: the GPU type or one of its workloads is unknown.
    """
    exports = env.resolve(settings)
    env.warn_once(exports)
    started = time.time()
    phase = run_phase(settings, gpu_type, "warm", env.job_environ(exports), log)
    broken = [] if "jax" in exports.problems else broken_since(settings, started)
    for line in broken:
        print(f"gpu-cache: warning: {line}", file=sys.stderr)
    return {
        "gpu_type": gpu_type,
        "device": device.detect().as_dict(),
        "cache_root": str(settings.cache_root),
        "job": job_info(),
        "seconds": round(phase.seconds, 3),
        "runs": phase.runs_as_dicts(),
        "new_entries": {kind: len(keys) for kind, keys in phase.new_keys.items()},
        "problems": [f"{kind}: {why}" for kind, why in exports.problems.items()] + phase.failures()
        + broken,
        "cache_warnings": exports.messages(),
    }


def broken_since(settings: Settings, since: float) -> list[str]:
    """A problem line when JAX entries written since ``since`` are empty or truncated
    (a full disk or a killed writer); JAX itself never repairs them."""
    if settings.cache_root is None:
        return []
    time.sleep(jax_cache.WRITE_GRACE_SECONDS)  # let the last writes age past the grace period
    try:
        found = [e for e in jax_cache.scan(settings.cache_root / "jax", since - 1.0) if e.problem]
    except OSError:
        return []  # unreadable: env.resolve has reported the folder already
    if not found:
        return []
    return [f"jax: {len(found)} cache entries written now are broken ({found[0].problem}); "
            "is the disk full? `gpu-cache doctor --fix` or the next prune removes them"]
