"""The workload runner: runs one pass over a GPU type's workloads in fresh processes and
reports what it did to the caches.

It runs inside the jobs' own software: the workflow starts it in the GPU type's container
image or conda environment (through Snakemake's ``container:``/``conda:``), so what warms
and validates the cache is the Python, jax and triton the jobs will run. It therefore needs
only the standard library, on Python 3.9 or later; the host (``gpu-cache warm``/``validate``)
builds its plan and judges its result.

``python -m gpu_cache.runner --plan-json JSON --output FILE [--log FILE]``
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpu_cache import device, jax_cache, kinds, records, software
from gpu_cache.reports import PhaseResult, RunResult

log = logging.getLogger(__name__)
PACKAGE_PARENT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Command:
    """One workload run: its name, shape, shell command template ({python}, {shape} and
    {gpu_type} are filled in here) and how long it may take."""

    workload: str
    shape: Any
    template: str
    timeout_seconds: float
    builtin: bool = False
    expects: tuple[str, ...] = ()  # the cache kinds it compiles for


@dataclass(frozen=True)
class Plan:
    """One pass over a GPU type's workloads, as the host planned it.

    ``environ``: variables set for the workloads on top of the runner's own environment (the
    run id, the GPU type, the rule name for records); ``record``: count hits and misses from
    the startup hook's records (off for the cold pass); ``python``: the interpreter that
    ``{python}`` names (None: the runner's own, i.e. the job's).
    """

    phase: str
    gpu_type: str
    commands: tuple[Command, ...]
    environ: dict[str, str] = field(default_factory=dict)
    record: bool = True
    python: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "gpu_type": self.gpu_type,
                "commands": [vars(c) for c in self.commands], "environ": self.environ,
                "record": self.record, "python": self.python}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Raises: KeyError, TypeError, ValueError: not a plan."""
        return cls(str(data["phase"]), str(data["gpu_type"]),
                   tuple(Command(**{**c, "expects": tuple(c.get("expects") or ())})
                         for c in data["commands"]),
                   {str(k): str(v) for k, v in dict(data.get("environ") or {}).items()},
                   bool(data.get("record", True)), data.get("python"))


def shell_command(command: Command, python: str, gpu_type: str) -> str:
    """The command line of one run: the template with shell-quoted values filled in.

    Raises:
        KeyError, IndexError, ValueError: the template names another placeholder.
    """
    import shlex

    return command.template.format_map({"shape": shlex.quote(str(command.shape)),
                                        "python": shlex.quote(python),
                                        "gpu_type": shlex.quote(gpu_type)})


def run_command(command: Command, line: str, environ: Mapping[str, str], output: TextIO) -> RunResult:
    """Run one command line in a fresh shell, its output appended to ``output``; the whole
    process group is stopped when the command's timeout passes."""
    env = dict(environ)
    if command.builtin:  # built-in workloads are modules of this package
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([*parts, str(PACKAGE_PARENT)])
    output.write(f"$ {line}\n")
    output.flush()
    offset = _position(output)
    started = time.perf_counter()
    process = subprocess.Popen(["bash", "-c", line], env=env, stdout=output, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        returncode: int | None = process.wait(timeout=command.timeout_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        returncode = None
    seconds = time.perf_counter() - started
    error = None if returncode == 0 else last_line(output, offset)
    output.write(f"# exit {returncode} after {seconds:.2f} s\n")
    output.flush()
    return RunResult(command.workload, command.shape, seconds, returncode, error)


#: How much of a failed run's output is searched for its last line, and how long that line may be.
TAIL_BYTES = 64 << 10
LINE_CHARS = 300


def _position(output: TextIO) -> int | None:
    """Where the next byte of ``output`` lands, when it is a regular file (else None)."""
    try:
        return os.lseek(output.fileno(), 0, os.SEEK_END)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None


def last_line(output: TextIO, offset: int | None) -> str | None:
    """The last non-empty line a run wrote to ``output`` since ``offset`` (its error, as
    ``ModuleNotFoundError: No module named 'jax'``), cut to :data:`LINE_CHARS`; None when
    the output is not a regular file or the run printed nothing."""
    if offset is None:
        return None
    try:
        fd = output.fileno()
        end = os.lseek(fd, 0, os.SEEK_END)
        start = max(offset, end - TAIL_BYTES)
        # The log is opened for appending only: read it through a descriptor of its own.
        reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.pread(reader, end - start, start) if end > start else b""
        finally:
            os.close(reader)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " ..."


def cache_root_of(environ: Mapping[str, str]) -> Path | None:
    """The cache root the job's environment names (None: caching off or not set)."""
    root = environ.get("GPU_CACHE_ROOT")
    return Path(root) if root and root != "none" and os.path.isabs(root) else None


def broken_since(cache_root: Path | None, since: float) -> list[str]:
    """A problem line when JAX entries written since ``since`` are empty or truncated (a
    full disk or a killed writer; JAX itself never repairs them). Entries younger than
    :data:`jax_cache.WRITE_GRACE_SECONDS` are not checked (they may be mid-write)."""
    if cache_root is None:
        return []
    try:
        found = [e for e in jax_cache.scan(kinds.KINDS["jax"].folder(cache_root), since - 1.0)
                 if e.problem]
    except OSError:
        return []  # unreadable: the cache environment reported the folder already
    if not found:
        return []
    return [f"jax: {len(found)} cache entries written now are broken ({found[0].problem}); "
            "is the disk full? `gpu-cache doctor --fix` or the next prune removes them"]


def unscheduled_result(plan: Plan, why: str, environ: Mapping[str, str] | None = None) -> PhaseResult:
    """The result of a pass that ran no workload because its job could not run on a node
    of its GPU type (``why``), as the workflow asks on a later attempt of an optional type."""
    environ = dict(os.environ if environ is None else environ)
    root = cache_root_of(environ)
    return PhaseResult(plan.phase, plan.gpu_type, f"{plan.phase}-{plan.gpu_type}-unscheduled",
                       device=device.detect(environ).as_dict(), software=software.identity(environ),
                       job={"host": socket.gethostname(), "slurm_job_id": environ.get("SLURM_JOB_ID")},
                       cache_root=str(root) if root else None, unscheduled=why)


def run_plan(plan: Plan, output: TextIO, environ: Mapping[str, str] | None = None) -> PhaseResult:
    """Run every command of ``plan`` in fresh processes with ``environ`` (default: this
    process's) plus the plan's variables, and report what the caches saw."""
    environ = dict(os.environ if environ is None else environ)
    # Tells this pass's records apart from all others (made here: a plan is the same each time).
    run_id = f"{plan.phase}-{plan.gpu_type}-{uuid.uuid4().hex[:12]}"
    child_env = dict(environ, **plan.environ, GPU_CACHE_RUN_ID=run_id)
    if not plan.record:
        child_env.pop("GPU_CACHE_RECORDS", None)
    root = cache_root_of(environ)
    python = plan.python or sys.executable
    before = kinds.snapshot(root)
    result = PhaseResult(plan.phase, plan.gpu_type, run_id, device=device.detect(environ).as_dict(),
                         software=software.identity(environ),
                         job={"host": socket.gethostname(), "slurm_job_id": environ.get("SLURM_JOB_ID")},
                         cache_root=str(root) if root else None,
                         expects=sorted({kind for c in plan.commands for kind in c.expects}))
    started, wall = time.perf_counter(), time.time()
    for number, command in enumerate(plan.commands, 1):
        where = (f"{plan.phase} [{plan.gpu_type}] {number}/{len(plan.commands)}: {command.workload} "
                 f"shape={command.shape}")
        log.info("%s ...", where)
        run = run_command(command, shell_command(command, python, plan.gpu_type), child_env, output)
        status = "ok" if run.ok else ("timed out" if run.returncode is None else f"exit {run.returncode}")
        log.info("%s: %.1f s, %s", where, run.seconds, status)
        result.runs.append(run)
    result.seconds = time.perf_counter() - started
    after = kinds.snapshot(root)
    result.new_keys = {kind: sorted(after[kind] - before[kind]) for kind in after}
    if plan.record and root is not None and "GPU_CACHE_RECORDS" in child_env:
        found = list(records.read(Path(child_env["GPU_CACHE_RECORDS"]), run_id))
        result.recorded = records.totals(found)
    if plan.phase == "warm" and environ.get("JAX_ENABLE_COMPILATION_CACHE") != "false":
        time.sleep(jax_cache.WRITE_GRACE_SECONDS)  # let the last writes age past the grace period
        result.broken = broken_since(root, wall)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the plans given as JSON, one after the other; write the result as JSON: one plan's
    result, or with several a mapping from each plan's phase to its result. Exit 2 for a bad
    plan."""
    parser = argparse.ArgumentParser(prog="python -m gpu_cache.runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan-json", required=True, action="append", help="a plan, as gpu-cache made it")
    parser.add_argument("--output", required=True, help="write the JSON result here")
    parser.add_argument("--log", help="append the workloads' output here (default: stderr)")
    parser.add_argument("--unscheduled", metavar="WHY",
                        help="run no workload: write each plan's result as unscheduled, for WHY")
    args = parser.parse_args(argv)
    try:
        plans = [Plan.from_dict(json.loads(text)) for text in args.plan_json]
    except (ValueError, KeyError, TypeError) as exc:
        print(f"gpu-cache runner: error: not a plan: {exc!r}", file=sys.stderr)
        return 2
    output = open(args.log, "a") if args.log else sys.stderr  # noqa: SIM115 - stderr is not ours to close
    try:
        results = {}
        for plan in plans:
            if args.unscheduled:
                output.write(f"# {plan.phase} [{plan.gpu_type}]: no workload run: {args.unscheduled}\n")
                results[plan.phase] = unscheduled_result(plan, args.unscheduled).as_dict()
                continue
            environ = None
            if plan.phase == "cold":
                scratch = tempfile.mkdtemp(prefix="gpu-cache-cold-")
                environ = cold_environ(os.environ, Path(scratch))
            try:
                results[plan.phase] = run_plan(plan, output, environ).as_dict()
            finally:
                if environ is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
    finally:
        if output is not sys.stderr:
            output.close()
    target = Path(args.output)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    document = results[plans[0].phase] if len(plans) == 1 else results
    temp.write_text(json.dumps(document, indent=2, default=str) + "\n")
    os.replace(temp, target)
    return 0


def cold_environ(environ: Mapping[str, str], scratch: Path) -> dict[str, str]:
    """``environ`` with every cache off or in the empty ``scratch``: the honest cold baseline."""
    environ = dict(environ)
    environ.pop("GPU_CACHE_RECORDS", None)
    for kind in (kinds.KINDS[name] for name in kinds.EXPORTED):
        if kind.switch_off is not None:
            environ[kind.switch_off[0]] = kind.switch_off[1]
        else:
            environ[kind.env_var] = str(kind.folder(scratch))
    environ["CUDA_CACHE_DISABLE"] = "1"  # the driver's cache could serve PTX from earlier runs
    return environ


if __name__ == "__main__":
    raise SystemExit(main())
