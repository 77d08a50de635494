"""A pytest plugin for the covering run (``-p mutation_contexts``): coverage records each test's
lines under its node id, in this process and in every process it starts (coverage's process
start-up reads the ``context`` of the rc file, ``${MUTATION_TEST_ID}``, which this sets), and
it writes each test's outcome, time and shared fixtures to ``--mutation-record``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import coverage
import pytest

#: Not GPU_CACHE_*: the tests' clean environment keeps it, so the jobs a test starts carry it.
CONTEXT_VARIABLE = "MUTATION_TEST_ID"

_tests: dict[str, dict] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--mutation-record", help="where the covering run writes what each test did")


def _shared_fixtures(item: pytest.Item, root: Path) -> list[str]:
    """The repository's fixtures of a wider scope than the test that ``item`` uses: what such a
    fixture runs is recorded under the first test that set it up, and may decide the others."""
    info = getattr(item, "_fixtureinfo", None)
    shared = []
    for name in getattr(item, "fixturenames", ()):
        found = info.name2fixturedefs.get(name) if info else None
        if not found or found[-1].scope == "function":
            continue
        source = Path(found[-1].func.__code__.co_filename)
        if root in source.parents and "site-packages" not in source.parts:
            shared.append(f"{source.relative_to(root)}::{name}")
    return sorted(shared)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    measuring = coverage.Coverage.current()
    os.environ[CONTEXT_VARIABLE] = item.nodeid
    if measuring is not None:
        measuring.switch_context(item.nodeid)
    record = _tests.setdefault(item.nodeid, {"outcome": "passed"})
    record["shared"] = _shared_fixtures(item, Path(str(item.config.rootpath)))
    start = time.monotonic()
    try:
        yield
    finally:
        record["seconds"] = round(time.monotonic() - start, 3)
        os.environ.pop(CONTEXT_VARIABLE, None)
        if measuring is not None:
            measuring.switch_context("")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record = _tests.setdefault(report.nodeid, {"outcome": "passed"})
    if report.failed:
        record["outcome"] = "failed"
    elif report.skipped and record["outcome"] == "passed":
        record["outcome"] = "skipped"


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = session.config.getoption("--mutation-record")
    if target:
        Path(target).write_text(json.dumps(_tests, indent=1, sort_keys=True))
