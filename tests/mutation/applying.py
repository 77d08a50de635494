"""A mutant on disk, and the tests run against it: the module's file is replaced by the mutant
(so that every process the tests start, the CLI, Snakemake's jobs and the startup hook in each,
imports it), and put back afterwards, whatever ends the run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: What the test processes must not inherit: a covering run's coverage start-up and context.
_NOT_INHERITED = ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG", "MUTATION_TEST_ID")
#: pytest's exit codes that mean the tests could not run as asked (a usage error, no test
#: collected): a fault of the selection, not a kill.
_NOT_RUN = {4: "could not run: pytest refused its arguments", 5: "could not run: pytest collected no test"}
#: What pytest says (exit 4) where a conftest raised at import: with a mutant of a module the
#: conftest imports (the hook's names), every test fails, which is a kill.
_CONFTEST_FAILED = "ImportError while loading conftest"


def _write(path: Path, data: bytes, mode: int) -> None:
    """``data`` as ``path``, replaced at once (a process that starts meanwhile reads the old
    file or the new one, never a part)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _drop_bytecode(path: Path) -> None:
    """The module's compiled copies: a mutant's bytecode must not outlive it (Python trusts a
    .pyc whose recorded mtime second and size match the source, and a restored file can match
    the mutant's), nor the original's serve the mutant."""
    for compiled in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        with contextlib.suppress(FileNotFoundError):
            compiled.unlink()


class Journal:
    """The pristine copy of each file while a mutant is on it, in ``folder`` (one per checkout,
    whatever the session): a run killed past every handler (SIGKILL, a lost machine) is undone
    by the next one on the checkout, first."""

    def __init__(self, folder: Path):
        self.folder = folder

    def recover(self, repo: Path) -> list[str]:
        """Put back every file a killed run left mutated; the paths put back."""
        restored = []
        for record in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else ():
            saved = json.loads(record.read_text())
            pristine = record.with_suffix(".orig")
            if pristine.exists():
                self._restore(repo / saved["path"], pristine.read_bytes(), saved)
                restored.append(saved["path"])
            pristine.unlink(missing_ok=True)
            record.unlink()
        return restored

    @staticmethod
    def _restore(path: Path, original: bytes, saved: dict) -> None:
        _write(path, original, saved["mode"])
        os.utime(path, ns=(saved["atime_ns"], saved["mtime_ns"]))
        _drop_bytecode(path)

    @contextlib.contextmanager
    def mutant(self, repo: Path, module: str, mutated: str) -> Iterator[None]:
        """``module`` (relative to ``repo``) holds ``mutated`` within the block; after it, its
        original bytes, mode and times, and no bytecode of either."""
        path = repo / module
        original, status = path.read_bytes(), path.stat()
        saved = {"path": module, "mode": status.st_mode & 0o7777, "atime_ns": status.st_atime_ns,
                 "mtime_ns": status.st_mtime_ns}
        self.folder.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w.-]", "_", module)
        pristine, record = self.folder / f"{name}.orig", self.folder / f"{name}.json"
        _write(pristine, original, 0o600)
        _write(record, json.dumps(saved).encode(), 0o600)
        try:
            _write(path, mutated.encode(), saved["mode"])
            _drop_bytecode(path)
            yield
        finally:
            self._restore(path, original, saved)
            record.unlink()
            pristine.unlink()


@dataclass
class TestRun:
    killed: bool
    #: one line: what killed it (the first failing test, a timeout, a signal) or why it did not run
    detail: str
    seconds: float
    output: str
    ran: bool = True


def _stop_group(process: subprocess.Popen) -> None:
    """The test process and every process of its group (its jobs, their children)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _first_failure(output: str) -> str:
    found = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", output, re.MULTILINE)
    return found.group(1) if found else "the tests"


def run_tests(repo: Path, tests: list[str], timeout: float, log: Path) -> TestRun:
    """``tests`` in one pytest process (``-x``: the first failure ends it), in a process group
    of its own, stopped whole after ``timeout`` s or when this process is interrupted."""
    env = {key: value for key, value in os.environ.items() if key not in _NOT_INHERITED}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    start = time.monotonic()
    with log.open("w+") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-x", "-n", "0", "-q", "-p", "no:cacheprovider", *tests],
            cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_group(process)
            code = None
        except BaseException:
            _stop_group(process)
            raise
        _stop_group(process)  # what the tests left running in the group
        out.seek(0)
        output = out.read()[-4000:]
    seconds = time.monotonic() - start
    if code is None:
        return TestRun(True, f"timeout: still running after {timeout:.0f} s", seconds, output)
    if code == 4 and _CONFTEST_FAILED in output:  # the mutant breaks what conftest imports
        return TestRun(True, "killed: the tests' conftest could not import it", seconds, output)
    if code in _NOT_RUN:
        return TestRun(False, _NOT_RUN[code], seconds, output, ran=False)
    if code < 0:
        return TestRun(True, f"killed: pytest died of signal {-code}", seconds, output)
    if code == 0:
        return TestRun(False, f"survived: {len(tests)} test(s) passed", seconds, output)
    return TestRun(True, f"killed: {_first_failure(output)} failed", seconds, output)
