"""Single-flight of Triton's files outside groups (issue 26), in real processes on CPU: N jobs
lined up on one empty cache that all need Triton's CUDA utils library (built from the wheel's
``driver.c`` with a real C compiler, through ``triton.runtime.build``) or one autotune result
(Triton's own ``Autotuner.check_disk_cache``, with a benchmark that stands in for the GPU)
build it or benchmark once, and the others load the file; with single-flight off every one
does it; a leader whose benchmark fails releases its lock at once. The jobs are
tests/fixtures/triton_files.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_cache.config.settings import settings_from
from gpu_cache.jobenv import env
from helpers import REPO, clean_environ

sys.path.insert(0, str(REPO / "tests" / "fixtures"))
import triton_files

JOB = REPO / "tests" / "fixtures" / "triton_files.py"
N = 4
BENCH_SECONDS = "1"
COUNTED = {"launcher": "cc", "autotune": "bench"}
OTHER_TRITON = os.environ.get("GPU_CACHE_TEST_OTHER_TRITON")


def job_env(root: Path, tools: Path, single_flight: dict) -> dict[str, str]:
    """A job's environment as gpu-cache exports it for ``root``, with the counting compiler."""
    base = clean_environ(TRITON_DEFAULT_FP_FUSION="1", **triton_files.prepare(tools))
    exports = env.resolve(settings_from({"single_flight": single_flight}, cache_root=str(root)), base)
    return env.job_environ(exports, base)


def start_together(tmp_path: Path, what: str, environ: dict[str, str], tools: Path,
                   n: int = N, python: str = sys.executable) -> list[dict]:
    """``n`` jobs that import Triton, wait for each other and start at one instant; their
    JSON lines."""
    sync = tmp_path / f"sync-{what}-{time.monotonic_ns()}"
    sync.mkdir()
    go = sync / "go"
    procs = [subprocess.Popen([python, str(JOB), str(sync / f"ready{i}"), str(go), what, str(tools),
                               BENCH_SECONDS], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(n)]
    deadline = time.monotonic() + 120
    while len(list(sync.glob("ready*"))) < n and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.touch()
    done = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert all(rc == 0 for rc, _out, _err in done), [err[-2000:] for _rc, _out, err in done]
    return [json.loads(out.strip().splitlines()[-1]) for _rc, out, _err in done]


def flights(root: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((root / "records").glob("*.json"))]
    return [r["triton"]["single_flight"] for r in found if "triton" in r]


@pytest.mark.slow
@pytest.mark.parametrize("what", ["launcher", "autotune"])
def test_n_processes_build_the_launcher_and_autotune_once(tmp_path, cache_root, what):
    """One C compile of the launcher library, one benchmark of the autotuned kernel; the
    others wait for the file (not for the timeout) and load it."""
    tools = tmp_path / "tools"
    outputs = start_together(tmp_path, what, job_env(cache_root, tools, {"timeout": "2m"}), tools)
    assert triton_files.calls(tools, COUNTED[what]) == 1
    assert len({json.dumps(o.get("paths") or o["chosen"]) for o in outputs}) == 1  # the same file for all
    if what == "autotune":
        assert outputs[0]["chosen"]["BLOCK"] == 128
        assert len(list((cache_root / "triton").glob("*/scale_kernel.autotune.json"))) == 1
    else:  # built once, loaded by all
        assert [Path(p).name.split(".")[0] for p in outputs[0]["paths"]] == ["cuda_utils"]
    found = flights(cache_root)
    assert len(found) == N and {f["state"] for f in found} == {"on"}
    assert sum(f["led"] for f in found) == 1 and sum(f["hits_after_wait"] for f in found) == N - 1
    assert sum(f["gave_up"] for f in found) == 0 and sum(f["abandoned"] for f in found) == 0
    assert list((cache_root / "locks" / "triton").iterdir()) == []  # the leader removed its lock file


@pytest.mark.slow
@pytest.mark.parametrize("what", ["launcher", "autotune"])
def test_with_single_flight_off_each_process_builds_and_benchmarks(tmp_path, cache_root, what):
    """Triton without single-flight, for comparison: every process that misses does the work."""
    tools = tmp_path / "tools"
    start_together(tmp_path, what, job_env(cache_root, tools, {"enabled": False}), tools)
    count = triton_files.calls(tools, COUNTED[what])
    print(f"{what}, single-flight off, {N} processes: {count} {COUNTED[what]} calls")
    assert count > 1 if what == "launcher" else count == N  # the benchmark's sleep overlaps them all


@pytest.mark.slow
@pytest.mark.skipif(not OTHER_TRITON, reason="GPU_CACHE_TEST_OTHER_TRITON names no Python of another Triton")
def test_under_triton_3_6_each_signature_launcher_is_built_once(tmp_path, cache_root):
    """Triton <= 3.6 (the H200's) also builds a launcher library per kernel signature, through
    the same get_file and put: 4 processes build the utils and the signature's launcher once."""
    tools = tmp_path / "tools"
    outputs = start_together(tmp_path, "launcher", job_env(cache_root, tools, {"timeout": "2m"}), tools,
                             python=str(OTHER_TRITON))
    assert triton_files.calls(tools, "cc") == 2
    built = sorted(Path(p).name.split(".")[0] for p in outputs[0]["paths"])
    assert built == ["__triton_launcher", "cuda_utils"]
    assert sum(f["led"] for f in flights(cache_root)) == 2


@pytest.mark.slow
def test_a_failed_autotune_releases_its_lock(tmp_path, cache_root):
    """A leader whose benchmark raises never writes the file: its lock is released once the
    error is handled, so the next process benchmarks at once (not after the 5 minute bound),
    while the failed one is still alive."""
    tools = tmp_path / "tools"
    environ = job_env(cache_root, tools, {"timeout": "5m"})
    sync = tmp_path / "sync"
    sync.mkdir()
    (sync / "go").touch()
    first = subprocess.Popen([sys.executable, str(JOB), str(sync / "r1"), str(sync / "go"), "autotune-fails",
                              str(tools), "60"], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert json.loads(first.stdout.readline())["error"] == "the benchmark failed"
        started = time.monotonic()
        second = subprocess.run([sys.executable, str(JOB), str(sync / "r2"), str(sync / "go"), "autotune",
                                 str(tools), "0"], env=environ, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 0, second.stderr[-2000:]
    assert json.loads(second.stdout)["chosen"]["BLOCK"] == 128
    assert took < 30, took
    assert triton_files.calls(tools, "bench") == 2
    assert not any((cache_root / "locks" / "triton").glob("*.lock"))


@pytest.mark.slow
def test_files_in_a_read_only_seed_are_neither_built_nor_benchmarked_again(tmp_path, cache_root):
    """gpu-cache's seed manager (a read-only root): the launcher library and the autotune
    result found in the seed are used as they are, by every process; nothing is written
    node-locally and no lock is taken."""
    tools = tmp_path / "tools"
    environ = job_env(cache_root, tools, {"timeout": "2m"})
    for what in COUNTED:
        start_together(tmp_path, what, environ, tools, n=1)
    local = tmp_path / "node-local"
    seeded = dict(environ, TRITON_CACHE_MANAGER="gpu_cache_hook.kinds.triton.seed:SeedOverlayCacheManager",
                  GPU_CACHE_TRITON_SEED=str(cache_root / "triton"), TRITON_CACHE_DIR=str(local),
                  GPU_CACHE_LOCKS=str(tmp_path / "node-locks"))
    for what in COUNTED:
        outputs = start_together(tmp_path, what, seeded, tools)
        assert triton_files.calls(tools, COUNTED[what]) == 1  # the seed's, made above
        if what == "launcher":  # loaded from the seed: nothing in the node-local cache
            assert {len(o["paths"]) for o in outputs} == {0}
        else:
            assert {o["chosen"]["BLOCK"] for o in outputs} == {128}
    assert not [p for p in local.rglob("*") if p.is_file()]
    assert not (tmp_path / "node-locks").exists() or not any((tmp_path / "node-locks").rglob("*.lock"))
