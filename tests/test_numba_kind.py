"""Numba's on-disk cache as a kind (docs/kinds.md's recipe, both halves): with gpu-cache's
environment a ``@njit(cache=True)`` function compiled by one process is served to the next from
``$NUMBA_CACHE_DIR`` under the cache root; the startup hook records the miss, then the hit, by
the key gpu-cache's inventory gives the entry; prune removes it whole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flight_jobs import job_env
from gpu_cache.core import kinds
from helpers import records

pytest.importorskip("numba")

KIND = kinds.named("numba")
#: A job: one cached function, called with two signatures (two overloads of one entry).
JOB = '''
import json, sys
import numba

@numba.njit(cache=True)
def triangle(n):
    total = 0
    for i in range(n):
        total += i
    return total

print(json.dumps({"int": triangle(int(sys.argv[1])), "float": triangle(float(sys.argv[1]))}))
'''


def run(tmp_path: Path, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, str(tmp_path / "job.py"), "100"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_process_hits_what_the_first_compiled(tmp_path):
    root = tmp_path / "root"
    (tmp_path / "job.py").write_text(JOB)
    env = job_env(root)
    assert env["NUMBA_CACHE_DIR"] == str(root / "numba")
    assert run(tmp_path, env) == run(tmp_path, env) == {"int": 4950, "float": 4950.0}
    first, second = records(root, "numba")
    assert (first["misses"], first["hits"], second["misses"], second["hits"]) == (2, 0, 0, 2)
    (entry,) = KIND.scan(KIND.folder(root), grace_seconds=0.0)
    assert entry.problem is None and entry.name.endswith("triangle")
    assert set(second["hit_keys"]) == {entry.key} and {m["key"] for m in first["missed"]} == {entry.key}
    assert len(KIND.files(entry)) == 3  # the index and one data file per overload
    KIND.remove(KIND.folder(root), entry)
    assert KIND.scan(KIND.folder(root)) == []
    third = run(tmp_path, env) and records(root, "numba")[-1]
    assert (third["misses"], third["hits"]) == (2, 0)  # removed whole: compiled again
