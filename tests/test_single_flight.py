"""Single-flight across processes, in real processes on CPU: N JAX processes and N Triton
(ahead-of-time) processes that start together on an empty cache compile each key once; with
single-flight off they storm; a killed leader releases its lock at once; a stopped leader
holds nobody past the timeout; a failed compile releases its lock; locks are neither counted
nor pruned; a kernel where flock fails turns single-flight off (and doctor says so)."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from flight_jobs import (
    compiles_per_key,
    finished,
    has_open,
    job_env,
    start_together,
    start_triton,
    stopped_holding_a_lock,
)
from gpu_cache.config.settings import settings_from
from gpu_cache.core import names
from gpu_cache.jobenv import env
from helpers import HOOK, clean_environ, records, run_cli

N = 4


def hits_per_key(sections: list[dict]) -> Counter:
    return Counter(k for s in sections for k in s["hit_keys"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["node", "cluster"])
def test_n_jax_processes_compile_each_computation_once(tmp_path, cache_root, mode):
    """Also in cluster mode (flock, then a lease per key; forced here on a local disk)."""
    runs = start_together(tmp_path, "jax", job_env(cache_root, {"single_flight": {"timeout": "2m"}},
                                                   GPU_CACHE_LOCK_MODE=mode))
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert len({r.stdout for r in runs}) == 1  # the same results in every process
    sections = records(cache_root, "jax")
    assert len(sections) == N
    compiled = compiles_per_key(sections)
    assert len(compiled) == 3 and set(compiled.values()) == {1}, compiled  # one compile per key
    assert sum(s["writes"] for s in sections) == 3  # one cache write attempt per key
    assert hits_per_key(sections) == dict.fromkeys(compiled, N - 1)  # the others loaded it
    flights = [s["single_flight"] for s in sections]
    assert {f["state"] for f in flights} == {"on"} and {f["mode"] for f in flights} == {mode}
    assert sum(f["led"] for f in flights) == 3 and sum(f["gave_up"] for f in flights) == 0
    assert sum(f["waited"] for f in flights) >= 1  # they did start together
    for section in sections:  # JAX's compile step seconds: waiting, loading, compiling
        flight = section["single_flight"]
        parts = section["own_compile_seconds"] + section["load_seconds"] + flight["wait_seconds"]
        assert parts == pytest.approx(section["compile_seconds"], abs=0.01), section
        assert {w["key"] for w in flight["waits"]} <= set(compiled)  # each wait named by its key
        assert sum(w["seconds"] for w in flight["waits"]) == pytest.approx(flight["wait_seconds"], abs=0.01)
        assert [w["outcome"] for w in flight["waits"]].count("hit") == flight["hits_after_wait"]
        assert all(m["seconds"] > 0 for m in section["missed"])  # a leader's own compile, per key
    assert len(list((cache_root / "jax").glob("*-cache"))) == 3
    assert list((cache_root / "locks" / "jax").iterdir()) == []  # leaders remove their lock files


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["node", "cluster"])
def test_n_triton_processes_compile_each_kernel_once(tmp_path, cache_root, mode):
    runs = start_together(tmp_path, "triton", job_env(cache_root, {"single_flight": {"timeout": "2m"}},
                                                      GPU_CACHE_LOCK_MODE=mode))
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    outputs = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    misses = Counter(e["case"] for o in outputs for e in o["events"] if not e["cache_hit"])
    hits = Counter(e["case"] for o in outputs for e in o["events"] if e["cache_hit"])
    assert len(misses) == 5 and set(misses.values()) == {1}, misses  # Triton's listener: one miss per kernel
    assert hits == dict.fromkeys(misses, N - 1)
    sections = records(cache_root, "triton")
    assert sum(s["misses"] for s in sections) == 5 and set(compiles_per_key(sections).values()) == {1}
    flights = [s["single_flight"] for s in sections]
    assert {f["state"] for f in flights} == {"on"} and sum(f["led"] for f in flights) == 5
    assert {f["mode"] for f in flights} == {mode}
    assert sum(f["gave_up"] for f in flights) == 0
    assert list((cache_root / "locks" / "triton").iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("what", ["jax", "triton"])
def test_with_single_flight_off_they_storm(tmp_path, cache_root, what):
    """Today's behaviour, for comparison: every process that misses compiles (counts shown)."""
    environ = job_env(cache_root, {"single_flight": {"enabled": False}})
    assert environ["GPU_CACHE_LOCKS"] == ""
    runs = start_together(tmp_path, what, environ)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    sections = records(cache_root, what)
    compiled = compiles_per_key(sections)
    print(f"{what}, single-flight off, {N} processes: compiles per key {sorted(compiled.values())}")
    assert {s["single_flight"]["state"] for s in sections} == {"off: GPU_CACHE_LOCKS is not set"}
    assert sum(compiled.values()) > len(compiled)  # at least one key compiled twice or more
    assert not (cache_root / "locks").exists() or not any((cache_root / "locks").rglob("*.lock"))


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_on_a_read_only_root_the_seed_manager_does_single_flight_node_locally(tmp_path, cache_root):
    """A read-only root: Triton reads it as a seed through gpu-cache's seed manager and writes
    node-locally; the locks go node-local too, and N processes still compile each kernel once."""
    run_cli("env", "--cache-root", str(cache_root))  # the kind folders, before the root turns read-only
    local = tmp_path / "node-local"
    local.mkdir()
    subprocess.run(["mount", "--bind", str(cache_root), str(cache_root)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(cache_root)], check=True)
        shown = json.loads(run_cli("env", "--json", "--cache-root", str(cache_root),
                                   env=clean_environ(TMPDIR=str(local))).stdout)
        exports = shown["exports"]
        assert exports["TRITON_CACHE_MANAGER"] == names.SEED_MANAGER
        locks = local / f"gpu-cache-{os.getuid()}" / "locks"
        assert exports["GPU_CACHE_LOCKS"] == str(locks)
        assert any("single-flight holds within this node only" in w for w in shown["warnings"])
        environ = clean_environ(TMPDIR=str(local), TRITON_DEFAULT_FP_FUSION="1") | exports
        runs = start_together(tmp_path, "triton", environ)
    finally:
        subprocess.run(["umount", "-l", str(cache_root)], capture_output=True)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    misses = Counter(e["case"] for r in runs for e in json.loads(r.stdout.strip().splitlines()[-1])["events"]
                     if not e["cache_hit"])
    assert len(misses) == 5 and set(misses.values()) == {1}, misses
    assert not any((cache_root / "triton").iterdir())  # nothing written to the seed
    assert not any(locks.rglob("*.lock"))


# --- leaders that die, stop or fail ------------------------------------------------------


def wait_until_waiting(waiter: subprocess.Popen[str], lock: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not has_open(waiter.pid, lock):
        assert waiter.poll() is None, waiter.communicate()
        assert time.monotonic() < deadline, "the waiter never waited for the lock"
        time.sleep(0.002)


@pytest.mark.slow
def test_a_killed_leader_releases_its_lock_at_once(cache_root):
    environ = job_env(cache_root, {"single_flight": {"timeout": "5m"}})
    leader = start_triton(environ)
    lock = stopped_holding_a_lock(cache_root, leader)
    waiter = start_triton(environ)
    wait_until_waiting(waiter, lock)
    killed = time.monotonic()
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait(timeout=30)
    summary = finished(waiter)
    after_kill = time.monotonic() - killed
    assert after_kill < 30, after_kill  # far below the 5 minute bound: the kernel dropped the lock
    flight = records(cache_root, "triton")[-1]["single_flight"]
    assert flight["waited"] >= 1 and flight["gave_up"] == 0
    assert summary["kernels"] == 5  # loaded or compiled what the dead leader left
    assert not any((cache_root / "locks" / "triton").glob("*.lock"))  # and cleaned its lock file


@pytest.mark.slow
def test_a_stopped_leader_holds_waiters_no_longer_than_the_timeout(cache_root):
    environ = job_env(cache_root, {"single_flight": {"timeout": "3s"}})
    leader = start_triton(environ)
    lock = stopped_holding_a_lock(cache_root, leader)
    try:
        started = time.monotonic()
        waiters = [start_triton(environ) for _ in range(2)]
        summaries = [finished(w) for w in waiters]
        took = time.monotonic() - started
    finally:
        os.kill(leader.pid, signal.SIGCONT)
    assert finished(leader)["kernels"] == 5  # the leader, resumed, finishes too
    flights = [r["single_flight"] for r in records(cache_root, "triton")]
    # A waiter gives up on the stopped key after 3 s and compiles it; one still waiting may load that.
    assert sum(f["gave_up"] for f in flights) >= 1, flights
    assert all(f["wait_seconds"] < 3 * f["waited"] + 1 for f in flights), flights  # <= 3 s per key
    assert took < 60, took
    assert all(s["kernels"] == 5 for s in summaries)
    assert lock.parent.is_dir()


BAD_KERNEL = r'''
import sys, time, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def bad(out_ptr):
    tl.store(out_ptr + tl.arange(0, 3), 1.0)  # not a power of two: fails while compiling

def compile_it():
    src = ASTSource(fn=bad, signature={"out_ptr": "*fp32"}, constexprs={})
    try:
        triton.compile(src, target=GPUTarget("cuda", 90, 32))
    except Exception as exc:
        return type(exc).__name__
    return "compiled?"

print(compile_it(), flush=True)
time.sleep(float(sys.argv[1]))
'''


@pytest.mark.slow
def test_a_failed_compile_releases_its_lock(cache_root, tmp_path):
    """A compile error ends without put_group: the lock is released once the error is handled
    (the manager is collected), not at the timeout or at exit."""
    environ = job_env(cache_root, {"single_flight": {"timeout": "5m"}})
    program = tmp_path / "bad.py"
    program.write_text(BAD_KERNEL)
    first = subprocess.Popen([sys.executable, str(program), "60"], env=environ, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "CompilationError"
        started = time.monotonic()
        second = subprocess.run([sys.executable, str(program), "0"], env=environ, capture_output=True,
                                text=True, timeout=120)
        took = time.monotonic() - started
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 0 and second.stdout.strip() == "CompilationError", second.stderr[-2000:]
    assert took < 30, took  # not the 5 minute bound
    assert not any((cache_root / "locks" / "triton").glob("*.lock"))


def test_a_jax_whose_internals_differ_runs_as_without_single_flight(tmp_path, cache_root):
    """The fake jax of the hook tests has no compile_or_get_cached/_cache_read: the job's exit
    code, output and stderr stay as without the hook, and the record says why it is off."""
    from hook_jobs import FAKE_PROGRAM, fake_jax, same_as_without_the_hook

    fake = fake_jax(tmp_path)
    environ = job_env(cache_root)
    environ["PYTHONPATH"] = os.pathsep.join([str(HOOK), str(fake), environ["PYTHONPATH"]])
    done = same_as_without_the_hook(FAKE_PROGRAM, environ, fake)
    assert done.returncode == 3 and "gpu-cache" not in done.stderr
    (section,) = records(cache_root, "jax")
    assert section["single_flight"]["state"] == "off: jax._src.compiler.compile_or_get_cached is missing"
    assert section["misses"] == 3  # the rest of the record as ever


# --- locks are not cache entries ---------------------------------------------------------

HOLD = r'''
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
'''


@pytest.mark.slow
def test_locks_are_not_counted_by_stats_nor_removed_by_prune(tmp_path, cache_root):
    runs = start_together(tmp_path, "triton", job_env(cache_root), n=2)
    assert all(r.returncode == 0 for r in runs)
    held = cache_root / "locks" / "jax" / "jit_held-0123abcd.lock"
    stale = cache_root / "locks" / "triton" / "STALE-0123abcd.lock"
    for folder in (held.parent, stale.parent):
        folder.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        inode = held.stat().st_ino
        environ = clean_environ()
        stats = json.loads(run_cli("stats", "--json", "--cache-root", str(cache_root), env=environ).stdout)
        assert "locks" not in stats["kinds"] and ".lock" not in json.dumps(stats)
        assert stats["kinds"]["triton"]["entries"] == 5
        pruned = run_cli("prune", "--max-size", "0", "--max-age", "0s", "--json", "--cache-root",
                         str(cache_root), env=environ)
        assert pruned.returncode == 0, pruned.stderr
        report = json.loads(pruned.stdout)["triton"]
        assert report["entries_removed"] == report["entries_before"] == 5 and not report["errors"]
        assert held.stat().st_ino == inode and stale.exists()  # the locks stayed, untouched
    finally:
        holder.kill()
        holder.communicate()


# --- configuration, exports, doctor --------------------------------------------------------

def test_exports_on_by_default_and_off_by_config(cache_root):
    base = clean_environ()
    on = env.resolve(settings_from({}, cache_root=str(cache_root)), base)
    assert on.values["GPU_CACHE_LOCKS"] == str(cache_root / "locks")
    assert on.values["GPU_CACHE_LOCK_TIMEOUT"] == "600"
    assert on.single_flight.enabled and (cache_root / "locks").is_dir()
    config = {"single_flight": {"timeout": "90s"}}
    short = env.resolve(settings_from(config, cache_root=str(cache_root)), base)
    assert short.values["GPU_CACHE_LOCK_TIMEOUT"] == "90"
    off = env.resolve(settings_from({"single_flight": {"enabled": False}, "stats_hook": False,
                                     "ptxas_cache": False}, cache_root=str(cache_root)), base)
    assert off.values["GPU_CACHE_LOCKS"] == "" and "GPU_CACHE_LOCK_TIMEOUT" not in off.values
    # jax-triton's kernel cache (#34) is the hook's: it keeps the hook on PYTHONPATH, and it
    # loads nothing more in a process that does not import jax_triton
    assert off.values["PYTHONPATH"].split(os.pathsep) == [str(HOOK), *base["PYTHONPATH"].split(os.pathsep)]
    assert "GPU_CACHE_JAX_TRITON" in off.values
    hook_only = env.resolve(settings_from({"stats_hook": False}, cache_root=str(cache_root)), base)
    assert hook_only.values["PYTHONPATH"].split(os.pathsep)[0] == str(HOOK)  # single-flight needs it
    bad = run_cli("env", "--cache-root", str(cache_root), "--config-json",
                  json.dumps({"single_flight": {"timeout": "soon"}}))
    assert bad.returncode == 2 and "single_flight.timeout" in bad.stderr


#: x86_64 and aarch64 numbers of the flock system call.
_FLOCK_NR = {"x86_64": 73, "aarch64": 32}
#: ``no_flock.py NR PROGRAM ARGS...`` runs PROGRAM with a seccomp filter that fails every
#: flock(2) (system call NR) with ENOLCK, as a filesystem without lock support does.
NO_FLOCK = r'''
import ctypes, os, sys
nr = int(sys.argv[1])
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
prog = (F * 4)(F(0x20, 0, 0, 0), F(0x15, 0, 1, nr), F(0x06, 0, 0, 0x00050000 | 37), F(0x06, 0, 0, 0x7fff0000))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(P(4, prog)), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
os.execv(sys.argv[2], sys.argv[2:])
'''


def _no_flock_prefix(tmp_path: Path) -> list[str]:
    nr = _FLOCK_NR.get(platform.machine())
    if nr is None:
        pytest.skip(f"no flock syscall number known for {platform.machine()}")
    script = tmp_path / "no_flock.py"
    script.write_text(NO_FLOCK)
    prefix = [sys.executable, str(script), str(nr)]
    probe = subprocess.run([*prefix, sys.executable, "-c",
                            "import fcntl, os; fcntl.flock(os.open('/dev/null', 0), fcntl.LOCK_EX)"],
                           capture_output=True, text=True)
    if "No locks available" not in probe.stderr:
        pytest.skip(f"cannot make flock fail with seccomp here: {probe.stderr[-300:]}")
    return prefix


@pytest.mark.slow
def test_where_flock_fails_single_flight_is_off_and_jobs_run_as_before(tmp_path, cache_root):
    prefix = _no_flock_prefix(tmp_path)
    environ = job_env(cache_root)  # resolved where flock works: the jobs then meet a kernel that fails it
    runs = start_together(tmp_path, "triton", environ, n=2, prefix=prefix)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert [json.loads(r.stdout)["kernels"] for r in runs] == [5, 5]
    sections = records(cache_root, "triton")
    assert all(s["single_flight"]["state"].startswith("off: cannot lock files (flock)") for s in sections)
    assert all("No locks available" in s["single_flight"]["state"] for s in sections)
    for run in runs:  # one warning line at most
        assert len([line for line in run.stderr.splitlines() if line.startswith("gpu-cache:")]) <= 1
    doctor = subprocess.run([*prefix, sys.executable, "-m", "gpu_cache", "doctor", "--json",
                             "--cache-root", str(cache_root)],
                            env=clean_environ(), capture_output=True, text=True, timeout=120)
    assert doctor.returncode == 0, doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["single_flight"]["enabled"] is False
    assert "flock is not supported" in report["single_flight"]["problem"]
    assert report["exports"]["exports"]["GPU_CACHE_LOCKS"] == ""
    assert any("single-flight is off" in w for w in report["warnings"])
    # prune there: nothing can lock .prune.lock, and it prunes all the same
    pruned = subprocess.run([*prefix, sys.executable, "-m", "gpu_cache", "prune", "--max-size", "0", "--json",
                             "--cache-root", str(cache_root)], env=clean_environ(), capture_output=True,
                            text=True, timeout=120)
    assert pruned.returncode == 0, pruned.stderr
    pruned_report = json.loads(pruned.stdout)
    assert pruned_report["problems"] == [] and pruned_report["triton"]["entries_removed"] == 5


def test_doctor_says_single_flight_is_on(cache_root):
    shown = run_cli("doctor", "--cache-root", str(cache_root))
    assert shown.returncode == 0, shown.stderr
    assert f"single-flight: on, node mode (locks in {cache_root / 'locks'}; " in shown.stdout
    assert "is local to this node" in shown.stdout



#: A process whose lock file of one key is made and unlinked under it at each of ``CHURNS``
#: looks (what leaders finishing one after another do on a busy machine: between its lstat
#: and its open the file is another), the last of those leaders having written the entry. It
#: prints what ``lead`` returned and whether single-flight is still on.
CHURN = r'''
import json, os, sys
from gpu_cache_hook import flight, locks
CHURNS, entry = int(sys.argv[1]), sys.argv[2]
real_open_named, looks = locks.open_named, []
def open_named(path, named, group_bits, gid):
    looks.append(path)
    if len(looks) <= CHURNS:  # another leader unlinked it, and the next made it again
        os.close(os.open(path + ".next", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.rename(path + ".next", path)  # (made before the old one goes: another inode)
        if len(looks) == CHURNS:
            open(entry, "w").close()
    return real_open_named(path, named, group_bits, gid)
locks.open_named = open_named
read = lambda: entry if os.path.exists(entry) else None
where = os.path.dirname(entry)
name = os.path.join(os.environ["GPU_CACHE_LOCKS"], "jax", flight.lock_name("k", where))
os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o600))  # the first leader's
found, lock = flight.lead("jax", "k", where, read, peek=read)  # (the entry is whole or absent)
counts = flight.stats("jax")
print(json.dumps({"found": found, "lock": lock is not None, "on": flight.enabled("jax"), "looks": len(looks),
                  "gave_up": counts["gave_up"], "hits_after_wait": counts["hits_after_wait"]}))
'''


def test_a_lock_file_made_and_unlinked_under_each_look_keeps_single_flight_on(tmp_path):
    """Leaders of one key finishing one after another can unlink and make its lock file between
    each of a job's looks (the two-node storm lost that race four times in a row on a busy
    machine): the job looks at the cache again, finds the last leader's entry, and single-flight
    stays on for the rest of it rather than off for every later key of the kind."""
    locks_folder = tmp_path / "locks"
    (locks_folder / "jax").mkdir(parents=True, mode=0o700)
    locks_folder.chmod(0o700)
    entry = tmp_path / "entry"
    environ = clean_environ(PYTHONPATH=str(HOOK), GPU_CACHE_LOCKS=str(locks_folder))
    done = subprocess.run([sys.executable, "-c", CHURN, "4", str(entry)], env=environ,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert (said["found"], said["lock"], said["on"]) == (str(entry), False, True), said
    assert (said["looks"], said["hits_after_wait"]) == (4, 1), said  # read again, not opened again


def test_a_lock_file_that_never_stops_changing_holds_a_job_no_longer_than_the_timeout(tmp_path):
    """The same, without end and without an entry: the job gives up at the timeout (1 s here) and
    compiles without a lock; single-flight stays on."""
    locks_folder = tmp_path / "locks"
    (locks_folder / "jax").mkdir(parents=True, mode=0o700)
    locks_folder.chmod(0o700)
    environ = clean_environ(PYTHONPATH=str(HOOK), GPU_CACHE_LOCKS=str(locks_folder),
                            GPU_CACHE_LOCK_TIMEOUT="1")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", CHURN, str(10**9), str(tmp_path / "entry")],
                          env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert (said["found"], said["lock"], said["on"], said["gave_up"]) == (None, False, True, 1), said
    assert 1 <= time.monotonic() - started < 30  # it waited the timeout, and not much longer
    assert said["looks"] < 1000, said  # it polls, growing to MAX_POLL (0.02 s): no spin
