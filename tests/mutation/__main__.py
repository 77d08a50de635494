"""Mutation testing of what a round changed (docs/testing.md, "Mutation testing").

    python tests/mutation [--base REF | --hours N] [--tests T ...] [--limit N] [--fresh]

Each mutant of a changed line of the package (cosmic-ray's operators) is written to the
module's file on disk, the tests that cover the module run against it (pytest -x -n 0, a
timeout each), and the file is put back. The session resumes where it stopped when the same
command runs again."""

from __future__ import annotations

import argparse
import difflib
import fcntl
import json
import os
import signal
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

try:
    import cosmic_ray  # noqa: F401
    import coverage  # noqa: F401
except ImportError as missing:
    sys.exit(f"mutation: {missing.name} is not installed here: pip install -e '.[mutation]'")

from applying import Journal, run_tests  # noqa: E402
from changes import Refused, changed_lines, every_line, git, resolve_base  # noqa: E402
from cosmic_ray.mutating import mutate_code  # noqa: E402
from cosmic_ray.plugins import get_operator  # noqa: E402
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult  # noqa: E402
from covering import CoverageMap, guess_tests, record, statement_lines  # noqa: E402
from scoring import NOT_COVERED, report  # noqa: E402
from session import Session  # noqa: E402


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count")
    return int(text)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    return seconds


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python tests/mutation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the commit, tag or branch the round started from")
    parser.add_argument("--hours", type=_seconds, default=24,
                        help="without --base: the last commit older than this many hours (default 24)")
    parser.add_argument("--tests", action="append", default=[],
                        help="pytest's test files or node ids to cover the modules with (repeatable; "
                             "default: the test files that name a changed module)")
    parser.add_argument("--modules", nargs="+", default=[], metavar="GLOB",
                        help="only the changed modules that match one of these (scripts/gpu_cache/config/*)")
    parser.add_argument("--every-line", action="store_true",
                        help="every line of the modules --modules names, changed or not")
    parser.add_argument("--timeout", type=_seconds,
                        help="seconds a mutant's tests may run (default: 3x their covering run, +60)")
    parser.add_argument("--limit", type=_count, help="run at most this many mutants now (0: report only)")
    parser.add_argument("--all-operators", action="store_true",
                        help="every replacement cosmic-ray has, not only an operator's nearest")
    parser.add_argument("--session", type=Path, default=REPO / ".mutation", help="the session's folder")
    parser.add_argument("--fresh", action="store_true", help="start the session over")
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("--package", default="scripts/gpu_cache", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def in_git_dir(repo: Path, name: str) -> Path:
    """``name`` in the checkout's own git folder (a worktree's is its own)."""
    return repo / git(repo, "rev-parse", "--git-path", name).strip()


def hold_checkout(repo: Path) -> int:
    """A lock on the checkout for as long as this process lives: a second run would take the
    first's mutant for the original (and keep it), or put a file back under the first's tests."""
    path = in_git_dir(repo, "mutation.lock")
    held = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise Refused(f"another mutation run holds {repo}: wait for it, or stop it") from None
    return held


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def prepare(args: argparse.Namespace, session: Session) -> CoverageMap:
    """The session (made, or checked for resuming) and its map of which tests ran which lines."""
    if args.every_line and not args.modules:
        raise Refused("--every-line needs --modules")
    if args.every_line:
        base, found = "every line", every_line(args.repo, args.package)
    else:
        base = resolve_base(args.repo, args.base, args.hours)
        found = changed_lines(args.repo, base, args.package)
    changed = {module: lines for module, lines in found.items()
               if not args.modules or any(fnmatch(module, glob) for glob in args.modules)}
    if not changed:
        since = "" if args.every_line else f" changed since {base[:12]}"
        matching = " matches --modules" if args.modules else ""
        raise Refused(f"no module under {args.package}{since}{matching}")
    tests = args.tests or guess_tests(args.repo, list(changed))
    if not tests:
        raise Refused("no test file names a changed module: give --tests")
    wanted = {"base": base, "changed": {m: sorted(lines) for m, lines in changed.items()},
              "tests": tests, "all_operators": args.all_operators}
    lines = sum(len(found) for found in changed.values())
    label = "every line" if args.every_line else f"base {base[:12]}"
    print(f"{label}: {lines} line(s) to mutate in {len(changed)} module(s): {', '.join(changed)}")
    if session.exists() and not args.fresh:
        session.check(wanted, args.repo)
        print(f"resuming the session in {session.folder}")
    else:
        to_run, skipped = session.create(wanted, args.repo)
        print(f"{to_run} mutants to run; skipped: "
              + (", ".join(f"{count} {reason}" for reason, count in skipped.items()) or "none"))
    saved = session.folder / "map.json"
    if saved.exists():
        return CoverageMap.load(saved)
    print(f"covering run of {' '.join(tests)}", flush=True)
    log = session.folder / "covering.log"
    found = record(args.repo, session.folder, args.package, tests, log)
    if not any(test["outcome"] == "passed" for test in found.tests.values()):
        raise Refused(f"no test passed in the covering run: {log} says why")
    for test in found.failing():
        print(f"  fails unmutated, left out: {test}")
    found.save(saved)
    return found


def run_one(args, item, found: CoverageMap, journal: Journal) -> WorkResult:
    """One mutant: on disk, its module's tests run, the file put back."""
    mutation = item.mutations[0]
    module = str(mutation.module_path)
    source = (args.repo / module).read_text()
    operator = get_operator(mutation.operator_name)(**mutation.operator_args)
    mutated = mutate_code(source, operator, mutation.occurrence)
    if mutated is None:
        return WorkResult(worker_outcome=WorkerOutcome.NO_TEST)
    diff = "\n".join(difflib.unified_diff(source.splitlines(), mutated.splitlines(), module, module, n=0,
                                         lineterm=""))
    tests = found.tests_for(module, statement_lines(source, mutation.start_pos[0], mutation.end_pos[0]))
    if not tests:
        return WorkResult(worker_outcome=WorkerOutcome.NORMAL, test_outcome=TestOutcome.SURVIVED,
                          output=NOT_COVERED, diff=diff)
    timeout = args.timeout or 3 * found.seconds(tests) + 60
    with journal.mutant(args.repo, module, mutated):
        run = run_tests(args.repo, tests, timeout, args.session / "mutant.log")
    outcome = (TestOutcome.KILLED if run.killed else TestOutcome.SURVIVED if run.ran
               else TestOutcome.INCOMPETENT)
    detail = f"{run.detail} ({len(tests)} test(s) selected, {run.seconds:.1f} s)"
    return WorkResult(worker_outcome=WorkerOutcome.NORMAL, test_outcome=outcome,
                      output=f"{detail}\n{run.output}", diff=diff)


def run_pending(args: argparse.Namespace, session: Session, found: CoverageMap, journal: Journal,
                start: float) -> None:
    """The mutants not run yet (at most --limit of them), a line each as it ends; then the report."""
    with session.open() as db:
        pending = session.pending(db)
        todo = pending[:args.limit] if args.limit is not None else pending
        for number, item in enumerate(todo, 1):
            mutation = item.mutations[0]
            where = f"{mutation.module_path}:{mutation.start_pos[0]} {mutation.operator_name}"
            print(f"[{number}/{len(todo)} {time.monotonic() - start:6.0f} s] {where}", end=" ", flush=True)
            result = run_one(args, item, found, journal)
            db.set_result(item.job_id, result)
            mutated = next((line[1:].strip() for line in (result.diff or "").splitlines()
                            if line.startswith("+") and not line.startswith("+++")), "")
            outcome = (result.output or "no mutation possible").splitlines()[0]
            print(f"'{mutated[:60]}' -> {outcome}", flush=True)
        made_for = json.loads(session.made_for.read_text())
        made_for["seconds"] = made_for.get("seconds", 0) + time.monotonic() - start
        session.made_for.write_text(json.dumps(made_for, indent=1))
        report(db, made_for, len(pending) - len(todo), made_for["seconds"], args.repo,
               args.session / "report.json")


def main(argv: list[str]) -> int:
    args = arguments(argv)
    args.session, args.repo = args.session.resolve(), args.repo.resolve()
    os.chdir(args.repo)  # cosmic-ray's database names the modules relative to it
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    session = Session(args.session)
    start = time.monotonic()
    try:
        hold_checkout(args.repo)  # held until this process ends
        journal = Journal(in_git_dir(args.repo, "mutation-pristine"))
        for path in journal.recover(args.repo):
            print(f"put back {path}, which a killed run had left mutated")
        run_pending(args, session, prepare(args, session), journal, start)
    except Refused as refused:
        print(f"mutation: {refused}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted: every file is as it was; the same command goes on from here ({args.session})",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
