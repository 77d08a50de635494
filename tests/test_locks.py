"""The lock rules (docs/guarantees.md, "Locks"): no other user can hold a lock that gpu-cache or
a job waits on, a waiter stops as soon as the entry it waits for exists, and nothing planted in a
lock folder makes a job wait, spin or write elsewhere. Tried as the attacker would: a real second
user (``nobody``) holding ``flock`` on whatever it can open, a real killed leader,
real JAX compiles and ahead-of-time Triton compiles on CPU, real FIFOs and symlinks."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from acls import GROUP_OBJ, MASK, OTHER, USER, USER_OBJ, set_acl
from flight_jobs import (
    DRIVER,
    compiles_per_key,
    finished,
    has_open,
    job_env,
    start_together,
    start_triton,
    stopped_holding_a_lock,
)
from helpers import FILLER, clean_environ, hook_piece, jax_job_env, records, run_cli

# Every test here runs real compiles for seconds: the slow layer.
pytestmark = [pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                 reason="chown and a second user need root"), pytest.mark.slow]

#: ``python3 HOLD PATH...`` as another user: open each path read-only (what flock needs), take
#: LOCK_EX without waiting, say how many it holds, then hold them.
HOLD = r'''
import errno, fcntl, os, sys, time
held = []
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        print(f"cannot {errno.errorcode.get(exc.errno, exc.errno)} {path}", flush=True)
        continue
    held.append(fd)
print(f"held {len(held)}", flush=True)
time.sleep(600)
'''


class Holder:
    """``HOLD`` run as ``user``: what it said, and a kill at the end."""

    def __init__(self, base: Path, paths: list[Path], user: str = "nobody", code: str = HOLD) -> None:
        program = base / "hold.py"
        program.write_text(code)
        program.chmod(0o644)
        # A direct child (not under runuser), so that a kill ends the holder itself.
        self.proc = subprocess.Popen(["/usr/bin/python3", str(program), *map(str, paths)], user=user,
                                     group=user if user != "nobody" else "nogroup", extra_groups=[],
                                     stdout=subprocess.PIPE, text=True)
        self.lines = []
        while True:
            line = self.proc.stdout.readline().strip()
            assert line, "the holder ended early"
            self.lines.append(line)
            if line.startswith("held "):
                self.held = int(line.split()[1])
                break

    def stop(self) -> None:
        self.proc.kill()
        self.proc.communicate()


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def flock_name(key: str, kind_folder: str) -> str:
    """The lock file name of ``key`` (gpu_cache_hook.flight.lock_name): the key, then 8 hex digits of
    the cache folder relative to the root, so the same on every node."""
    return f"{key}-{zlib.crc32(kind_folder.encode()):08x}.lock"


def jax_keys(root: Path, environ: dict[str, str], tmp: Path) -> list[str]:
    """Run the three-chain JAX job once, return its keys and empty the JAX cache again."""
    start_together(tmp, "jax", environ, n=1)
    keys = sorted(p.name[:-len("-cache")] for p in (root / "jax").glob("*-cache"))
    assert len(keys) == 3, keys
    for path in (root / "jax").iterdir():
        path.unlink()
    for path in (root / "records").iterdir():
        path.unlink()
    return keys


# --- a killed leader's lock file, and older ones others could open -------------------------


def test_a_lock_file_a_killed_leader_left_is_out_of_other_users_reach(base):
    """The attack of issue 21 item 1: a leader is killed, its lock file stays, another user
    takes LOCK_EX on it. Now the file is 0600 in a 0700 folder (whatever the umask): nobody
    cannot even open it. A lock file that an older gpu-cache left 0644, which nobody did open
    and holds, is replaced, not waited on: the next job runs at once."""
    root = base / "cache"
    environ = job_env(root, {"single_flight": {"timeout": "5m"}})
    leader = subprocess.Popen([sys.executable, "-m", "gpu_cache.workloads.triton_kernels", "--shape", "64",
                               "--mode", "aot"], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, umask=0)
    lock = stopped_holding_a_lock(root, leader)
    os.kill(leader.pid, signal.SIGKILL)
    leader.communicate()
    assert lock.exists()  # the leftover
    assert (mode(lock), mode(lock.parent)) == (0o600, 0o700)  # under umask 0
    holder = Holder(base, [lock])
    holder.stop()
    assert holder.held == 0 and holder.lines[0].startswith("cannot EACCES"), holder.lines

    # What an older gpu-cache left (umask 022): nobody opens it read-only and holds LOCK_EX.
    lock.parent.chmod(0o755)
    lock.chmod(0o644)
    holder = Holder(base, [lock])
    try:
        assert holder.held == 1
        started = time.monotonic()
        summary = finished(start_triton(environ))
        took = time.monotonic() - started
    finally:
        holder.stop()
    assert took < 60, took  # not the 5 minute timeout
    assert summary["kernels"] == 5
    flight = records(root, "triton")[-1]["single_flight"]
    assert flight["state"] == "on" and flight["gave_up"] == 0 and flight["waited"] == 0, flight
    assert flight["replaced"] >= 1, flight
    assert mode(lock.parent) == 0o700  # put back


@pytest.mark.parametrize("planted", ["another user's file", "symlink", "FIFO", "world-readable file"])
def test_nothing_planted_at_a_lock_name_makes_jax_jobs_wait_or_spin(base, planted):
    """Each of the three keys' lock names holds something gpu-cache did not make, and user
    nobody holds LOCK_EX on what it can open. Two JAX jobs started together still compile each
    key once, at once: the planted names are replaced, never waited on or followed (a symlink
    opened without O_NOFOLLOW made a job spin at 99% CPU forever: issue 19 item 6a)."""
    root = base / "cache"
    environ = job_env(root, {"single_flight": {"timeout": "5m"}})
    keys = jax_keys(root, environ, base)
    folder = root / "locks" / "jax"
    target = base / "target"
    target.write_text("not a lock\n")
    target.chmod(0o644)
    names = [folder / flock_name(key, "jax") for key in keys]
    for path in names:
        if planted == "another user's file":
            path.write_bytes(b"")
            shutil.chown(path, user="nobody")
            path.chmod(0o600)
        elif planted == "symlink":
            path.symlink_to(target)
        elif planted == "FIFO":
            os.mkfifo(path, 0o666)
        else:
            path.write_bytes(b"")
            path.chmod(0o644)
    folder.chmod(0o755)  # so that nobody reaches them (the hook makes it 0700 again)
    holder = Holder(base, [target] if planted == "symlink" else names)
    try:
        assert holder.held >= 1 or planted == "FIFO", holder.lines
        started = time.monotonic()
        runs = start_together(base, "jax", environ, n=2)
        took = time.monotonic() - started
    finally:
        holder.stop()
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert took < 120, took
    sections = records(root, "jax")
    compiled = compiles_per_key(sections)
    assert sorted(compiled) == keys and set(compiled.values()) == {1}, compiled
    flights = [s["single_flight"] for s in sections]
    assert {f["state"] for f in flights} == {"on"} and sum(f["gave_up"] for f in flights) == 0, flights
    assert sum(f["replaced"] for f in flights) >= 3, flights
    assert target.read_text() == "not a lock\n" and mode(target) == 0o644
    assert mode(folder) == 0o700
    for path in folder.iterdir():  # what is left is gpu-cache's own
        info = os.lstat(path)
        assert stat.S_ISREG(info.st_mode) and info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o600


@pytest.mark.parametrize("planted", ["symlink", "another user's folder", "an ACL in a team's folder"])
def test_a_kind_lock_folder_that_is_not_ours_turns_single_flight_off_for_that_kind(base, team_group, planted):
    """``locks/triton`` a symlink to a folder elsewhere, or another user's folder, or in a team's
    root (``shared_group``) the team's folder with an ACL that lets user nobody, no member, add
    lock files too: nothing is made there, the jobs run (as without single-flight for Triton)
    and the record says why. Guards: the lock rules' ``folder_problem`` (for the ACL: its read
    of it; without, the jobs took locks nobody could hold)."""
    root = base / "cache"
    team = {"shared_group": team_group} if planted.startswith("an ACL") else {}
    environ = job_env(root, {"single_flight": {"timeout": "5m"}, **team})
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    folder = root / "locks" / "triton"
    if planted == "symlink":
        folder.symlink_to(elsewhere)
    elif team:
        folder.mkdir()
        os.chown(folder, -1, grp.getgrnam(team_group).gr_gid)
        folder.chmod(0o2770)
        undefined, nobody = 0xFFFFFFFF, pwd.getpwnam("nobody").pw_uid
        set_acl(folder, (USER_OBJ, 7, undefined), (USER, 7, nobody), (GROUP_OBJ, 7, undefined),
                (MASK, 7, undefined), (OTHER, 0, undefined))
    else:
        folder.mkdir()
        shutil.chown(folder, user="nobody")
    runs = start_together(base, "triton", environ, n=2)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert [json.loads(r.stdout.strip().splitlines()[-1])["kernels"] for r in runs] == [5, 5]
    flights = [s["single_flight"] for s in records(root, "triton")]
    assert all(f["state"].startswith("off: cannot keep lock files private") for f in flights), flights
    why = {"symlink": "symbolic link", "another user's folder": "owned by uid"}.get(planted, "through an ACL")
    assert all(why in f["state"] for f in flights), flights
    assert not any(elsewhere.iterdir()) and not any(folder.iterdir())
    for run in runs:  # one warning line
        assert len([line for line in run.stderr.splitlines() if line.startswith("gpu-cache:")]) == 1


#: ``python3 BEAT PATH...``: keep rewriting each lease file, as a live holder's beat does.
BEAT = r'''
import os, sys, time
fds = [os.open(path, os.O_WRONLY) for path in sys.argv[1:]]
print(f"held {len(fds)}", flush=True)
count = 0
while True:
    count += 1
    for fd in fds:
        os.pwrite(fd, b"gpu-cache lease 1\nbeat %012d\n" % count, 0)
    time.sleep(0.3)
'''


def test_a_lease_another_user_planted_and_keeps_beating_is_not_waited_on(base):
    """Cluster mode (leases across nodes, forced here on a local disk): each key's lease 0 is
    a file of user nobody, whose process rewrites its beat every 0.3 s, as a live holder's
    would. The jobs set those leases aside and compile each key once, at once."""
    root = base / "cache"
    environ = job_env(root, {"single_flight": {"timeout": "5m"}}, GPU_CACHE_LOCK_MODE="cluster")
    keys = jax_keys(root, environ, base)
    folder = root / "locks" / "jax"
    leases = [folder / flock_name(key, "jax").replace(".lock", ".0.lease") for key in keys]
    for path in leases:
        path.write_bytes(b"")
        shutil.chown(path, user="nobody")
    folder.chmod(0o755)  # so that nobody reaches them (the hook makes it 0700 again)
    beater = Holder(base, leases, code=BEAT)
    try:
        assert beater.held == 3
        started = time.monotonic()
        runs = start_together(base, "jax", environ, n=2)
        took = time.monotonic() - started
    finally:
        beater.stop()
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert took < 60, took
    sections = records(root, "jax")
    compiled = compiles_per_key(sections)
    assert sorted(compiled) == keys and set(compiled.values()) == {1}, compiled
    flights = [s["single_flight"] for s in sections]
    assert {f["mode"] for f in flights} == {"cluster"} and sum(f["replaced"] for f in flights) >= 3, flights
    assert sum(f["gave_up"] for f in flights) == 0 and sum(f["leases_passed"] for f in flights) == 0
    assert not list(folder.iterdir())  # the planted leases set aside, the jobs' own removed


@pytest.mark.parametrize("planted", ["symlink", "folder", "folder with a file"])
def test_a_link_or_folder_at_a_lease_or_lock_name_is_set_aside(base, planted):
    """Cluster mode: each key's lock name and lease 0 hold a link to a lease-like file of the
    user's own (a beating holder's content) or a folder. Opened, they raised ELOOP or EISDIR and
    that key went on without single-flight, with a warning; now each is set aside as a FIFO is,
    never followed, and the jobs compile each key once, at once."""
    root = base / "cache"
    environ = job_env(root, {"single_flight": {"timeout": "5m"}}, GPU_CACHE_LOCK_MODE="cluster")
    keys = jax_keys(root, environ, base)
    folder = root / "locks" / "jax"
    target = base / "target"
    target.write_bytes(b"gpu-cache lease 1\nbeat 000000000001\n")
    names = [folder / flock_name(key, "jax") for key in keys]
    for path in names + [p.with_name(p.name.replace(".lock", ".0.lease")) for p in names]:
        if planted == "symlink":
            path.symlink_to(target)
        else:
            path.mkdir()
            if planted == "folder with a file":
                (path / "inside").write_text("kept\n")
    runs = start_together(base, "jax", environ, n=2)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert not any("gpu-cache: warning" in r.stderr for r in runs), [r.stderr[-2000:] for r in runs]
    sections = records(root, "jax")
    compiled = compiles_per_key(sections)
    assert sorted(compiled) == keys and set(compiled.values()) == {1}, compiled
    flights = [s["single_flight"] for s in sections]
    assert {f["state"] for f in flights} == {"on"} and sum(f["gave_up"] for f in flights) == 0, flights
    assert sum(f["replaced"] for f in flights) >= 6, flights
    assert target.read_bytes() == b"gpu-cache lease 1\nbeat 000000000001\n"
    left = [p for p in folder.iterdir() if not p.name.endswith(".aside")]
    assert not left, left
    kept = list(folder.glob("*.aside/inside"))  # a folder that is not empty stays aside, whole
    assert len(kept) == (6 if planted == "folder with a file" else 0)


# --- a waiter stops as soon as the entry exists ----------------------------------------------

HOLD_OWN = r'''
import fcntl, os, sys, time
fds = [os.open(path, os.O_RDWR | os.O_CREAT, 0o600) for path in sys.argv[1:]]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
'''


def test_a_jax_waiter_goes_on_as_soon_as_the_entry_is_whole(base):
    """A leader of our own that holds the three keys and never writes (stuck; or on another
    node), and the entries appear by other means: the waiter loads them as soon as they are
    whole, never half-written ones (JAX writes in place; reading half an entry is an error with
    JAX_RAISE_PERSISTENT_CACHE_ERRORS), long before the 5 minute timeout."""
    root = base / "cache"
    environ = job_env(root, {"single_flight": {"timeout": "5m"}}, JAX_RAISE_PERSISTENT_CACHE_ERRORS="true")
    keys = jax_keys(root, environ, base)
    saved = base / "saved"
    start_together(base, "jax", environ, n=1)  # the entries once more, kept aside
    shutil.move(root / "jax", saved)
    (root / "jax").mkdir()
    for path in (root / "records").iterdir():
        path.unlink()
    names = [root / "locks" / "jax" / flock_name(key, "jax") for key in keys]
    stuck = subprocess.Popen([sys.executable, "-c", HOLD_OWN, *map(str, names)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert stuck.stdout.readline().strip() == "held"
        driver = base / "driver.py"
        driver.write_text(DRIVER)
        (base / "go").touch()
        waiter = subprocess.Popen([sys.executable, str(driver), str(base / "ready"), str(base / "go"), "jax"],
                                  env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = None  # the waiter waits on whichever key it compiles first
        deadline = time.monotonic() + 120
        while first is None:
            first = next((n for n in names if has_open(waiter.pid, n)), None)
            assert waiter.poll() is None and time.monotonic() < deadline, waiter.communicate()
            time.sleep(0.01)
        key = keys[names.index(first)]
        entry = saved / f"{key}-cache"
        data = entry.read_bytes()
        with open(root / "jax" / entry.name, "wb") as out:  # in place, as JAX writes
            out.write(data[: len(data) // 2])
            out.flush()
            time.sleep(1.5)  # the waiter peeks all the while: half an entry is not read
            assert waiter.poll() is None
            out.write(data[len(data) // 2:])
        written = time.monotonic()
        for other in saved.glob("*-cache"):
            if other.name != entry.name:
                shutil.copy(other, root / "jax" / other.name)
        out, err = waiter.communicate(timeout=120)
        after = time.monotonic() - written
    finally:
        stuck.kill()
        stuck.communicate()
    assert waiter.returncode == 0, err[-2000:]
    assert "Error reading" not in err
    assert after < 10, after
    (section,) = records(root, "jax")
    flight = section["single_flight"]
    assert flight["hits_after_wait"] >= 1 and flight["gave_up"] == 0 and flight["led"] == 0, flight
    assert section["writes"] == 0 and not section["missed"]  # nothing compiled: all loaded


# --- prune and unpack ------------------------------------------------------------------------


def test_prune_and_unpack_never_wait_on_a_lock_another_user_holds(base):
    """``.prune.lock`` and JAX's ``.lockfile`` as an older gpu-cache and JAX's filelock make them
    (0644), held by nobody: prune and unpack go on at once (before: 10 minutes, and 60 s per
    entry), and the lock files they leave are 0600: nobody cannot open them again."""
    source = base / "source"
    subprocess.run([sys.executable, "-c", FILLER, "3"], env=jax_job_env(source / "jax", shared_fs=True),
                   check=True)
    archive = base / "carry.tar"
    packed = run_cli("pack", str(archive), "--cache-root", str(source))
    assert packed.returncode == 0, packed.stderr
    root = base / "cache"
    (root / "jax").mkdir(parents=True)
    prune_lock, jax_lock = root / ".prune.lock", root / "jax" / ".lockfile"
    for path in (prune_lock, jax_lock):
        path.write_bytes(b"")
        path.chmod(0o644)
    holder = Holder(base, [prune_lock, jax_lock])
    try:
        assert holder.held == 2
        started = time.monotonic()
        unpacked = run_cli("unpack", str(archive), "--cache-root", str(root), "--kind", "jax")
        unpack_took = time.monotonic() - started
        started = time.monotonic()
        pruned = run_cli("prune", "--max-size", "0", "--json", "--cache-root", str(root), env=clean_environ())
        prune_took = time.monotonic() - started
    finally:
        holder.stop()
    assert unpacked.returncode == 0, unpacked.stderr
    assert pruned.returncode == 0, pruned.stderr
    assert unpack_took < 30 and prune_took < 30, (unpack_took, prune_took)
    report = json.loads(pruned.stdout)
    assert not report["problems"], report["problems"]
    assert report["jax"]["entries_removed"] == 3
    assert (mode(prune_lock), mode(jax_lock)) == (0o600, 0o600)
    again = Holder(base, [prune_lock, jax_lock])
    again.stop()
    assert again.held == 0


def test_the_lock_file_rule_has_one_home(tmp_path):
    """gpu-cache's own locks (core.safe_locks) judge lock files by the hook's rule, the module
    single-flight runs in jobs, on real files: modes, another user's file, a link, a FIFO."""
    from gpu_cache.core import safe_locks

    hook = hook_piece("locks")
    assert sys.modules[safe_locks.lock_file_problem.__module__].__file__ == hook.__file__
    cases = {}
    for mode in (0o600, 0o640, 0o644, 0o660, 0o666, 0o604):
        cases[f"mode-{mode:o}"] = path = tmp_path / f"mode-{mode:o}.lock"
        path.write_bytes(b"")
        path.chmod(mode)
    cases["theirs"] = theirs = tmp_path / "theirs.lock"
    theirs.write_bytes(b"")
    theirs.chmod(0o600)
    os.chown(theirs, 65534, 65534)
    cases["link"] = link = tmp_path / "link.lock"
    link.symlink_to(cases["mode-600"])
    cases["fifo"] = fifo = tmp_path / "fifo.lock"
    os.mkfifo(fifo)
    gid = os.getegid()
    passed = {group_bits: [name for name, path in cases.items()
                           if safe_locks.lock_file_problem(os.lstat(path), group_bits, gid) is None]
              for group_bits in (0, 0o060)}
    assert passed == {0: ["mode-600"], 0o060: ["mode-600", "mode-640", "mode-660"]}
