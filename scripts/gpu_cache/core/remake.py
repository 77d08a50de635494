"""The warm pass re-makes what no warm compiled (docs/outputs.md): where a run of it was served
an entry whose bytes no warm process of this root compiled and no reference names (brought by
a fetch, an unpack without its proof, a node-local tier, a bad promotion, or compiled by jobs
before any warm), its outputs prove nothing, and the entry stays unproven for every validation
after. So the pass sets those entries aside (:func:`gpu_cache.core.set_aside.set_aside`: from
the root, and from every node's tier before it serves them again), runs those runs again, which
compile them, and keeps the outputs of that compile as the reference.

Standard library only: the workload runner does it in the jobs' software.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from gpu_cache.core import hook_records, kinds, names, references, state_files
from gpu_cache.core.reports import PhaseResult, RunResult
from gpu_cache.core.set_aside import set_aside


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
