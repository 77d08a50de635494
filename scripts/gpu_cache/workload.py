"""Workloads: what warm and validate run, once per shape, each in a fresh process."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from gpu_cache.errors import UsageError
from gpu_cache.settings import Settings
from gpu_cache.units import parse_age

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
    entry = settings.config.get("workloads", {}).get(name, {})
    timeout = parse_age(entry.get("timeout", "2h"))
    if "command" in entry:
        shapes = entry.get("shapes")
        if not shapes:
            if "{shape}" in entry["command"]:
                raise UsageError(f"workload {name}: its command uses {{shape}}, so give it shapes")
            shapes = ["-"]
        return Workload(name, entry["command"], tuple(shapes), timeout, builtin=False)
    if name in BUILTINS:
        module, shapes, _about = BUILTINS[name]
        command = f"{{python}} -m {module} --shape {{shape}}"
        return Workload(name, command, tuple(entry.get("shapes") or shapes), timeout, builtin=True)
    known = ", ".join(sorted(set(BUILTINS) | set(settings.config.get("workloads", {}))))
    raise UsageError(
        f"unknown workload {name!r}; known workloads: {known}. A workload of your own needs "
        f"workloads.{name}.command in the config"
    )


def python_for(settings: Settings) -> str:
    """The interpreter that runs built-in workloads."""
    return settings.config.get("python") or sys.executable


@dataclass(frozen=True)
class RunResult:
    """One run of one command: wall seconds and exit code (``None`` when it timed out)."""

    workload: str
    shape: Any
    seconds: float
    returncode: int | None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_command(
    workload: Workload, shape: Any, command: str, environ: Mapping[str, str], log,
) -> RunResult:
    """Run one command in a fresh shell, its output appended to ``log`` (a text stream).

    The whole process group is stopped when the workload's timeout passes.
    """
    env = dict(environ)
    if workload.builtin:
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([*parts, str(PACKAGE_PARENT)])
    log.write(f"$ {command}\n")
    log.flush()
    started = time.perf_counter()
    process = subprocess.Popen(["bash", "-c", command], env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        returncode: int | None = process.wait(timeout=workload.timeout_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        returncode = None
    seconds = time.perf_counter() - started
    log.write(f"# exit {returncode} after {seconds:.2f} s\n")
    log.flush()
    return RunResult(workload.name, shape, seconds, returncode)
