"""Workloads: what warm and validate run, once per shape, each in a fresh process."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpu_cache import kinds, records
from gpu_cache.errors import UsageError
from gpu_cache.reports import KindTotals, RunResult
from gpu_cache.settings import Settings
from gpu_cache.targets import gpu_types
from gpu_cache.units import parse_age

log = logging.getLogger(__name__)

PACKAGE_PARENT = Path(__file__).resolve().parent.parent

#: Built-in workloads: name -> (module, default shapes, what it is).
BUILTINS: dict[str, tuple[str, list[Any], str]] = {
    "jax-transformer": (
        "gpu_cache.workloads.jax_transformer", [32, 64, 128],
        "4 pre-norm transformer layers, value_and_grad, per sequence length",
    ),
    "triton-kernels": (
        # 1000 and 4096 specialise differently (divisibility by 16): 10 distinct kernels.
        "gpu_cache.workloads.triton_kernels", [1000, 4096],
        "vector add, row softmax, tiled matmul x3; ahead of time for triton_targets without a GPU",
    ),
}


@dataclass(frozen=True)
class Workload:
    """A command template run once per shape; ``builtin`` when gpu-cache ships it."""

    name: str
    command: str
    shapes: tuple[Any, ...]
    timeout_seconds: float
    builtin: bool

    def commands(self, python: str, gpu_type: str) -> list[tuple[Any, str]]:
        """``(shape, shell command)`` for each shape.

        Raises:
            UsageError: the template names a placeholder other than shape, python, gpu_type.
        """
        out = []
        for shape in self.shapes:
            values = {"shape": shlex.quote(str(shape)), "python": shlex.quote(python),
                      "gpu_type": shlex.quote(gpu_type)}
            try:
                out.append((shape, self.command.format_map(values)))
            except (KeyError, IndexError, ValueError) as exc:
                raise UsageError(
                    f"workload {self.name}: command template {self.command!r} is not valid "
                    f"({exc!r}); it may use {{shape}}, {{python}} and {{gpu_type}}; "
                    "write {{ and }} for literal braces"
                ) from None
        return out


def resolve_workload(settings: Settings, name: str) -> Workload:
    """The workload called ``name``: a user entry in config, or a built-in.

    Raises:
        UsageError: the name is neither a built-in nor configured with a command.
    """
    entry = settings.workloads.get(name)
    timeout = entry.timeout_seconds if entry else parse_age("2h")
    if entry is not None and entry.command is not None:
        shapes = entry.shapes
        if not shapes:
            if "{shape}" in entry.command:
                raise UsageError(f"workload {name}: its command uses {{shape}}, so give it shapes")
            shapes = ("-",)
        return Workload(name, entry.command, shapes, timeout, builtin=False)
    if name in BUILTINS:
        module, shapes, _about = BUILTINS[name]
        command = f"{{python}} -m {module} --shape {{shape}}"
        return Workload(name, command, (entry.shapes if entry else ()) or tuple(shapes), timeout,
                        builtin=True)
    known = ", ".join(sorted(set(BUILTINS) | set(settings.workloads)))
    raise UsageError(
        f"unknown workload {name!r}; known workloads: {known}. A workload of your own needs "
        f"workloads.{name}.command in the config"
    )


def workloads_of(settings: Settings, gpu_type: str) -> list[Workload]:
    """The resolved workloads of one GPU type.

    Raises:
        UsageError: the type is not configured, or names an unknown workload.
    """
    types = gpu_types(settings)
    if gpu_type not in types:
        raise UsageError(f"unknown GPU type {gpu_type!r}; configured types: {', '.join(types)}")
    return [resolve_workload(settings, name) for name in types[gpu_type].workload_names]


def python_for(settings: Settings) -> str:
    """The interpreter that runs built-in workloads."""
    return settings.python or sys.executable


def run_command(
    workload: Workload, shape: Any, command: str, environ: Mapping[str, str], output: TextIO,
) -> RunResult:
    """Run one command in a fresh shell, its output appended to ``log`` (a text stream).

    The whole process group is stopped when the workload's timeout passes.
    """
    env = dict(environ)
    if workload.builtin:
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([*parts, str(PACKAGE_PARENT)])
    output.write(f"$ {command}\n")
    output.flush()
    started = time.perf_counter()
    process = subprocess.Popen(["bash", "-c", command], env=env, stdout=output, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        returncode: int | None = process.wait(timeout=workload.timeout_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        returncode = None
    seconds = time.perf_counter() - started
    output.write(f"# exit {returncode} after {seconds:.2f} s\n")
    output.flush()
    return RunResult(workload.name, shape, seconds, returncode)


@dataclass
class Phase:
    """What one pass over a GPU type's workloads did to the cache."""

    run_id: str
    runs: list[RunResult] = field(default_factory=list)
    new_keys: dict[str, list[str]] = field(default_factory=dict)
    recorded: dict[str, KindTotals] = field(default_factory=dict)
    seconds: float = 0.0

    def failures(self) -> list[str]:
        return [line for line in (run.failure() for run in self.runs) if line]


def run_phase(settings: Settings, gpu_type: str, phase: str, environ: Mapping[str, str],
              output: TextIO, record: bool = True) -> Phase:
    """Run every workload of ``gpu_type`` once per shape, in fresh processes, their output
    appended to ``output``.

    ``phase`` names the pass (warm, validate, cold) in progress lines and records; the
    records of this pass are told apart from all others by a run id of their own.

    Raises:
        UsageError: the GPU type or one of its workloads is unknown.
    """
    run_id = f"{phase}-{gpu_type}-{uuid.uuid4().hex[:12]}"
    child_env = dict(environ, GPU_CACHE_GPU_TYPE=gpu_type, GPU_CACHE_RUN_ID=run_id,
                     GPU_CACHE_RULE=f"{phase}_cache",
                     GPU_CACHE_TRITON_TARGETS=",".join(settings.triton_targets))
    if not record:
        child_env.pop("GPU_CACHE_RECORDS", None)
    python = python_for(settings)
    commands = [(w, shape, cmd) for w in workloads_of(settings, gpu_type)
                for shape, cmd in w.commands(python, gpu_type)]
    before = kinds.snapshot(settings.cache_root)
    result = Phase(run_id=run_id)
    started = time.perf_counter()
    for number, (workload, shape, command) in enumerate(commands, 1):
        where = f"{phase} [{gpu_type}] {number}/{len(commands)}: {workload.name} shape={shape}"
        log.info("%s ...", where)
        run = run_command(workload, shape, command, child_env, output)
        status = "ok" if run.ok else ("timed out" if run.returncode is None else f"exit {run.returncode}")
        log.info("%s: %.1f s, %s", where, run.seconds, status)
        result.runs.append(run)
    result.seconds = time.perf_counter() - started
    after = kinds.snapshot(settings.cache_root)
    result.new_keys = {kind: sorted(after[kind] - before[kind]) for kind in after}
    if record and settings.cache_root is not None and "GPU_CACHE_RECORDS" in child_env:
        result.recorded = records.totals(list(records.read(records.records_dir(settings.cache_root),
                                                           run_id)))
    return result
