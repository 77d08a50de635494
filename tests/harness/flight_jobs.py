"""Jobs for the single-flight tests (test_single_flight, test_locks, test_flight_across_nodes,
test_slurm_single_flight): processes that miss the same keys at once, their compiles per key,
the locks a leader holds, and the lease bound of the hook's single-flight across nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from gpu_cache.config.settings import settings_from
from gpu_cache.jobenv import env
from helpers import clean_environ, hook_piece

#: Processes started together by default.
N = 4

#: One job: imports its library, says it is ready, waits for the go file, then compiles.
#: ``jax``: three jitted chains of different lengths (three keys), the results on stdout.
#: ``triton``: the built-in triton-kernels workload, ahead of time for sm_90 (five kernels).
DRIVER = r'''
import os, sys, time
ready, go, what = sys.argv[1:4]
if what == "jax":
    import jax, jax.numpy as jnp, numpy as np
else:
    from gpu_cache.workloads import triton_kernels
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
if what == "jax":
    def chain(n):
        def f(x):
            for i in range(n):
                x = jnp.tanh(x @ x.T * 0.01 + i)
            return x.sum()
        f.__name__ = f"chain{n}"
        return jax.jit(f)
    x = np.ones((32, 32), np.float32)
    print([round(float(chain(n)(x)), 4) for n in (2, 3, 4)])
else:
    sys.exit(triton_kernels.main(["--shape", "64", "--mode", "aot"]))
'''


def job_env(root: Path, config: dict | None = None, **extra: str) -> dict[str, str]:
    """A job's environment as gpu-cache exports it for ``root`` (the hook on PYTHONPATH)."""
    base = clean_environ(TRITON_DEFAULT_FP_FUSION="1")
    exports = env.resolve(settings_from(config or {}, cache_root=str(root)), base)
    return env.job_environ(exports, base, **extra)


def start_together(tmp_path: Path, what: str, environ: dict[str, str], n: int = N,
                   prefix: list[str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """``n`` jobs that import, wait for each other, and start compiling at one instant."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    sync = tmp_path / f"sync-{what}-{time.monotonic_ns()}"
    sync.mkdir()
    go = sync / "go"
    procs = [subprocess.Popen([*(prefix or []), sys.executable, str(driver), str(sync / f"ready{i}"), str(go),
                               what], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    deadline = time.monotonic() + 120
    while len(list(sync.glob("ready*"))) < n and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.touch()
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=300), *p.communicate()) for p in procs]


def compiles_per_key(sections: list[dict]) -> Counter:
    """How many processes compiled (missed) each key, from the hook's records."""
    return Counter(m["key"] for s in sections for m in s["missed"])


def start_triton(environ: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpu_cache.workloads.triton_kernels", "--shape", "64",
                             "--mode", "aot"], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def stopped_holding_a_lock(root: Path, leader: subprocess.Popen[str], timeout: float = 60) -> Path:
    """Stop ``leader`` (SIGSTOP) at a moment it holds a key's lock (it misses every kernel);
    the lock file."""
    deadline = time.monotonic() + timeout
    folder = root / "locks" / "triton"
    while time.monotonic() < deadline:
        assert leader.poll() is None, leader.communicate()
        os.kill(leader.pid, signal.SIGSTOP)
        while Path(f"/proc/{leader.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.001)
        held = flocks_of(leader.pid)
        for path in folder.glob("*.lock") if folder.is_dir() else []:
            try:
                if path.stat().st_ino in held:
                    return path
            except FileNotFoundError:
                pass
        os.kill(leader.pid, signal.SIGCONT)
        time.sleep(0.003)
    raise AssertionError("the leader never held a lock")


def has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (its /proc fd links)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            pass
    return False


def finished(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def lease_bound() -> tuple[float, float]:
    """LEASE_STALE and MAX_LEASE_POLL of the hook's single-flight leases."""
    leases = hook_piece("flight.leases")
    return leases.LEASE_STALE, leases.MAX_LEASE_POLL


def flocks_of(pid: int) -> set[int]:
    """The inodes of the files process ``pid`` holds a flock lock on (/proc/locks)."""
    inodes = set()
    with open("/proc/locks") as table:
        for line in table:
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[4] == str(pid):
                inodes.add(int(fields[5].rsplit(":", 1)[1]))
    return inodes
