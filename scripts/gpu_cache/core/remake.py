"""The warm pass re-makes what no warm compiled (docs/outputs.md): where a run of it was served
an entry whose bytes no warm process of this root compiled and no reference names (brought by
a fetch, an unpack without its proof, a node-local tier, a bad promotion, or compiled by jobs
before any warm), its outputs prove nothing, and the entry stays unproven for every validation
after. So the pass sets those entries aside (:func:`gpu_cache.core.set_aside.set_aside`: from
the root, and from every node's tier before it serves them again), runs those runs again, which
compile them, and keeps the outputs of that compile as the reference.

An entry another warm pass of this root compiled while it still runs is left for now: that
pass keeps its reference when its runs end (two GPU types of one architecture share Triton's
kernels), and setting it aside meanwhile would make that type's validation miss it. Each warm
pass says it runs (``state/warming-<run id>.json``, removed when it ends); an entry written
since the earliest other one started is re-made by a later warm, if no reference names it by
then.

Standard library only: the workload runner does it in the jobs' software.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from gpu_cache.core import hook_records, kinds, names, references, safe_io, state_files
from gpu_cache.core.kinds.integrity import files_of
from gpu_cache.core.reports import PhaseResult, RunResult
from gpu_cache.core.set_aside import set_aside

#: A warm pass's mark that it runs: ``state/warming-<run id>.json`` (:func:`running`).
WARMING = "warming-"
#: How long a mark counts: a warm pass's job that was killed left it.
RUNNING_SECONDS = 24 * 3600.0


def remade(result: PhaseResult, gpu_type: str, commands: Sequence[Any], proof: references.Pass,
           environ: Mapping[str, str], output: TextIO,
           rerun: Callable[[tuple[Any, ...], dict[str, str]], list[RunResult]]) -> list[dict[str, Any]]:
    """Re-make what the runs of a warm pass (the last of ``result.runs``, one per command of
    ``commands``; settled) were served that no warm compiled: set it aside, run those runs
    again (``rerun``: the commands, their environment) and keep their outputs as the reference
    (:func:`gpu_cache.core.references.settle`). ``result`` gains the entries re-made
    (``remade``), its runs their new reports, its seconds theirs. The records of the runs made
    again (none where none ran)."""
    first = len(result.runs) - len(commands)  # (the warm steps' runs come first)
    wanted = asked(result.runs[first:])
    if not wanted:
        return []
    wanted = _not_since(proof, wanted, others_since(proof.root, result.run_id), result.runs, first)
    if not wanted:
        return []
    entries = merged(wanted.values())
    try:  # where no reference can be kept, a compile again would prove nothing either
        state_files.make(proof.root, proof.folder.name)
        failed = set_aside_all(proof.root, entries)
    except OSError as exc:  # (state_files.Untrusted: another account's state folder)
        failed = [f"no reference can be kept in this cache root: {exc}"]
    if failed:  # they would be served again: nothing is run for nothing
        for number in wanted:
            result.runs[first + number] = told(result.runs[first + number], None, "; ".join(failed))
        return []
    each = ", ".join(f"{kind} {len(keys)}" for kind, keys in entries.items())
    output.write(f"# warm [{gpu_type}]: {count(entries)} entries no warm compiled set aside ({each}): "
                 "their runs again\n")
    run_id = f"{environ[names.RUN_ID_VAR]}-remade"
    again = dict(environ, **{names.RUN_ID_VAR: run_id})
    numbers, clock = sorted(wanted), time.perf_counter()
    runs = rerun(tuple(commands[n] for n in numbers), again)
    result.seconds += time.perf_counter() - clock
    records = list(hook_records.read(Path(again[names.RECORDS_VAR]), run_id)) \
        if names.RECORDS_VAR in again else []
    for number, run in zip(numbers, references.settle(proof, runs, records)):
        result.runs[first + number] = told(run, wanted[number])
    result.remade = entries
    return records


@contextmanager
def running(root: Path | None, run_id: str) -> Iterator[None]:
    """Say, for as long as it runs, that the warm pass ``run_id`` runs on ``root``
    (``state/warming-<run id>.json``, with when it started): another warm pass re-makes
    nothing it may have compiled meanwhile. A root that cannot take it only loses that."""
    path = None
    if root is not None:
        try:
            path = state_files.make(root) / f"{WARMING}{run_id}.json"
            mark = {"time": time.time(), "host": socket.gethostname()}
            safe_io.replace_file(path, json.dumps(mark).encode())
        except OSError:
            path = None
    try:
        yield
    finally:
        if path is not None:
            with suppress(OSError):
                os.unlink(path)


def others_since(root: Path, run_id: str) -> float | None:
    """When the earliest other warm pass that still runs on ``root`` started (None: none).
    A mark another account may have written is passed over, and so is one older than
    :data:`RUNNING_SECONDS` (its job was killed), which is removed."""
    earliest = None
    for name, path, _info in safe_io.listing(state_files.folder(root)):
        if not name.startswith(WARMING) or name == f"{WARMING}{run_id}.json":
            continue
        try:
            started = json.loads(state_files.read(Path(path), root, 4096))["time"]
            started = float(started)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if time.time() - started > RUNNING_SECONDS:
            with suppress(OSError):
                os.unlink(path)
        else:
            earliest = started if earliest is None else min(earliest, started)
    return earliest


def _not_since(proof: references.Pass, wanted: dict[int, dict[str, list[str]]], since: float | None,
               runs: list[RunResult], first: int) -> dict[int, dict[str, list[str]]]:
    """``wanted`` without the entries written since ``since`` (another warm pass may have
    compiled them: its reference will name them); each run left with none is told why."""
    if since is None:
        return wanted
    recent = {kind: _written_since(kinds.KINDS.get(kind), proof, keys, since)
              for kind, keys in merged(wanted.values()).items()}
    out = {}
    for number, keys in wanted.items():
        left = {kind: [k for k in found if k not in recent.get(kind, set())] for kind, found in keys.items()}
        left = {kind: found for kind, found in left.items() if found}
        if left:
            out[number] = left
        else:
            runs[first + number] = told(runs[first + number], None, "another warm pass that still runs "
                                        "wrote them: its reference names them once its runs end")
    return out


def _written_since(kind: kinds.Kind | None, proof: references.Pass, keys: list[str],
                   since: float) -> set[str]:
    """Which of ``keys`` (of ``kind``) were written since ``since``: a file of the root's copy
    changed then (of this node's tier's where the root has none: a tier's copy is as new as its
    fetch), files the tool rewrites on each use left out."""
    if kind is None:
        return set()
    wanted, seen, out = set(keys), set(), set()
    for top in (proof.root, proof.tier) if proof.tier is not None and kind.tiered else (proof.root,):
        try:
            entries = kind.scan(kind.folder(top), grace_seconds=0.0)
        except (OSError, ValueError):
            continue
        for entry in entries:
            key = entry.key if entry.key in wanted else entry.key.rsplit("/", 1)[-1]
            if key not in wanted or key in seen:
                continue
            seen.add(key)
            if any(info.st_ctime >= since for each in kind.files(entry) for path, info in files_of(each)
                   if not kind.volatile(os.path.basename(path))):
                out.add(key)
    return out


def asked(runs: Iterable[RunResult]) -> dict[int, dict[str, list[str]]]:
    """The entries each run asks to be re-made (by its place in ``runs``): those its warm
    reference named as compiled by no warm (:func:`gpu_cache.core.references.settle`)."""
    out = {}
    for number, run in enumerate(runs):
        reference = (run.outputs or {}).get("reference")
        keys = reference.get("remake") if isinstance(reference, dict) else None
        if isinstance(keys, dict) and keys:
            out[number] = {str(kind): [str(k) for k in found] for kind, found in keys.items()}
    return out


def merged(wanted: Iterable[Mapping[str, list[str]]]) -> dict[str, list[str]]:
    """The keys of several runs' entries together, per kind."""
    out: dict[str, set[str]] = {}
    for found in wanted:
        for kind, keys in found.items():
            out.setdefault(kind, set()).update(keys)
    return {kind: sorted(keys) for kind, keys in sorted(out.items())}


def set_aside_all(root: Path, wanted: Mapping[str, list[str]]) -> list[str]:
    """Set aside the entries ``wanted`` names (kind -> keys) in the root and every node's tier;
    a line for each that could not be (then its runs would only be served it again)."""
    failed = []
    for name, keys in wanted.items():
        kind = kinds.KINDS.get(name)
        if kind is None:  # (a kind the records name that this gpu-cache does not know)
            failed.append(f"{name}: not a cache kind this gpu-cache knows")
            continue
        failed += set_aside(root, kind, keys)[1]
    return failed


def told(run: RunResult, remade: Mapping[str, list[str]] | None, why: str | None = None) -> RunResult:
    """``run`` whose warm reference says what was re-made for it (``remade``), or why nothing
    was (``why``)."""
    outputs = dict(run.outputs or {})
    reference = dict(outputs.get("reference") or {})
    if remade:
        reference["remade"] = dict(remade)
    if why:
        reference["why"] = f"{reference.get('why')}; they could not be compiled again: {why}"
    outputs["reference"] = reference
    return replace(run, outputs=outputs)


def count(remade: Mapping[str, list[str]]) -> int:
    """How many entries ``remade`` names."""
    return sum(len(keys) for keys in remade.values())
