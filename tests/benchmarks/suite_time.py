"""Benchmark: where the suite's time goes, per test file: wall seconds and CPU seconds.

As a pytest plugin, it appends one JSON line per test (setup, call and teardown together) to
``$SUITE_TIME_OUT-<worker>.jsonl``: the test's wall seconds and the CPU seconds of its worker
and of every child process the worker waited for (a test's CLI runs, Snakemake and their jobs;
not the daemons of a session's cluster, which no test waits for)::

    SUITE_TIME_OUT=/tmp/suite PYTHONPATH=tests/benchmarks python -m pytest -p suite_time

As a script, it sums those lines by test file, the largest CPU first::

    python tests/benchmarks/suite_time.py /tmp/suite [--top 30]

Wall seconds of tests that ran side by side add up to more than the run took; CPU seconds do
not, and are less moved by how many workers share the machine.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import resource
import sys
import time

import pytest


def _cpu_seconds() -> tuple[float, float]:
    """This process's CPU seconds, and its waited-for children's."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    own, children = _cpu_seconds()
    started = time.monotonic()
    try:
        return (yield)
    finally:
        own_after, children_after = _cpu_seconds()
        out = os.environ.get("SUITE_TIME_OUT")
        if out:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with open(f"{out}-{worker}.jsonl", "a") as lines:
                lines.write(json.dumps({"id": item.nodeid, "wall": time.monotonic() - started,
                                        "self": own_after - own,
                                        "children": children_after - children}) + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", help="the SUITE_TIME_OUT of the run")
    parser.add_argument("--top", type=int, default=30, help="files to print (default 30)")
    args = parser.parse_args(argv)
    cpu, wall, count = collections.Counter(), collections.Counter(), collections.Counter()
    for path in glob.glob(f"{glob.escape(args.prefix)}-*.jsonl"):
        with open(path) as lines:
            for line in lines:
                test = json.loads(line)
                where = test["id"].split("::")[0]
                cpu[where] += test["self"] + test["children"]
                wall[where] += test["wall"]
                count[where] += 1
    if not count:
        print(f"suite_time: no {args.prefix}-*.jsonl: run the suite with SUITE_TIME_OUT={args.prefix}",
              file=sys.stderr)
        return 2
    print(f"{sum(count.values())} tests: {sum(cpu.values()):.0f} CPU-s, {sum(wall.values()):.0f} wall-s")
    print(f"{'CPU-s':>8} {'wall-s':>8} {'tests':>6}  file")
    for where, seconds in cpu.most_common(args.top):
        print(f"{seconds:8.1f} {wall[where]:8.1f} {count[where]:6d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
