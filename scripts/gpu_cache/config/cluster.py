"""What the SLURM cluster offers, as ``sinfo`` says it, and what that means for a GPU type's
jobs (issue 49): which nodes can take them (their partition, GRES, features), how much memory
the largest of those has (warm and check jobs are sized to fit it), whether a type can be
placed at all, and why SLURM refused a job of it, with the config key that fixes that.
"""

from __future__ import annotations

import functools
import os
import re
import selectors
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_cache.config.settings import GpuType, Settings
from gpu_cache.config.targets import a_gpu, device_matches, gpu_types, gres_names
from gpu_cache.config.units import format_size
from gpu_cache.core import device
from gpu_cache.core.shown import clipped, excerpt

#: Seconds ``sinfo`` or ``sbatch --test-only`` may take (a client whose controller is down waits).
TIMEOUT = 5
#: ``sinfo``'s fields, one line per group of nodes alike in each (``--exact``: no "48000+").
FORMAT = "%P|%m|%c|%G|%f|%l"
#: The most of ``sinfo``'s output gpu-cache reads (a line per partition and kind of node: a
#: large site's is a few hundred KB); 50 MB of it was read whole (923 MB peak).
MAX_OUTPUT = 4 << 20
#: A number in sinfo's output: ASCII digits ("²" is a digit to ``str.isdigit`` and no number
#: to ``int``), at most 12 (10^12 MB is more memory than a node has; 401 digits overflowed
#: the sizes' floats).
_NUMBER = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True)
class Offer:
    """A group of nodes of one partition that are alike: memory (MB), CPUs, GPU GRES by type
    name (an untyped ``gpu:4`` under ``""``), features, and the partition's time limit in
    minutes (None: none)."""

    partition: str
    default: bool
    memory_mb: int
    cpus: int
    gres: dict[str, int] = field(default_factory=dict)
    features: frozenset[str] = frozenset()
    time_limit_minutes: int | None = None

    def gpus(self) -> int:
        return sum(self.gres.values())


def _number(text: str, what: str) -> int:
    """Raises: ValueError: ``text`` is not a whole number as :data:`_NUMBER` reads one; the
    message names ``what`` and quotes a cut of ``text``."""
    if not _NUMBER.fullmatch(text):
        raise ValueError(f"{what} {excerpt(text, 40)} is not a whole number gpu-cache reads")
    return int(text)


def _minutes(text: str) -> int | None:
    """sinfo's time limit (``infinite``, ``1-00:00:00``, ``2:00:00``, ``30:00``, ``30``: days,
    hours, minutes, seconds) in whole minutes.

    Raises:
        ValueError: another form.
    """
    if text in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    days, _, clock = text.rpartition("-")
    parts = [_number(p, "time limit") for p in clock.split(":")]
    if len(parts) > 3:
        raise ValueError(f"time limit {excerpt(text, 40)} is not one sinfo writes")
    hours, minutes = (parts[0], parts[1]) if len(parts) == 3 else (0, parts[0])  # minutes[:seconds]
    return (_number(days, "time limit") if days else 0) * 1440 + hours * 60 + minutes


def _gres(text: str) -> dict[str, int]:
    """The GPU GRES of ``gpu:3090:2(S:0-1),gpu:a100:1,gpu:4`` by type name.

    Raises:
        ValueError: a GPU count that is not a number.
    """
    found: dict[str, int] = {}
    for item in re.sub(r"\([^)]*\)", "", text).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        name, count = (parts[1], parts[2]) if len(parts) >= 3 else ("", parts[1])
        found[name] = found.get(name, 0) + _number(count, f"GRES gpu:{name} count")
    return found


def parse(text: str) -> list[Offer]:
    """The groups of nodes in ``sinfo -h -e -o FORMAT`` output; lines it cannot read are skipped."""
    return read(text)[0]


def read(text: str) -> tuple[list[Offer], str | None]:
    """The groups of nodes in ``sinfo -h -e -o FORMAT`` output, and a line naming the first of
    its lines whose numbers could not be read (None: none); lines of other forms are skipped."""
    offers, unread = [], []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        partition, memory, cpus, gres, features, limit = fields
        try:
            offers.append(Offer(partition.rstrip("*"), partition.endswith("*"),
                                _number(memory.rstrip("+"), "node memory"), _number(cpus.rstrip("+"), "CPUs"),
                                _gres(gres), frozenset(f for f in features.split(",") if f and f != "(null)"),
                                _minutes(limit)))
        except (ValueError, KeyError) as exc:  # not numbers, or a time limit of another form
            unread.append(f"partition {clipped(partition.rstrip('*'), 40)}: {exc}")
    if not unread:
        return offers, None
    return offers, (f"sinfo: {len(unread)} group(s) of nodes left out, which gpu-cache could not read "
                    f"(the first: {unread[0]})")


class TooMuchOutput(OSError):
    """A command wrote more than gpu-cache reads of it (:func:`bounded_output`)."""


def bounded_output(argv: list[str], limit: int = MAX_OUTPUT, timeout: float = TIMEOUT) -> str:
    """What ``argv`` writes to its stdout, read as it comes, up to ``limit`` bytes
    (``subprocess.run`` keeps all of it); its stderr is dropped.

    Raises:
        TooMuchOutput: it wrote more than ``limit`` bytes (it is killed).
        subprocess.TimeoutExpired: it did not end within ``timeout`` seconds (it is killed).
        subprocess.CalledProcessError: it exited with an error.
        OSError: it cannot be started.
    """
    deadline = time.monotonic() + timeout
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as process:
        try:
            data = _read_until(process, limit, deadline)
            code = process.wait(max(0.0, deadline - time.monotonic()))
        finally:
            if process.poll() is None:
                process.kill()
    if code:
        raise subprocess.CalledProcessError(code, argv)
    return data.decode("utf-8", "replace")


def _read_until(process: subprocess.Popen[bytes], limit: int, deadline: float) -> bytes:
    """``process``'s stdout to its end, in at most ``limit`` bytes, by ``deadline``."""
    assert process.stdout is not None
    chunks, size = [], 0
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise subprocess.TimeoutExpired(process.args, TIMEOUT)
            chunk = os.read(process.stdout.fileno(), 1 << 16)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise TooMuchOutput(f"more than {limit} bytes")
            chunks.append(chunk)


@functools.lru_cache(maxsize=1)
def query() -> tuple[tuple[Offer, ...] | None, str | None]:
    """What the cluster offers where ``sinfo`` answers (asked once per process), and a line on
    the groups of nodes it could not read (None: none); where it does not answer in time or
    writes more than :data:`MAX_OUTPUT`, None and a line that says so; where there is no
    cluster here (``sinfo`` missing or failing), None and None."""
    if shutil.which("sinfo") is None:
        return None, None
    try:
        out = bounded_output(["sinfo", "-h", "-e", "-o", FORMAT])
    except subprocess.TimeoutExpired:
        return None, f"sinfo did not answer within {TIMEOUT} s"
    except TooMuchOutput:
        return None, (f"sinfo wrote more than {MAX_OUTPUT} bytes: gpu-cache read no more of it, and sizes "
                      "and places no job from it")
    except (OSError, subprocess.CalledProcessError):  # a client without a cluster
        return None, None
    offers, unread = read(out)
    return tuple(offers), unread


def gres_by_partition(offers: tuple[Offer, ...]) -> dict[str, set[str]]:
    """The GPU GRES type names each partition offers."""
    found: dict[str, set[str]] = {}
    for offer in offers:
        found.setdefault(offer.partition, set()).update(name for name in offer.gres if name)
    return found


def partitions_of(spec: GpuType) -> set[str] | None:
    """The partitions a type's resources name (None: the cluster's default)."""
    value = spec.resources.get("slurm_partition")
    return {p.strip() for p in str(value).split(",") if p.strip()} if value else None


def _features(spec: GpuType) -> set[str]:
    """The node features a plain ``constraint`` (``a&b``, ``a,b``) asks for; none for an
    expression SLURM alone can judge (``a|b``, ``[a*2&b]``)."""
    constraint = str(spec.resources.get("constraint") or "")
    if re.search(r"[|\[\]*()]", constraint):
        return set()
    return {f for f in re.split(r"[&,]", constraint) if f}


def in_partitions(spec: GpuType, offers: tuple[Offer, ...]) -> list[Offer]:
    """The groups of nodes of the partitions a type's jobs go to."""
    wanted = partitions_of(spec)
    return [o for o in offers if (o.partition in wanted if wanted else o.default)]


def nodes_for(spec: GpuType, offers: tuple[Offer, ...]) -> list[Offer]:
    """The groups of nodes that can take a type's jobs: in its partitions, with a GRES of a type
    it names (none named: any), and the features of its constraint."""
    names, features = gres_names(spec), _features(spec)
    return [o for o in in_partitions(spec, offers)
            if (not names or names & set(o.gres)) and features <= o.features]


def largest_memory(spec: GpuType, offers: tuple[Offer, ...] | None) -> int | None:
    """The memory (MB) of the largest node that can take a type's jobs (None: none known)."""
    found = nodes_for(spec, offers) if offers else []
    return max((o.memory_mb for o in found), default=None)


def unplaceable(name: str, spec: GpuType, offers: tuple[Offer, ...]) -> str | None:
    """Why no node of the cluster can take a type's jobs as a node of that type, whatever its
    resources say (None: one can): it names no GRES of a type, or one no partition (or none of
    its partitions) offers."""
    names = gres_names(spec)
    if not names:
        asks = "any GPU" if spec.resources.get("gpu") or spec.resources.get("gres") else "no GPU"
        return (f"GPU type {name} asks SLURM for {asks} of a type (its resources name neither a "
                f"gpu_model nor a typed gres): its warm and check jobs may run on a node without "
                f"{a_gpu(spec.expected_device)}, and its validation fail (give it gpu_model, or gres: "
                f"gpu:<type>:1; `gpu-cache doctor` lists the cluster's GPU types)")
    offered = {n for o in offers for n in o.gres}
    if not names & offered:
        then = ("its jobs end unscheduled and hold nothing back" if spec.is_optional
                else "its warm job fails and no job that waits for its verdict runs")
        asked = ", gpu:".join(sorted(names))
        return f"GPU type {name} asks for gpu:{asked}, which no partition offers: {then}"
    if not nodes_for(spec, offers):
        where = sorted({o.partition for o in offers if names & set(o.gres)})
        return (f"GPU type {name} asks for gpu:{', gpu:'.join(sorted(names))} in partition "
                f"{', '.join(sorted(partitions_of(spec) or {'(the default)'}))}, whose nodes do not "
                f"offer it with its constraint (partition {', '.join(where)} has it): set "
                f"gpu_types.{name}.resources.slurm_partition")
    return None


def unreachable(types: Mapping[str, GpuType], here: device.Device,
                offers: tuple[Offer, ...] | None) -> list[str]:
    """A line for each type whose validation would fail because its jobs cannot get its
    device: where a cluster answered (``offers``), each type that no node can take as a node of
    its type (:func:`unplaceable`; one that names no GPU type and is this machine's device runs
    as well anywhere); where none did, each type whose device is not this machine's (its warm
    and check jobs run here)."""
    if offers is not None:
        found = [unplaceable(name, spec, offers) for name, spec in types.items()
                 if gres_names(spec) or not device_matches(spec, here)]
        return [line for line in found if line]
    return [f"GPU type {name}: no SLURM cluster answers here (sinfo) and this machine's device is "
            f"{here.gpu_type}, not {spec.expected_device}: its warm and check jobs would run here "
            "and its validation fail (name the GPU types the jobs get; `gpu-cache doctor` on a "
            "node prints its device)"
            for name, spec in types.items() if not device_matches(spec, here)]


def unreachable_here(settings: Settings) -> list[str]:
    """:func:`unreachable` for the configured types on this machine; asks ``sinfo`` only when
    a type's device is not this machine's."""
    types, here = gpu_types(settings), device.detect()
    if all(device_matches(spec, here) for spec in types.values()):
        return []
    return unreachable(types, here, query()[0])


# --- why SLURM refused a job ---------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """Why a job of a type did not run on a node of it: ``unscheduled`` (no node offers the
    type: an optional type holds nothing back), else a cause the user can fix, with the key."""

    reason: str
    unscheduled: bool = False


def sbatch_flags(request: Mapping[str, Any]) -> list[str]:
    """``sbatch`` flags for a job's resources as Snakemake's SLURM plugin passes them (its
    ``mem_mb``, ``runtime``, partition, GPUs, ``cpus_per_task`` or threads, qos, constraint)."""
    flags = ["--mem", str(request["mem_mb"])] if request.get("mem_mb") else []
    flags += ["-t", str(request["runtime"])] if request.get("runtime") else []
    flags += ["-p", str(request["slurm_partition"])] if request.get("slurm_partition") else []
    flags += ["--qos", str(request["qos"])] if request.get("qos") else []
    flags += ["-C", str(request["constraint"])] if request.get("constraint") else []
    flags += ["-A", str(request["slurm_account"])] if request.get("slurm_account") else []
    if request.get("gres"):
        flags += [f"--gres={request['gres']}"]
    elif request.get("gpu"):
        model = request.get("gpu_model")
        flags += [f"--gpus={model}:{request['gpu']}" if model else f"--gpus={request['gpu']}"]
    flags += [f"--cpus-per-task={request.get('cpus_per_task') or request.get('threads') or 1}"]
    return flags + (shlex.split(str(request["slurm_extra"])) if request.get("slurm_extra") else [])


def test_only(request: Mapping[str, Any]) -> str | None:
    """SLURM's own word on a job of these resources (``sbatch --test-only``): its error line when
    it refuses it, None when it would take it or cannot be asked."""
    if shutil.which("sbatch") is None:
        return None
    try:
        done = subprocess.run(["sbatch", "--test-only", *sbatch_flags(request), "--wrap", "true"],
                              capture_output=True, text=True, timeout=TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    if done.returncode == 0 or any(UNANSWERED.search(line) for line in said):
        return None
    return said[-1][:300] if said else f"sbatch --test-only exited {done.returncode}"


#: What ``sbatch`` says when the controller did not answer: no word on the job itself.
UNANSWERED = re.compile(r"Unable to contact slurm controller|connect failure|Socket timed out|"
                        r"Zero Bytes were transmitted")


def refusal(name: str, spec: GpuType, phase: str, request: Mapping[str, Any],
            offers: tuple[Offer, ...] | None, keys: Mapping[str, str]) -> Refusal:
    """Why the ``phase`` job (warm, check) of type ``name`` that asked for ``request`` did not
    finish on a node of its type; ``keys``: the config key that sets each of memory and CPUs.
    ``offers``: what ``sinfo`` says (None: no cluster answered)."""
    if offers is None:
        return Refusal(f"its {phase} job did not finish on {a_gpu(name)} node, and no SLURM cluster "
                       "answers here to say why (its SLURM log does)")
    names = gres_names(spec)
    if names and not names & {n for o in offers for n in o.gres}:
        return Refusal(f"no partition offers gpu:{', gpu:'.join(sorted(names))}", unscheduled=True)
    where = unplaceable(name, spec, offers)
    if where is not None:
        return Refusal(where)
    nodes = nodes_for(spec, offers)
    label = (f"the nodes of partition {', '.join(sorted({o.partition for o in nodes}))} that "
             f"offer gpu:{', gpu:'.join(sorted(names))}")
    said = test_only(request)
    slurm = f" (SLURM: {said})" if said else ""
    memory, largest = request.get("mem_mb") or 0, max(o.memory_mb for o in nodes)
    if memory > largest:
        return Refusal(f"SLURM refused its {phase} job: it asked for {format_size(memory << 20)} of "
                       f"memory, and {label} have at most {format_size(largest << 20)}{slurm}; "
                       f"{keys['mem_mb']}")
    cpus, most = request.get("cpus_per_task") or request.get("threads") or 1, max(o.cpus for o in nodes)
    if cpus > most:
        return Refusal(f"SLURM refused its {phase} job: it asked for {cpus} CPUs, and {label} have "
                       f"at most {most}{slurm}; {keys['cpus']}")
    gpus = int(request.get("gpu") or spec.gpus or 1)
    if gpus > max(o.gpus() for o in nodes):
        return Refusal(f"SLURM refused its {phase} job: it asked for {gpus} GPUs, and {label} have "
                       f"at most {max(o.gpus() for o in nodes)}{slurm}; set gpu_types.{name}.gpus "
                       "and its resources.gpu to what a node has")
    limits = [o.time_limit_minutes for o in nodes]
    runtime = request.get("runtime")
    if runtime and None not in limits and runtime > max(limits):
        return Refusal(f"SLURM refused its {phase} job: it asked for {runtime} minutes, and the "
                       f"partition allows {max(limits)}{slurm}; lower gpu_types.{name}.resources.runtime")
    if said:
        return Refusal(f"SLURM refused its {phase} job: {said}; check gpu_types.{name}.resources")
    return Refusal(f"its {phase} job did not finish on {a_gpu(name)} node, though SLURM would take it: it "
                   f"did not start within gpu_types.{name}.queue_wait plus its runtime (the "
                   "partition was busy: raise queue_wait), or it failed there (its SLURM log says why)")
