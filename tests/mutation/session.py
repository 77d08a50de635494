"""A run's session: cosmic-ray's database of mutants and their results (resumed by running the
same command again), and what it was made for (the base, the modules as they were, the tests)."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

from changes import Refused
from cosmic_ray.commands.init import init
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkItem, WorkResult

#: The replacements kept by default, per operator: an operator's nearest neighbours (a boundary
#: moved, a test negated, the inverse operation). The others at the same place (``*`` made
#: ``<<``, ``^``, ``%`` ...; ``==`` made ``<``) are killed by the same tests as these, or are
#: noise; ``--all-operators`` keeps them.
NEAREST = {
    "Add": {"Sub", "Mul"}, "Sub": {"Add"}, "Mul": {"Div", "Add"}, "Div": {"Mul", "FloorDiv"},
    "FloorDiv": {"Div", "Mul"}, "Mod": {"FloorDiv"}, "Pow": {"Mul"},
    "BitOr": {"BitAnd", "BitXor"}, "BitAnd": {"BitOr"}, "BitXor": {"BitOr"},
    "LShift": {"RShift"}, "RShift": {"LShift"},
    "Eq": {"NotEq"}, "NotEq": {"Eq"}, "Lt": {"LtE", "GtE"}, "LtE": {"Lt", "Gt"},
    "Gt": {"GtE", "LtE"}, "GtE": {"Gt", "Lt"}, "Is": {"IsNot"}, "IsNot": {"Is"},
}
_REPLACEMENT = re.compile(r"core/Replace(?:Binary|Comparison)Operator_(\w+?)_(\w+)$")


def kept_by_default(operator: str) -> bool:
    found = _REPLACEMENT.match(operator)
    return not found or found.group(2) in NEAREST.get(found.group(1), ())


def unevaluated_annotations(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (start, end) positions of the annotations in a module that imports
    ``annotations`` from ``__future__``, where Python never evaluates them: a mutant there
    (``str | None`` made ``str & None``) computes the same."""
    tree = ast.parse(source)
    if not any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(alias.name == "annotations" for alias in node.names) for node in tree.body):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            found.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            found.append(node.returns)
    return [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in found]


def fingerprint(repo: Path, modules: list[str]) -> dict[str, str]:
    return {module: hashlib.sha256((repo / module).read_bytes()).hexdigest() for module in modules}


class Session:
    """``folder``/session.sqlite (cosmic-ray's: ``cr-report`` reads it) and session.json."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.database = folder / "session.sqlite"
        self.made_for = folder / "session.json"

    def exists(self) -> bool:
        return self.database.exists() and self.made_for.exists()

    def check(self, wanted: dict, repo: Path) -> None:
        """Refuse to resume a session made for another base, modules or tests, or whose modules
        changed since (the mutants' places would be wrong)."""
        made = json.loads(self.made_for.read_text())
        names = {"base": "base", "changed": "set of lines", "tests": "set of tests",
                 "all_operators": "operators"}
        for key, name in names.items():
            if made[key] != wanted[key]:
                raise Refused(f"the session in {self.folder} was made for another {name}: "
                              "--fresh starts it over")
        now = fingerprint(repo, list(made["modules"]))
        for module, digest in made["modules"].items():
            if now[module] != digest:
                raise Refused(f"{module} changed since the session in {self.folder} began: "
                              "--fresh starts it over")

    def create(self, wanted: dict, repo: Path) -> tuple[int, dict[str, int]]:
        """A new database: every mutant of the changed modules, those on unchanged lines and
        (unless all are asked for) the farther replacements marked skipped, as cosmic-ray's own
        filters mark them. (mutants to run, mutants skipped by reason)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in (self.database, self.made_for, self.folder / "map.json"):
            old.unlink(missing_ok=True)
        changed = {module: set(lines) for module, lines in wanted["changed"].items()}
        annotations = {module: unevaluated_annotations((repo / module).read_text()) for module in changed}
        with self.open() as db:
            init([Path(module) for module in changed], db, {})
            skipped = []
            for item in db.work_items:
                mutation = item.mutations[0]
                lines = set(range(mutation.start_pos[0], mutation.end_pos[0] + 1))
                module = str(mutation.module_path)
                if not lines & changed[module]:
                    skipped.append((item.job_id, "on lines unchanged since the base"))
                elif any(start <= tuple(mutation.start_pos) < end for start, end in annotations[module]):
                    skipped.append((item.job_id, "in annotations Python does not evaluate"))
                elif not (wanted["all_operators"] or kept_by_default(mutation.operator_name)):
                    skipped.append((item.job_id, "farther replacements (--all-operators runs them)"))
            reasons = {reason: [job for job, why in skipped if why == reason] for _, reason in skipped}
            for reason, jobs in reasons.items():
                db.set_multiple_results(jobs, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=reason))
            total = db.num_work_items
        self.made_for.write_text(json.dumps(wanted | {"modules": fingerprint(repo, list(changed))}, indent=1))
        return total - len(skipped), {reason: len(jobs) for reason, jobs in reasons.items()}

    def open(self):
        """The database, closed after the block."""
        return use_db(str(self.database))

    @staticmethod
    def pending(db: WorkDB) -> list[WorkItem]:
        """The mutants not yet run, in file and line order (cosmic-ray gives them at random)."""
        return sorted(db.pending_work_items, key=lambda item: (
            str(item.mutations[0].module_path), item.mutations[0].start_pos, item.mutations[0].operator_name,
            item.mutations[0].occurrence))
