"""The score of a session, its survivors (file:line and the mutation) and the survivors accepted
in accepted.toml, printed and written as JSON."""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from cosmic_ray.work_db import WorkDB
from cosmic_ray.work_item import TestOutcome, WorkerOutcome

#: Where a repository keeps its accepted survivors.
ACCEPTED = Path("tests/mutation/accepted.toml")
#: The first line of a result that ran no test because no test ran the mutated statement.
NOT_COVERED = "not covered: no test ran this statement"
TIMEOUT = "timeout:"


@dataclass
class Mutant:
    file: str
    line: int
    operator: str
    original: str
    mutated: str
    outcome: str  # killed, timeout, survived, not covered, could not run
    detail: str
    accepted: str | None = None

    def key(self) -> tuple[str, str, str, str]:
        return self.file, self.operator, self.original.strip(), self.mutated.strip()


def _changed_lines(diff: str) -> tuple[str, str]:
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return "\n".join(removed), "\n".join(added)


def _outcome(test_outcome: TestOutcome | None, worker: WorkerOutcome, detail: str) -> str:
    if worker is WorkerOutcome.NORMAL and test_outcome is TestOutcome.KILLED:
        return "timeout" if detail.startswith(TIMEOUT) else "killed"
    if worker is WorkerOutcome.NORMAL and test_outcome is TestOutcome.SURVIVED:
        return "not covered" if detail.startswith(NOT_COVERED) else "survived"
    return "could not run"


def accepted(path: Path) -> dict[tuple[str, str, str, str], str]:
    """(file, operator, original line, mutated line) -> why the survivor is accepted."""
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("accepted", [])
    return {(e["file"], e["operator"], e["original"].strip(), e["mutant"].strip()): e["reason"]
            for e in entries}


def mutants(db: WorkDB, reasons: dict) -> list[Mutant]:
    """Every mutant run (or judged without a run), in file and line order."""
    found = []
    for item, result in db.completed_work_items:
        if result.worker_outcome in (WorkerOutcome.SKIPPED, WorkerOutcome.NO_TEST):
            continue
        mutation = item.mutations[0]
        detail = (result.output or "").split("\n", 1)[0]
        original, mutated = _changed_lines(result.diff or "")
        mutant = Mutant(str(mutation.module_path), mutation.start_pos[0], mutation.operator_name,
                        original, mutated, _outcome(result.test_outcome, result.worker_outcome, detail),
                        detail)
        if mutant.outcome in ("survived", "not covered"):
            mutant.accepted = reasons.get(mutant.key())
        found.append(mutant)
    return sorted(found, key=lambda m: (m.file, m.line, m.operator, m.mutated))


def summary(found: list[Mutant], pending: int) -> dict:
    count = {outcome: sum(m.outcome == outcome for m in found)
             for outcome in ("killed", "timeout", "survived", "not covered", "could not run")}
    killed = count["killed"] + count["timeout"]
    return {"mutants": len(found), "killed": killed, "killed_by_timeout": count["timeout"],
            "survived": count["survived"] + count["not covered"], "not_covered": count["not covered"],
            "could_not_run": count["could not run"], "pending": pending,
            "score": round(killed / len(found), 4) if found else None}


def report(db: WorkDB, made_for: dict, pending: int, seconds: float, repo: Path, target: Path) -> dict:
    """Print the score and every survivor (the accepted ones with their reason); write it all
    as JSON to ``target``."""
    found = mutants(db, accepted(repo / ACCEPTED))
    score = summary(found, pending)
    survivors = [m for m in found if m.outcome in ("survived", "not covered")]
    line = (f"score: {score['killed']} of {score['mutants']} killed"
            + (f" ({100 * score['score']:.1f}%)" if found else "")
            + f"; {score['killed_by_timeout']} of them by timeout; {score['survived']} survived"
            + f" ({score['not_covered']} not run by any test); {score['could_not_run']} could not run")
    print(line + (f"; {pending} not run yet (run the same command to go on)" if pending else ""))
    for mutant in survivors:
        mark = f"accepted: {mutant.accepted}" if mutant.accepted else mutant.outcome
        print(f"  {mutant.file}:{mutant.line} {mutant.operator} ({mark})")
        print("\n".join(f"      - {text}" for text in mutant.original.splitlines()))
        print("\n".join(f"      + {text}" for text in mutant.mutated.splitlines()))
    for mutant in (m for m in found if m.outcome == "could not run"):
        print(f"  could not run: {mutant.file}:{mutant.line} {mutant.operator}: {mutant.detail}")
    data = {"base": made_for["base"], "changed": made_for["changed"], "tests": made_for["tests"],
            "seconds": round(seconds, 1), **score,
            "survivors": [asdict(m) for m in survivors],
            "accepted": sum(m.accepted is not None for m in survivors),
            "mutants_run": [asdict(m) for m in found]}
    target.write_text(json.dumps(data, indent=1))
    print(f"report: {target}")
    return data
