"""The mutation tool (tests/mutation, docs/testing.md) on a small repository of its own: it
mutates only the lines changed since the base, its mutants reach the processes the tests start,
it reports survivors and the lines no test ran, and it puts every file back, whatever stops it.
Skipped where the `mutation` extra is not installed (CI does not install it)."""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import REPO, clean_environ, read_json

pytest.importorskip("cosmic_ray")
pytest.importorskip("coverage")

pytestmark = pytest.mark.slow

TOOL = REPO / "tests" / "mutation"
MODULE = "scripts/toypkg/toy.py"

BEFORE = '''\
LIMIT = 10


def limited(x):
    return min(x, LIMIT)
'''

#: Each changed function is met by the tests in one way: checked in this process (double),
#: checked only in a child process (in_child), run but not checked (unchecked), never run (never).
AFTER = BEFORE + '''

def double(x):
    return x * 2


def in_child(x):
    return x + 1


def unchecked(x):
    return x - 1


def never(x):
    return x < 3
'''

TESTS = '''\
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from toypkg import toy


def test_limited():
    assert toy.limited(12) == 10


def test_double():
    blocker = os.environ.get("TOY_BLOCK")
    if blocker:  # the interrupt tests: say so, then wait to be stopped
        Path(blocker).write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.1)
    assert toy.double(3) == 6


def test_in_child():
    child = subprocess.run([sys.executable, "-c", "from toypkg import toy; print(toy.in_child(1))"],
                           env=dict(os.environ, PYTHONPATH="scripts"), capture_output=True, text=True)
    assert child.stdout.strip() == "2", child.stderr


def test_unchecked():
    toy.unchecked(1)
'''

#: As the real conftest does: the package compiled once per run (a mutant's bytecode with it).
CONFTEST = '''\
import compileall


def pytest_configure(config):
    compileall.compile_dir("scripts/toypkg", quiet=2)
'''


#: One survivor accepted, matched by its lines, not its line number.
ACCEPTED = '''\
[[accepted]]
file = "scripts/toypkg/toy.py"
operator = "core/NumberReplacer"
original = "    return x - 1"
mutant = "return x - 0"
reason = "accepted here to see it marked"
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def toy(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose base commit has ``limited``, and whose next commit adds four functions
    and their tests: (its folder, the base commit)."""
    repo = tmp_path / "toy"
    (repo / "scripts" / "toypkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["scripts"]\n')
    (repo / "scripts" / "toypkg" / "__init__.py").write_text("")
    (repo / MODULE).write_text(BEFORE)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / MODULE).write_text(AFTER)
    (repo / "tests" / "conftest.py").write_text(CONFTEST)
    (repo / "tests" / "test_toy.py").write_text(TESTS)
    (repo / "tests" / "mutation").mkdir()
    (repo / "tests" / "mutation" / "accepted.toml").write_text(ACCEPTED)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "four functions")
    return repo, base


def tool_command(repo: Path, base: str, *args: str) -> list[str]:
    return [sys.executable, str(TOOL), "--repo", str(repo), "--package", "scripts/toypkg",
            "--session", str(repo.parent / "session"), "--base", base, "--tests", "tests", *args]


def run_tool(repo: Path, base: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(tool_command(repo, base, *args), env=clean_environ(**env), capture_output=True,
                          text=True, timeout=600)


def line_of(text: str) -> int:
    return AFTER.splitlines().index(text) + 1


def assert_pristine(repo: Path, mtime_ns: int) -> None:
    """toy.py as committed, with its time, and no compiled copy of anything else."""
    path = repo / MODULE
    assert path.read_text() == AFTER
    assert path.stat().st_mtime_ns == mtime_ns
    for compiled in (path.parent / "__pycache__").glob("toy.*.pyc"):
        assert marshal.loads(compiled.read_bytes()[16:]) == compile(AFTER, str(path), "exec"), compiled


def test_changed_lines_are_mutated_and_each_outcome_is_reported(toy, mtime):
    repo, base = toy
    result = run_tool(repo, base)
    assert result.returncode == 0, result.stdout + result.stderr
    report = read_json(repo.parent / "session" / "report.json")
    by_line: dict[int, set[str]] = {}
    for mutant in report["mutants_run"]:
        by_line.setdefault(mutant["line"], set()).add(mutant["outcome"])
    # Only the changed lines; limited's (unchanged since the base) not at all.
    assert by_line == {line_of("    return x * 2"): {"killed"},
                       # killed only through the child process: the mutant was on disk
                       line_of("    return x + 1"): {"killed"},
                       line_of("    return x - 1"): {"survived"},
                       line_of("    return x < 3"): {"not covered"}}
    survivors = {(m["line"], m["mutated"].strip()): m["accepted"] for m in report["survivors"]}
    assert survivors[line_of("    return x - 1"), "return x + 1"] is None
    assert survivors[line_of("    return x - 1"), "return x - 0"] == "accepted here to see it marked"
    assert report["accepted"] == 1
    assert report["killed"] + report["survived"] == report["mutants"] > 0
    assert f"score: {report['killed']} of {report['mutants']} killed" in result.stdout
    survivor = f"{MODULE}:{line_of('    return x - 1')} core/ReplaceBinaryOperator_Sub_Add (survived)"
    assert survivor in result.stdout
    assert "core/NumberReplacer (accepted: accepted here to see it marked)" in result.stdout
    assert_pristine(repo, mtime)
    # Resumed, the finished session runs nothing again.
    again = run_tool(repo, base)
    assert again.returncode == 0 and "[1/" not in again.stdout, again.stdout + again.stderr


def test_a_mutant_that_breaks_the_conftests_own_import_is_killed(toy):
    """A changed line that the tests' conftest imports (as the real one imports the hook's
    names): pytest stops at the conftest with every mutant of it (exit 4), which kills it,
    and says so; it is no fault of the selection."""
    repo, _ = toy
    head = git(repo, "rev-parse", "HEAD")
    (repo / MODULE).write_text(AFTER + "\n\nREADY = 1\n")
    (repo / "tests" / "conftest.py").write_text(
        CONFTEST + "\n\nfrom toypkg import toy\n\nif toy.READY != 1:\n    raise ValueError('not ready')\n")
    git(repo, "commit", "-qam", "a flag the conftest checks")
    result = run_tool(repo, head)
    assert result.returncode == 0, result.stdout + result.stderr
    report = read_json(repo.parent / "session" / "report.json")
    outcomes = [(m["outcome"], m["detail"].split(" (")[0]) for m in report["mutants_run"]]
    assert outcomes == [("killed", "killed: the tests' conftest could not import it")] * 2, outcomes


def wait_for(path: Path, seconds: float = 120) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.05)
    return path.read_text()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def mtime(toy) -> int:
    """The time of toy.py as committed, before the tool touched it."""
    return (toy[0] / MODULE).stat().st_mtime_ns


@pytest.fixture
def blocked(toy, mtime, tmp_path) -> Iterator[tuple[subprocess.Popen, int]]:
    """The tool with double's first mutant on disk and its tests waiting: (the tool, the pid of
    the test process, which leads a process group of its own). The session is made first, its
    covering run not blocked. Whatever the test leaves running is stopped after it."""
    repo, base = toy
    made = run_tool(repo, base, "--modules", "*toy.py", "--limit", "0")
    assert made.returncode == 0, made.stdout + made.stderr
    blocker = tmp_path / "blocked"
    tool = subprocess.Popen(tool_command(repo, base, "--modules", "*toy.py"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=clean_environ(TOY_BLOCK=str(blocker)))
    try:
        pid = int(wait_for(blocker))
        assert (repo / MODULE).read_text() != AFTER  # the mutant is on disk
        yield tool, pid
    finally:
        for stop in (tool.kill, lambda: os.killpg(pid, signal.SIGKILL)):
            with contextlib.suppress(ProcessLookupError, NameError):
                stop()
        tool.wait(timeout=60)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_puts_the_file_back_and_stops_its_tests(toy, mtime, blocked, signum):
    repo, base = toy
    tool, pid = blocked
    tool.send_signal(signum)
    output, _ = tool.communicate(timeout=60)
    assert tool.returncode == 130, output
    assert "every file is as it was" in output
    assert_pristine(repo, mtime)
    deadline = time.monotonic() + 30
    while alive(pid):  # the tests were stopped, not left running against the restored file
        assert time.monotonic() < deadline, f"test process {pid} still runs"
        time.sleep(0.05)
    # The interrupted mutant was not recorded: the same command runs it.
    again = run_tool(repo, base, "--modules", "*toy.py", "--limit", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    first = next(line for line in again.stdout.splitlines() if line.startswith("[1/"))
    assert f"toy.py:{line_of('    return x * 2')} " in first


def test_a_second_run_on_the_checkout_is_refused_and_touches_nothing(toy, blocked):
    repo, base = toy
    mutant = (repo / MODULE).read_text()
    second = run_tool(repo, base, "--modules", "*toy.py", "--session", str(repo.parent / "other"))
    assert second.returncode == 2, second.stdout + second.stderr
    assert second.stderr == f"mutation: another mutation run holds {repo}: wait for it, or stop it\n"
    assert (repo / MODULE).read_text() == mutant  # the first run's mutant, under its tests


def test_a_killed_run_is_undone_by_the_next(toy, mtime, blocked):
    repo, base = toy
    tool, pid = blocked
    tool.kill()  # no handler runs
    tool.communicate(timeout=60)
    os.killpg(pid, signal.SIGKILL)  # its tests, in a session of their own
    assert (repo / MODULE).read_text() != AFTER
    again = run_tool(repo, base, "--modules", "*toy.py", "--limit", "0")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"put back {MODULE}, which a killed run had left mutated" in again.stdout
    assert_pristine(repo, mtime)


def test_a_mutant_whose_tests_hang_is_killed_by_the_timeout_and_said_so(toy, mtime, tmp_path):
    repo, base = toy
    made = run_tool(repo, base, "--modules", "*toy.py", "--limit", "0")
    assert made.returncode == 0, made.stdout + made.stderr
    blocker = tmp_path / "blocked"
    hung = run_tool(repo, base, "--modules", "*toy.py", "--limit", "1", "--timeout", "5",
                    TOY_BLOCK=str(blocker))
    assert hung.returncode == 0, hung.stdout + hung.stderr
    assert "-> timeout: still running after 5 s" in hung.stdout
    assert not alive(int(blocker.read_text()))  # its process group was stopped
    report = read_json(repo.parent / "session" / "report.json")
    assert report["killed"] == report["killed_by_timeout"] == report["mutants"] == 1
    assert "1 of 1 killed (100.0%); 1 of them by timeout" in hung.stdout
    assert_pristine(repo, mtime)


def test_wrong_arguments_and_a_changed_module_are_one_line(toy):
    repo, base = toy
    wrong = run_tool(repo, "no-such-ref")
    assert wrong.returncode == 2 and wrong.stderr.startswith("mutation: git rev-parse"), wrong.stderr
    assert len(wrong.stderr.splitlines()) == 1
    made = run_tool(repo, base, "--limit", "0")
    assert made.returncode == 0, made.stdout + made.stderr
    (repo / MODULE).write_text(AFTER.replace("x * 2", "x * 3"))  # the same lines, edited
    changed = run_tool(repo, base, "--limit", "0")
    assert changed.returncode == 2, changed.stdout + changed.stderr
    session = repo.parent / "session"
    assert changed.stderr == (f"mutation: {MODULE} changed since the session in {session} began: "
                              "--fresh starts it over\n")
    assert len(changed.stderr.splitlines()) == 1
