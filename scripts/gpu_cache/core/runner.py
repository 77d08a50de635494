"""The workload runner: runs one pass over a GPU type's workloads in fresh processes and
reports what it did to the caches.

It runs inside the jobs' own software: the workflow starts it in the GPU type's container
image or conda environment (through Snakemake's ``container:``/``conda:``), so what warms
and validates the cache is the Python, jax and triton the jobs will run. It therefore needs
only the standard library, on Python 3.9 or later; the host (``gpu-cache warm``/``validate``)
builds its plan and judges its result.

``python -m gpu_cache.core.runner --plan-json JSON --output FILE [--log FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from gpu_cache.core import (
    PACKAGE_PARENT,
    device,
    hook_records,
    kinds,
    names,
    output_runs,
    references,
    remake,
    safe_io,
    software,
    state_files,
)
from gpu_cache.core.errors import UsageError
from gpu_cache.core.reports import PhaseResult, RunResult
from gpu_cache.core.shown import shown

log = logging.getLogger(__name__)
_OUTPUT_LOCK = threading.Lock()  # one run's output at a time into the log


@dataclass(frozen=True)
class Command:
    """One workload run: its name, shape, shell command template ({python}, {shape} and
    {gpu_type} are filled in here) and how long it may take; ``outputs``: the file a user's
    command writes its outputs to ({shape} and {gpu_type} filled in; a built-in workload
    writes ``$GPU_CACHE_OUTPUTS``)."""

    workload: str
    shape: Any
    template: str
    timeout_seconds: float
    builtin: bool = False
    expects: tuple[str, ...] = ()  # the cache kinds it compiles for
    outputs: str | None = None
    #: Peak host memory of the run in MB, where it is known (a built-in workload's, measured):
    #: runs side by side start only while their sum fits the job's memory (:func:`memory_budget`).
    memory_mb: int | None = None


@dataclass(frozen=True)
class Plan:
    """One pass over a GPU type's workloads, as the host planned it.

    ``environ``: variables set for the workloads on top of the runner's own environment (the
    run id, the GPU type, the rule name for records); ``record``: count hits and misses from
    the startup hook's records (off for the cold pass); ``python``: the interpreter that
    ``{python}`` names (None: the runner's own, i.e. the job's); ``parallel``: runs at once;
    ``reuse``: a cold pass reuses its last measurement of the same inputs, and a warm pass is
    skipped when the last validation of the same inputs passed (see :func:`fingerprint`);
    ``container``: the type's image as the config names it (None: none); ``outputs``: collect
    the runs' outputs (the cold pass keeps them as the reference, the validate pass compares).
    """

    phase: str
    gpu_type: str
    commands: tuple[Command, ...]
    environ: dict[str, str] = field(default_factory=dict)
    record: bool = True
    python: str | None = None
    parallel: int = 1
    reuse: bool = False
    container: str | None = None
    outputs: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "gpu_type": self.gpu_type,
                "commands": [vars(c) for c in self.commands], "environ": self.environ,
                "record": self.record, "python": self.python, "parallel": self.parallel,
                "reuse": self.reuse, "container": self.container, "outputs": self.outputs}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Raises: KeyError, TypeError, ValueError: not a plan."""
        return cls(str(data["phase"]), str(data["gpu_type"]),
                   tuple(Command(**{**c, "expects": tuple(c.get("expects") or ())})
                         for c in data["commands"]),
                   {str(k): str(v) for k, v in dict(data.get("environ") or {}).items()},
                   bool(data.get("record", True)), data.get("python"),
                   max(0, int(data.get("parallel", 1))), bool(data.get("reuse", False)),
                   data.get("container") or None, bool(data.get("outputs", False)))


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
        # Appended to the value as written: an empty entry is the working folder (#21).
        before = env.get("PYTHONPATH")
        env["PYTHONPATH"] = f"{before}{os.pathsep}{PACKAGE_PARENT}" if before else str(PACKAGE_PARENT)
    output.write(f"$ {shown(line)}\n")  # a shape from the config may hold a newline or ESC
    output.flush()
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
    output.write(f"# exit {returncode} after {seconds:.2f} s\n")
    output.flush()
    return RunResult(command.workload, command.shape, seconds, returncode)


def cache_root_of(environ: Mapping[str, str]) -> Path | None:
    """The cache root the job's environment names (None: caching off or not set)."""
    root = environ.get(names.ROOT_VAR)
    return Path(root) if root and root != names.ROOT_OFF and os.path.isabs(root) else None


def tier_of(environ: Mapping[str, str]) -> Path | None:
    """The node-local tier the job's environment names (issue 23; None: no tier)."""
    tier = environ.get(names.TIER_VAR)
    return Path(tier) if tier and os.path.isabs(tier) else None


def unscheduled_result(plan: Plan, why: str | None, environ: Mapping[str, str] | None = None,
                       skipped: str | None = None) -> PhaseResult:
    """The result of a pass that ran no workload because its job could not run on a node
    of its GPU type (``why``), as the workflow asks on a later attempt of an optional type, or
    because the host planned it so (``skipped``: :func:`planned_skip`)."""
    environ = dict(os.environ if environ is None else environ)
    root = cache_root_of(environ)
    run_id = f"{plan.phase}-{plan.gpu_type}-{'unscheduled' if why else 'skipped'}"
    return PhaseResult(plan.phase, plan.gpu_type, run_id,
                       device=device.detect(environ).as_dict(), software=software.identity(environ),
                       job={"host": socket.gethostname(), "slurm_job_id": environ.get("SLURM_JOB_ID")},
                       cache_root=str(root) if root else None, unscheduled=why or None,
                       skipped=skipped, plan_key=plan_key(plan))


def fingerprint(plan: Plan, software_identity: Mapping[str, Any], seen: Mapping[str, Any]) -> str:
    """What a measurement or a verdict depends on: the GPU type, its runs (workload, shape,
    command), the software and the device (:func:`device.identity`: its model, not which of
    the node's GPUs the job got). Passes of one type share it, whatever the phase.
    The image counts by the name the config gives it: Snakemake pulls it to a file in each
    working folder's ``.snakemake/singularity`` (unless ``--apptainer-prefix`` is shared), and
    a run in another folder must find the same verdict (its software is in it besides)."""
    import hashlib

    software_identity = dict(software_identity)
    if plan.container and software_identity.get("image"):
        software_identity["image"] = plan.container
    inputs = {"gpu_type": plan.gpu_type, "python": plan.python,
              "runs": [[c.workload, str(c.shape), c.template] for c in plan.commands],
              "software": software_identity, "device": device.identity(seen)}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:24]


def plan_key(plan: Plan) -> str:
    """The part of :func:`fingerprint` that the plan alone decides (the GPU type, its runs, its
    image as the config names it), which the host knows before any job runs."""
    import hashlib

    inputs = {"gpu_type": plan.gpu_type, "container": plan.container,
              "runs": [[c.workload, str(c.shape), c.template] for c in plan.commands]}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:24]


#: The markers of passed validations in the state folder: ``passed-<fingerprint>.json``, which
#: a warm step of those inputs checks (:func:`still_valid`), and ``plan-<plan key>.json``, the
#: latest of a plan's, which the host's :func:`planned_skip` reads (prune bounds both by age).
PASSED, PLANNED = "passed", "plan"


def planned_skip(root: Path | None, plan: Plan) -> str | None:
    """Why a warm job of ``plan`` may be planned to run no workload, and so to ask for no GPU:
    the latest passed verdict of the same plan (:func:`plan_key`; its marker alone is read, not
    a listing: 100,000 markers added 15 s to doctor) whose hit entries are all still in the cache
    root. Its software and device are those of a job, so the check job confirms it on its node
    (it warms first where they differ). None: warm as usual."""
    if root is None or not plan.reuse:
        return None
    document = _plan_marker(root, plan)
    if document is not None and _all_present(root, document.get("keys")):
        return ("the last validation of the same workloads and shapes on this cache root passed, "
                "and every entry it hit is still there; the check job confirms it on its node")
    return None


def _plan_marker(root: Path, plan: Plan) -> dict[str, Any] | None:
    """The marker of the latest passed verdict of ``plan`` (None: none gpu-cache may act on)."""
    key = plan_key(plan)
    marker = state_file(root, PLANNED, key)
    try:
        document = json.loads(state_files.read(marker, root, 16 << 20)) if marker is not None else None
    except (OSError, ValueError, RecursionError):  # none, or none gpu-cache may act on; an unusable
        return None  # root (a name too long, another's 0700 folder): env reports it
    return document if isinstance(document, dict) and document.get("plan") == key else None


def why_warmed(root: Path | None, plan: Plan, identity: Mapping[str, Any],
               seen: Mapping[str, Any]) -> str | None:
    """Why a warm pass of ``plan`` runs although a validation of the same plan passed on this
    root (the plan's latest marker: :func:`gpu_cache.commands.validate.remember`): what differs
    from that validation's inputs (the software, naming the package, or the device), or its
    entries gone. None: no validation of the plan passed here."""
    document = _plan_marker(root, plan) if root is not None else None
    if document is None:
        return None
    before, device_before = document.get("software"), document.get("device")
    found = ["the software or device it ran with (not recorded)"]
    if isinstance(before, dict) and isinstance(device_before, dict):
        found = software.changes(before, identity) + [f"device {change}" for change in software.changes(
            device.identity(device_before), device.identity(seen))]
    if not found:
        return "entries the last passed validation of the same plan hit are gone (pruned or set aside)"
    return f"the last passed validation of the same plan ran with other inputs: {'; '.join(found)}"


def state_file(root: Path | None, what: str, key: str) -> Path | None:
    """Where a measurement or verdict of these inputs is kept: ``<root>/state/<what>-<key>.json``
    (small files, one per set of inputs; not a cache kind)."""
    return root / names.STATE_FOLDER / f"{what}-{key}.json" if root is not None else None


def _reused(plan: Plan, path: Path | None, result: PhaseResult, kept: Path | None) -> PhaseResult | None:
    """The stored result of an earlier pass of the same inputs, or None (``kept``: where its
    outputs must be, when the plan collects them)."""
    if not plan.reuse or path is None:
        return None
    try:
        earlier = PhaseResult.from_dict(json.loads(state_files.read(path, path.parent.parent, 16 << 20)))
    except (OSError, ValueError, UsageError):  # none kept, or none gpu-cache may act on
        return None
    if plan.outputs and not references.cold_kept(kept, earlier.runs):
        return None  # its outputs, the fresh compile's figure, are not kept for these inputs
    earlier.run_id, earlier.reused = result.run_id, str(path)
    return earlier


def _run_all(plan: Plan, python: str, env: Mapping[str, str], output: TextIO,
             scratch: Path | None = None) -> list[RunResult]:
    """The plan's runs, ``plan.parallel`` at a time, each one's output kept apart and appended
    to ``output`` in order when it ends; ``scratch``: where their outputs are kept until the
    pass settles them (:func:`gpu_cache.core.references.settle`; None: not collected)."""
    total = len(plan.commands)

    def one(number: int, command: Command) -> RunResult:
        where = f"{plan.phase} [{plan.gpu_type}] {number}/{total}: {command.workload} shape={command.shape}"
        log.info("%s ...", where)
        with tempfile.TemporaryFile("w+", errors="replace") as own, output_runs.collected(
                command.workload, command.shape, command.builtin, command.outputs, env, plan.phase, scratch,
                plan.gpu_type) as collect:
            run = run_command(command, shell_command(command, python, plan.gpu_type), collect.environ, own)
            if not run.ok:
                run = replace(run, error=last_line(own))
            run = replace(run, outputs=collect.report(run.ok))
            own.seek(0)
            with _OUTPUT_LOCK:
                shutil.copyfileobj(own, output)
                output.flush()
        status = "ok" if run.ok else ("timed out" if run.returncode is None else f"exit {run.returncode}")
        log.info("%s: %.1f s, %s", where, run.seconds, status)
        return run

    if plan.parallel <= 1 or total <= 1:
        return [one(n, c) for n, c in enumerate(plan.commands, 1)]
    from concurrent.futures import ThreadPoolExecutor

    gate = _MemoryGate(memory_budget(env))

    def fitting(number: int, command: Command) -> RunResult:
        with gate.held(command.memory_mb or 0):
            return one(number, command)

    with ThreadPoolExecutor(max_workers=min(plan.parallel, total)) as pool:
        return list(pool.map(fitting, range(1, total + 1), plan.commands))


def memory_budget(environ: Mapping[str, str]) -> int | None:
    """The memory (MB) the runs of a job may use at once: the job's own (SLURM's
    ``SLURM_MEM_PER_NODE``, its cgroup's ``memory.max``), at most what the machine has available
    (``MemAvailable``: a desktop runs several buckets too). None: not known."""
    slurm = str(environ.get("SLURM_MEM_PER_NODE", ""))
    found = [int(slurm)] if slurm.isdigit() else []
    found += [mb for mb in (_cgroup_limit_mb(), _available_mb()) if mb is not None]
    return min(found) if found else None


def _cgroup_limit_mb() -> int | None:
    """This process's cgroup (v2) memory limit in MB; None: none, or no cgroup v2."""
    try:
        with open("/proc/self/cgroup") as lines:  # cgroup v2: the one line "0::<path>"
            path = next((line.strip()[3:] for line in lines if line.startswith("0::")), None)
        if path is None:
            return None
        with open(f"/sys/fs/cgroup{path}/memory.max") as limit:
            text = limit.read().strip()
    except OSError:
        return None
    return int(text) >> 20 if text.isdigit() else None  # "max": no limit


def _available_mb() -> int | None:
    """The machine's available memory in MB (Linux's ``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as info:
            found = next((line.split()[1] for line in info if line.startswith("MemAvailable:")), "")
    except OSError:
        return None
    return int(found) >> 10 if found.isdigit() else None


class _MemoryGate:
    """Lets runs start while the memory they hold together fits ``budget`` (MB); a run larger
    than the whole budget still runs, alone. Without a budget every run starts at once."""

    def __init__(self, budget: int | None) -> None:
        self.budget, self.held_mb = budget, 0
        self.changed = threading.Condition()

    @contextlib.contextmanager
    def held(self, need: int):
        with self.changed:
            while self.budget is not None and self.held_mb and self.held_mb + need > self.budget:
                self.changed.wait()
            self.held_mb += need
        try:
            yield
        finally:
            with self.changed:
                self.held_mb -= need
                self.changed.notify_all()


def last_line(stream: TextIO, tail: int = 4096) -> str | None:
    """The last line of a run's output that is not gpu-cache's own ``# exit`` note."""
    stream.seek(0, os.SEEK_END)
    stream.seek(max(0, stream.tell() - tail))
    lines = [line.strip() for line in stream.read().splitlines()]
    text = [line for line in lines if line and not line.startswith(("# exit", "$ "))]
    return text[-1][:300] if text else None


def run_plan(plan: Plan, output: TextIO, environ: Mapping[str, str] | None = None) -> PhaseResult:
    """Run every command of ``plan`` in fresh processes with ``environ`` (default: this
    process's) plus the plan's variables, and report what the caches saw."""
    environ = dict(os.environ if environ is None else environ)
    # Tells this pass's records apart from all others (made here: a plan is the same each time).
    run_id = f"{plan.phase}-{plan.gpu_type}-{uuid.uuid4().hex[:12]}"
    child_env = dict(environ, **plan.environ, **{names.RUN_ID_VAR: run_id})
    if not plan.record:
        child_env.pop(names.RECORDS_VAR, None)
    # Several JAX processes may share a GPU (shapes side by side, the host's jobs beside
    # gpu-cache's): none may take 75% of its memory at start. Not part of any cache key.
    child_env.setdefault(names.XLA_PREALLOCATE_VAR, "false")
    root = cache_root_of(environ)
    python = plan.python or sys.executable
    identity, seen = software.identity(environ), device.detect(environ).as_dict()
    key = fingerprint(plan, identity, seen)
    kept = references.folder_of(root, key, child_env)
    result = PhaseResult(plan.phase, plan.gpu_type, run_id, device=seen, software=identity,
                         job={"host": socket.gethostname(), "slurm_job_id": environ.get("SLURM_JOB_ID")},
                         cache_root=str(root) if root else None,
                         expects=sorted({kind for c in plan.commands for kind in c.expects}),
                         fingerprint=key, plan_key=plan_key(plan))
    if plan.phase == "cold":
        earlier = _reused(plan, state_file(root, "cold", key), result, kept)
        if earlier is not None:
            log.info("cold [%s]: reusing the measurement of the same inputs (%s)", plan.gpu_type,
                     earlier.reused)
            return earlier
    if plan.phase == "warm" and plan.reuse and still_valid(root, state_file(root, PASSED, key)):
        result.skipped = ("the last validation of the same workloads, shapes, software and device "
                          "passed, and every entry it hit is still there: validation re-checks")
        output.write(f"# warm [{plan.gpu_type}]: no workload run: skipped: {result.skipped}\n")
        return result
    if plan.phase == "warm" and plan.reuse:
        result.why_warmed = why_warmed(root, plan, identity, seen)
    if result.why_warmed:
        output.write(f"# warm [{plan.gpu_type}]: warms again: {shown(result.why_warmed)}\n")
    tier = tier_of(child_env)
    before = kinds.snapshot(root, tier)
    started, wall = time.perf_counter(), time.time()
    steps = warm_steps(child_env) if plan.phase == "warm" else ()
    if steps:  # before the workloads: they then find the recorded kernels ready
        result.runs = _run_all(replace(plan, commands=steps), python, child_env, output)
    with tempfile.TemporaryDirectory(prefix="gpu-cache-outputs-") as scratch, \
            remake.running(root if plan.phase == "warm" and plan.outputs else None, run_id):
        proof = references.Pass(plan.phase, plan.gpu_type, root, tier, kept, Path(scratch)) \
            if plan.outputs and root is not None and kept is not None else None
        result.runs += _run_all(plan, python, child_env, output, proof and proof.scratch)
        result.seconds = time.perf_counter() - started
        recording = plan.record and root is not None and names.RECORDS_VAR in child_env
        found = list(hook_records.read(Path(child_env[names.RECORDS_VAR]), run_id)) if recording else []
        if proof is not None:
            clock = time.perf_counter()
            result.runs = references.settle(proof, result.runs, found)
            result.proof_seconds = round(time.perf_counter() - clock, 3)
            if plan.phase == "warm":  # what no warm compiled, compiled again
                again = partial(_run_again, plan, python, output, proof.scratch)
                found += remake.remade(result, plan.gpu_type, plan.commands, proof, child_env, output, again)
        after = kinds.snapshot(root, tier)
        result.new_keys = {kind: sorted(after[kind] - before[kind]) for kind in after}
        if recording:
            result.recorded = kinds.record_totals(found)
    if plan.phase == "warm":
        # Let the last writes of the kinds that are on age past their grace period.
        time.sleep(max((kind.write_grace for kind in kinds.ALL
                        if not kind.switch_off or environ.get(kind.switch_off[0]) != kind.switch_off[1]),
                       default=0.0))
        result.broken = kinds.broken_since(root, wall, tier)
    if plan.phase == "cold" and not result.failures():
        save_state(state_file(root, "cold", key), result.as_dict())
    return result


def _run_again(plan: Plan, python: str, output: TextIO, scratch: Path, commands: tuple[Command, ...],
               environ: Mapping[str, str]) -> list[RunResult]:
    """Some runs of ``plan`` again, in ``environ`` (the re-make's: :mod:`gpu_cache.core.remake`)."""
    return _run_all(replace(plan, commands=commands), python, environ, output, scratch)


def warm_steps(environ: Mapping[str, str]) -> tuple[Command, ...]:
    """The steps a warm pass runs before its workloads, from what the records under the job's
    records folder say (:meth:`Kind.warm_steps`: Triton's replay of the recorded kernels)."""
    folder = environ.get(names.RECORDS_VAR)
    if not folder or not os.path.isabs(folder):
        return ()
    found = list(hook_records.read(Path(folder)))
    return tuple(Command(name, "recorded", template, timeout, builtin=True, expects=(kind.name,))
                 for kind in kinds.ALL for name, template, timeout in kind.warm_steps(found))


def still_valid(root: Path | None, marker: Path | None) -> bool:
    """Whether a passed verdict's marker exists and every entry its validation hit is still in
    the cache (a prune since then makes the warm step run again)."""
    if root is None or marker is None:
        return False
    try:
        keys = json.loads(state_files.read(marker, root, 16 << 20))["keys"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return _all_present(root, keys)


def _all_present(root: Path, keys: object) -> bool:
    """Whether ``keys`` (a verdict's hit keys by kind) are all still in the cache root."""
    return isinstance(keys, dict) and bool(keys) and all(
        kind in kinds.KINDS and isinstance(found, list)
        and all(kinds.named(kind).present(kinds.named(kind).folder(root), str(k)) for k in found)
        for kind, found in keys.items())


def save_state(path: Path | None, document: Mapping[str, Any]) -> None:
    """Keep a small state file; a root that cannot take it only loses the reuse."""
    if path is None:
        return
    try:
        state_files.make(path.parent.parent)
        safe_io.replace_file(path, (json.dumps(document, default=str) + "\n").encode())
    except OSError as exc:  # an unusable root (reported by the cache environment), or another's state
        log.debug("cannot keep %s (%s): the next run measures again", path, exc.strerror or exc)


def main(argv: list[str] | None = None) -> int:
    """Run the plans given as JSON, one after the other; write the result as JSON: one plan's
    result, or with several a mapping from each plan's phase to its result. Exit 2 for a bad
    plan."""
    parser = argparse.ArgumentParser(prog="python -m gpu_cache.core.runner",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan-json", required=True, action="append", help="a plan, as gpu-cache made it")
    parser.add_argument("--output", required=True, help="write the JSON result here")
    parser.add_argument("--log", help="append the workloads' output here (default: stderr)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="the job's threads: runs at once where a plan leaves it open")
    parser.add_argument("--unscheduled", metavar="WHY",
                        help="run no workload: write each plan's result as unscheduled, for WHY")
    parser.add_argument("--skip", metavar="WHY",
                        help="run no workload: write each plan's result as skipped, for WHY (a warm "
                             "job the host planned without a GPU: planned_skip)")
    args = parser.parse_args(argv)
    try:
        plans = [with_threads(Plan.from_dict(json.loads(text)), args.threads) for text in args.plan_json]
    except (ValueError, KeyError, TypeError) as exc:
        print(f"gpu-cache runner: error: not a plan: {exc!r}", file=sys.stderr)
        return 2
    output = open(args.log, "a") if args.log else sys.stderr  # noqa: SIM115 - stderr is not ours to close
    try:
        results = {}
        for plan in plans:
            if args.unscheduled or args.skip:
                why = args.unscheduled or f"skipped: {args.skip}"
                output.write(f"# {plan.phase} [{plan.gpu_type}]: no workload run: {why}\n")
                results[plan.phase] = unscheduled_result(plan, args.unscheduled, skipped=args.skip).as_dict()
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


def with_threads(plan: Plan, threads: int) -> Plan:
    """``plan`` with its open parallelism (0) set to the job's threads."""
    return plan if plan.parallel else replace(plan, parallel=max(1, threads))


def cold_environ(environ: Mapping[str, str], scratch: Path) -> dict[str, str]:
    """``environ`` with every cache off or in the empty ``scratch``: the honest cold baseline."""
    environ = dict(environ)
    environ.pop(names.RECORDS_VAR, None)
    for kind in (k for k in kinds.ALL if k.exported):
        if kind.switch_off is not None:
            environ[kind.switch_off[0]] = kind.switch_off[1]
        else:
            environ[kind.env_var] = str(kind.folder(scratch))
    for kind in kinds.ALL:  # what an empty folder cannot switch off (the CUDA driver's cache)
        environ.update(kind.piece.cold)
    return environ


if __name__ == "__main__":
    raise SystemExit(main())
