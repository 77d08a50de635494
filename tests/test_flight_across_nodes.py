"""Single-flight across nodes (issue 22 item 2), on two nodes made on this machine
(tests/harness/flight_nodes.py: each node its own mount, UTS and PID namespace with its own sshfs mount
of one export, where ``flock`` excludes only within a node): N JAX jobs per node on an empty
root compile each key exactly once; a leader that is SIGKILLed or SIGSTOPped on node A frees
node B's waiter within the lease bound, even when the nodes mount the share at different paths."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from flight_jobs import compiles_per_key, lease_bound
from flight_nodes import Node, go, has_open_below, job_commands, leader_fault, lease_holder, wait_ready
from helpers import HOOK, clean_environ, hook_piece, records

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="mount namespaces and sshfs mounts need root")

#: These nodes share this machine's /tmp, so a node-local tier (on by default on sshfs, #23)
#: would be one folder for both: the jobs here read and write the share directly, which is
#: what single-flight's leases across nodes are proven on (the tier's two-node tests give
#: each node its own /tmp: tests/harness/nodes.py).
FLIGHT_CONFIG = {"single_flight": {"timeout": "5m"}, "local_tier": {"mode": "off"}}


def outputs(result: dict) -> list[dict]:
    runs = result["runs"]
    assert all(r["returncode"] == 0 for r in runs), [r["stderr"] for r in runs]
    return [json.loads(r["stdout"].strip().splitlines()[-1]) for r in runs]


def test_three_jobs_on_each_of_two_nodes_compile_each_key_once(sshfs_mount, tmp_path):
    """Issue 22's check: two nodes, one export at the same path, 3 JAX jobs each, started at
    one instant on an empty root under ``gpu-cache env``: compiles == keys (per-node
    single-flight compiled nearly every key once per node)."""
    work = tmp_path / "work"
    work.mkdir()
    point, keys = tmp_path / "share", 6
    nodes = []
    try:
        for name in ("node-a", "node-b"):
            nodes.append(Node(work, sshfs_mount, name, point, job_commands(work, name, 3, keys),
                              clean_environ(), root=point / "cache",
                              config=FLIGHT_CONFIG))
        wait_ready(work, 6, nodes)
        go(work)
        results = [node.result() for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for result in results:
        flight = result["single_flight"]
        assert flight["mode"] == "cluster" and "fuse.sshfs" in flight["why"], flight
    done = [o for r in results for o in outputs(r)]
    assert len({json.dumps(o["values"]) for o in done}) == 1  # the same results everywhere
    assert sum(o["compiled"] for o in done) == keys, done  # one compile per key, over both nodes
    assert sum(o["loaded"] for o in done) == 6 * keys - keys
    root = sshfs_mount.server_dir / "cache"
    sections = records(root, "jax")
    assert len(sections) == 6
    compiled = compiles_per_key(sections)
    assert len(compiled) == keys and set(compiled.values()) == {1}, compiled
    flights = [s["single_flight"] for s in sections]
    assert {f["mode"] for f in flights} == {"cluster"} and sum(f["gave_up"] for f in flights) == 0
    assert not list((root / "locks" / "jax").iterdir())  # no lock or lease left


def test_with_the_tier_a_leader_holds_its_key_until_the_entry_is_on_the_share(sshfs_mount, tmp_path):
    """The node-local tier and single-flight across nodes together, each node its own ``flock``
    domain (its own sshfs mount of the share) and its own local tier: node A's job leads a key
    and is held just before it links the entry into the share (its promotion's temporary file
    is written); node B's job, missing the same key meanwhile, waits for A's lease instead of
    compiling, and loads the entry once A has promoted it: one compile for the key over both
    nodes. (A leader that let its waiters go before promoting would send B to a share without
    the entry, to compile it again.) The jobs keep XLA's caches out of the cache folder
    themselves: the two tiers' paths differ here, and jax 0.10 would hash each into the keys;
    on a cluster every node has its tier at one path."""
    work = tmp_path / "work"
    work.mkdir()
    point, pause = tmp_path / "share", tmp_path / "paused"
    environ = clean_environ(JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="none")
    nodes = []

    def node(name: str, **override: str) -> Node:
        (tmp_path / name).mkdir()
        config = {**FLIGHT_CONFIG, "local_tier": {"mode": "on", "folder": str(tmp_path / name)}}
        nodes.append(Node(work, sshfs_mount, name, point, job_commands(work, name, 1, 1), environ,
                          root=point / "cache", config=config, override=override))
        return nodes[-1]

    try:
        node("node-a", GPU_CACHE_TIER_TEST_PAUSE=str(pause))
        wait_ready(work, 1, nodes)
        go(work)
        waited = time.monotonic() + 240
        while not pause.exists():
            assert nodes[0].proc.poll() is None and time.monotonic() < waited, "A never promoted"
            time.sleep(0.05)
        b = node("node-b")  # the go file is there: B's job goes as soon as it has imported jax
        while not has_open_below(b.jobs[0], point / "cache" / "locks" / "jax", ".lock"):
            assert b.proc.poll() is None and time.monotonic() < waited, "B never missed the key"
            time.sleep(0.05)
        time.sleep(5)  # ample for B to compile the key, were it let go
        pause.unlink()
        results = [n.result() for n in nodes]
    finally:
        pause.unlink(missing_ok=True)
        for each in nodes:
            each.kill()
    assert all(r["tier"]["on"] and r["single_flight"]["mode"] == "cluster" for r in results), results
    sections = records(sshfs_mount.server_dir / "cache", "jax")
    compiled = compiles_per_key(sections)
    assert len(compiled) == 1 and set(compiled.values()) == {1}, compiled
    assert sum(s["tier"]["promoted"] for s in sections) == 1
    a_job, b_job = (outputs(r)[0] for r in results)
    assert (a_job["compiled"], b_job["compiled"], b_job["loaded"]) == (1, 0, 1)


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_leader_killed_or_stopped_on_one_node_frees_the_other_node_within_the_lease_bound(
        sshfs_mount, tmp_path, fault):
    """Node A's only job holds the key's lease and is killed or stopped mid-compile; node B's job
    waits on that lease. B cannot see A's processes: it passes the lease over once its beat
    has not changed for LEASE_STALE seconds, compiles, and finishes (a stopped A, resumed,
    finishes too). The nodes mount the share at different paths: the lock and lease names
    are the same all the same."""
    stale, poll = lease_bound()
    work = tmp_path / "work"
    work.mkdir()
    seen = leader_fault(work, sshfs_mount, fault, (tmp_path / "a" / "share", tmp_path / "b" / "share"),
                        clean_environ(), FLIGHT_CONFIG)
    print(f"{fault} of node A's leader: node B went on after {seen['went_on']:.2f} s (LEASE_STALE {stale} s)")
    assert seen["lease_alive_before"]  # B did not pass over a lease that was beating
    assert stale - 1.5 <= seen["went_on"] <= stale + poll + 5, seen["went_on"]
    (done_b,) = outputs(seen["b"])
    assert done_b["compiled"] == 1
    root = sshfs_mount.server_dir / "cache"
    (flight_b,) = [s["single_flight"] for s in records(root, "jax") if s["single_flight"]["leases_passed"]]
    assert flight_b["led"] == 1 and flight_b["leases_passed"] == 1 and flight_b["gave_up"] == 0
    if fault == "SIGSTOP":
        (done_a,) = outputs(seen["a"])  # resumed, it finishes its own compile
        assert done_a["values"] == done_b["values"]
    else:
        assert seen["a"]["runs"][0]["returncode"] == -signal.SIGKILL
    folder = root / "locks" / "jax"
    assert not list(folder.glob("*.lock"))  # leases and locks of finished leaders are gone
    assert not [p for p in folder.glob("*.lease") if (lease_holder(p) or ("",))[0] == "node-b"]


def _race(folder: str, rounds: int, take, results) -> None:
    """One racer: per round, wait for its go file, then ``take`` the round's name (what it
    returns is counted, or the type of the error it raised)."""
    seen = Counter()
    for n in range(rounds):
        while not os.path.exists(os.path.join(folder, f"go{n}")):
            pass
        try:
            seen[take(os.path.join(folder, f"key{n}"))] += 1
        except OSError as exc:
            seen[type(exc).__name__] += 1
    results.put(dict(seen))


def _hook_create(path: str) -> str:
    os.close(hook_piece("locks").create(path, 0))
    return "won"


def _package_lock(path: str) -> str:
    from gpu_cache.core.safe_locks import exclusive_lock

    with exclusive_lock(path, timeout=60) as held:
        return "held" if held else "not held"


@pytest.mark.parametrize("side", ["hook", "package"])
def test_an_exclusive_create_that_loses_a_race_on_sshfs_says_the_name_exists(sshfs_mount, side):
    """Three mounts of one share, two racers each, race for each of 200 names. sshfs answers a
    create that loses the race with EPERM (233 of 1000 losers here); the hook took it for "locks
    do not work" and turned single-flight off for the whole job (CI, #22), and gpu-cache's own
    locks (prune, unpack) raised it. The hook's create now says FileExistsError to every loser
    (each name has one winner); gpu-cache's lock is taken every time."""
    take = _hook_create if side == "hook" else _package_lock
    mounts = [sshfs_mount.mount_point, sshfs_mount.mount(), sshfs_mount.mount()]
    (mounts[0] / "race").mkdir()
    rounds, context = 200, multiprocessing.get_context("fork")
    results = context.Queue()
    racers = [context.Process(target=_race, args=(str(m / "race"), rounds, take, results))
              for m in mounts for _ in range(2)]
    for racer in racers:
        racer.start()
    for n in range(rounds):
        time.sleep(0.01)
        (sshfs_mount.server_dir / "race" / f"go{n}").touch()
    seen = Counter()
    for _ in racers:
        seen.update(results.get(timeout=120))
    for racer in racers:
        racer.join(timeout=30)
    losers = rounds * (len(racers) - 1)
    assert seen == ({"won": rounds, "FileExistsError": losers} if side == "hook"
                    else {"held": rounds * len(racers)}), seen


def test_names_do_not_depend_on_the_mount_path() -> None:
    """The lock name of a key is the same whatever path the share is mounted at (issue 22:
    ``lock_name`` mixed in a hash of the mount path); a cache folder outside the root keeps
    its own names."""
    names = []
    for root, where in (("/mnt/a/share/cache", "/mnt/a/share/cache/jax"),
                        ("/scratch/b/cache", "/scratch/b/cache/jax"), ("/scratch/b/cache", "/elsewhere/jax")):
        program = f"import gpu_cache_hook.flight as f; print(f.lock_name('jit_f-0123', {where!r}))"
        shown = subprocess.run([sys.executable, "-c", program],
                               env=clean_environ(PYTHONPATH=str(HOOK), GPU_CACHE_LOCKS=f"{root}/locks"),
                               capture_output=True, text=True, check=True)
        names.append(shown.stdout.strip())
    assert names[0] == names[1] != names[2]
