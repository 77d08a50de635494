"""Which tests cover which lines: the candidate tests run once, unmutated, under coverage with a
context per test (in-process and in every child process), and the map read from it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import coverage
from changes import Refused
from coverage.parser import PythonParser

HERE = Path(__file__).resolve().parent

#: Coverage's process start-up reads this in every Python process started with
#: COVERAGE_PROCESS_START (coverage installs the .pth file that does it); the context is the
#: test that started the process (mutation_contexts sets the variable).
RC = """\
[run]
data_file = {data}
parallel = true
source = {source}
context = ${{MUTATION_TEST_ID}}
disable_warnings = no-data-collected, module-not-imported, module-not-measured
"""


def guess_tests(repo: Path, modules: list[str]) -> list[str]:
    """Test files that name one of ``modules`` (its dotted name; for a piece of the startup hook
    the name the hook and tests/harness give it; for a subcommand's module, the subcommand
    given to ``run_cli``): a first guess, which the covering run checks. Tests that reach a
    module only through another's code, a job or the workflow are not found by it."""
    patterns = []
    for module in modules:
        parts = module.removeprefix("scripts/").removesuffix(".py").removesuffix("/__init__").split("/")
        if len(parts) == 1:  # the package itself: every test names it
            continue
        names = [re.escape(".".join(parts))]
        if "gpu_cache_hook" in parts:
            piece = parts[parts.index("gpu_cache_hook") + 1:]
            quoted = rf"[\"']{re.escape('.'.join(piece))}[\"']"  # hook_piece("tier.files")
            names += [re.escape(".".join(["gpu_cache_hook", *piece])), quoted]
        patterns.append(r"(?<![\w.])(" + "|".join(names) + r")(?![\w])")
        parent, stem = ".".join(parts[:-1]), parts[-1]
        patterns.append(rf"from {re.escape(parent)} import [^\n]*\b{re.escape(stem)}\b")
        if parts[-2:-1] == ["commands"]:
            patterns.append(rf"run_cli(_here)?\(\s*[\"']({stem}|{stem.replace('_', '-')})[\"']")
    if not patterns:
        return []
    pattern = re.compile("|".join(patterns))
    return sorted(str(path.relative_to(repo)) for path in (repo / "tests").glob("test_*.py")
                  if pattern.search(path.read_text(errors="replace")))


@dataclass
class CoverageMap:
    """lines: module -> each line a process ran -> the tests whose processes ran it (none for a
    line run only outside a test: an import while collecting); tests: node id -> its outcome,
    seconds and shared fixtures in the covering run."""

    lines: dict[str, dict[int, list[str]]]
    tests: dict[str, dict]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"lines": self.lines, "tests": self.tests}, sort_keys=True))

    @classmethod
    def load(cls, path: Path) -> CoverageMap:
        data = json.loads(path.read_text())
        lines = {module: {int(n): t for n, t in by_line.items()} for module, by_line in data["lines"].items()}
        return cls(lines, data["tests"])

    def failing(self) -> list[str]:
        return sorted(test for test, record in self.tests.items() if record["outcome"] == "failed")

    def tests_for(self, module: str, span: set[int]) -> list[str]:
        """The passing tests that ran ``module``, with those sharing a wider fixture with one of
        them; none where no process ran a statement of ``span`` (the mutated lines, as
        coverage numbers them: each statement by its first line). The tests that ran ``span``
        come first, each group fastest first."""
        by_line = self.lines.get(module, {})
        if not span & set(by_line):
            return []
        passed = {test for test, record in self.tests.items() if record["outcome"] == "passed"}
        covering = {test for tests in by_line.values() for test in tests} & passed
        shared = {fixture for test in covering for fixture in self.tests[test]["shared"]}
        covering |= {test for test in passed if shared.intersection(self.tests[test]["shared"])}
        on_span = {test for line in span for test in by_line.get(line, ())} & covering

        def order(tests: set[str]) -> list[str]:
            return sorted(tests, key=lambda test: (self.tests[test].get("seconds", 0), test))

        return order(on_span) + order(covering - on_span)

    def seconds(self, tests: list[str]) -> float:
        return sum(self.tests[test].get("seconds", 0) for test in tests)


def statement_lines(source: str, first: int, last: int) -> set[int]:
    """The lines coverage records for lines ``first`` to ``last``: the first line of each
    statement they belong to (a statement over several lines is recorded at its first)."""
    parser = PythonParser(text=source)
    parser.parse_source()
    return {parser.first_line(line) for line in range(first, last + 1)}


def record(repo: Path, folder: Path, package: str, tests: list[str], log: Path) -> CoverageMap:
    """Run ``tests`` once, unmutated, one process, under coverage with a context per test (its
    output in ``log``), and read the map of ``package``'s lines from it."""
    data = folder / "coverage"
    data.mkdir(exist_ok=True)
    for old in data.glob(".coverage*"):
        old.unlink()
    rc = folder / "coveragerc"
    rc.write_text(RC.format(data=data / ".coverage", source=repo / package))
    outcomes = folder / "covering-tests.json"
    env = dict(os.environ, COVERAGE_PROCESS_START=str(rc),
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    env.pop("MUTATION_TEST_ID", None)
    probe = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True)
    if probe.returncode != 0 or not list(data.glob(".coverage.*")):
        raise Refused("coverage does not start in the processes a test starts here (its .pth file "
                           "is missing): the map would leave out what the jobs run")
    for old in data.glob(".coverage*"):
        old.unlink()
    start = time.monotonic()
    with log.open("w") as out:
        subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider",
                        "-p", "mutation_contexts", f"--mutation-record={outcomes}", *tests],
                       cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    print(f"covering run: {len(tests)} test argument(s) in {time.monotonic() - start:.0f} s "
          f"(output: {log})", flush=True)
    if not outcomes.exists():
        raise Refused(f"the covering run recorded no test: {log} says why")
    combined = coverage.Coverage(config_file=str(rc), data_file=str(data / ".coverage"))
    combined.combine(keep=False)
    combined.save()
    measured = combined.get_data()
    lines = {}
    for path in measured.measured_files():
        contexts = measured.contexts_by_lineno(path)
        relative = os.path.relpath(path, repo)
        lines[relative] = {line: sorted(set(found) - {""}) for line, found in contexts.items()}
    return CoverageMap(lines, json.loads(outcomes.read_text()))
