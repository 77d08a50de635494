"""The node-local tier (issue 23) on two nodes (tests/harness/nodes.py: each node its own ``/tmp``, so its
own local tier, and its own sshfs mount of one share): jobs on node A compile and promote while
node B reads the share.

* The crash stress of triton-lang/triton#11512 (every process compiles the same kernel at the same
  instant, on both nodes, on a fresh root) and JAX used in parallel (jax-ml/jax#22718): through the
  tier no compile fails and the share ends with every key whole; plain Triton and JAX straight on
  the share run alongside, their failures printed (1 of 640 here: ESTALE; see
  tests/benchmarks/tier_stress.py for the figures).
* Promotion under kill -9: a job on node A stops itself (SIGSTOP) at a chosen step of a promotion
  into the shared root (creating its temporary file, linking it to the entry's name, removing the
  temporary file; the n-th of each, for Triton groups of 8 files and for JAX entries), and is then
  SIGKILLed. While it is stopped and after the kill, node B sees only whole entries on the share
  (every Triton group complete, every JAX entry decodes) and every entry that was whole before is
  still there; a job on node B through the tier then gets every key: hits for what A promoted,
  compiles (and promotes) the rest, and the share ends with every entry whole.
* The bound: the local tier is trimmed to ``local_tier.max_size``, least recently used whole
  entries first; the share keeps them, and a later job on the node gets them back as hits.
* Real ``sbatch`` jobs through the tier on both nodes: the job on gcnode-a compiles and promotes,
  the job on gcnode-b hits what it promoted, each node keeps its own local copy.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, clean_environ
from tier_jobs import jax_entries, job_env, local_folder, stress_round, triton_groups, worker, worker_argv

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="namespaced nodes and sshfs mounts need root")

CONFIG = {"single_flight": {"timeout": "5m"}}
#: (kind, step, n): where node A's job stops and is killed. Each Triton job promotes 2 groups
#: of 8 files (7 children, then the group file): link 7 is the first group's last child, link 8
#: its group file, link 9 the next group's first child.
KILL_POINTS = [
    ("triton", "tmp", 1), ("triton", "link", 1), ("triton", "unlink", 1), ("triton", "link", 7),
    ("triton", "link", 8), ("triton", "unlink", 8), ("triton", "tmp", 9), ("triton", "link", 9),
    ("triton", "link", 16), ("triton", "unlink", 16),
    ("jax", "tmp", 1), ("jax", "link", 1), ("jax", "unlink", 1), ("jax", "link", 2),
]
KEYS = 2
#: What node B sees of a cache root: ``{"triton": {key: whole}, "jax": {entry: whole}}``.
HARNESS = str(REPO / "tests" / "harness")
SEEN = ("import json, sys; sys.path[:0] = [sys.argv[2]]; from pathlib import Path; import tier_jobs as t; "
        "r = Path(sys.argv[1]); print(json.dumps({'triton': t.triton_groups(r / 'triton'), "
        "'jax': t.jax_entries(r / 'jax')}))")


def seen_on(node, root: Path) -> dict[str, dict[str, bool]]:
    done = node.run([sys.executable, "-c", SEEN, str(root), HARNESS], env=clean_environ(),
                    check=True)
    return json.loads(done.stdout)


def on_share(two_nodes, root: Path) -> dict[str, dict[str, bool]]:
    """What the share holds (the storage node's folder, seen by no node's cache)."""
    host = two_nodes.host_path(root)
    return {"triton": triton_groups(host / "triton", seen_as=root / "triton"),
            "jax": jax_entries(host / "jax")}


def broken(seen: dict[str, dict[str, bool]]) -> list[str]:
    return [f"{kind}/{name}" for kind, entries in seen.items()
            for name, whole in entries.items() if not whole]


def lost(before: dict[str, dict[str, bool]], after: dict[str, dict[str, bool]]) -> list[str]:
    return [f"{kind}/{name}" for kind, entries in before.items() for name, whole in entries.items()
            if whole and not after[kind].get(name)]


def run_job(node, argv: list[str], env: dict[str, str], timeout: float = 300) -> dict:
    done = node.run(argv, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == [], result["failed"]
    return result


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


@pytest.mark.parametrize("kind", ["triton", "jax"])
def test_the_crash_stress_through_the_tier_fails_no_compile(two_nodes, kind):
    work = two_nodes.workdir / f"tier-stress-{kind}"
    work.mkdir()
    program = worker(work)
    config = work / "config.json"
    config.write_text(json.dumps(CONFIG))
    procs, keys = (3, 6) if kind == "triton" else (2, 3)
    for rnd in range(2):
        plain = stress_round(two_nodes, program, config, kind, "plain", rnd, procs, keys, by_hand=False)
        print(f"plain {kind} on the share, round {rnd}: "
              f"{sum(len(d['failed']) for d in plain['done'])} of {2 * procs * keys} compiles failed, "
              f"{len(plain['crashed'])} processes crashed")
        tier = stress_round(two_nodes, program, config, kind, "tier", rnd, procs, keys, by_hand=False)
        assert not tier["crashed"], tier["crashed"]
        assert [d["failed"] for d in tier["done"]] == [[]] * (2 * procs), tier["done"]
        assert (tier["complete"], tier["broken"]) == (keys, 0)  # every key promoted whole
        assert len({json.dumps(d["values"]) for d in tier["done"]}) == 1
        assert sum(d["hits"] + d["misses"] for d in tier["done"]) == 2 * procs * keys


def test_promotion_killed_at_each_step_shows_node_b_no_partial_entry_and_loses_none(two_nodes):
    work = two_nodes.workdir / "tier-kill"
    work.mkdir()
    program = worker(work)
    config = work / "config.json"
    config.write_text(json.dumps(CONFIG))
    root = two_nodes.shared / "tier-kill"
    seen = {"triton": {}, "jax": {}}
    salts: dict[str, list[int]] = {"triton": [], "jax": []}
    for salt, (kind, step, nth) in enumerate(KILL_POINTS, start=1):
        point = f"{kind} {step} {nth}"
        marker = work / f"stopped-{salt}"
        stop = {"step": step, "nth": nth, "shared": str(root), "marker": str(marker)}
        argv = worker_argv(program, kind, KEYS, work / "sync", 0, 1, salts=[salt], stop_at=stop)
        errors = work / f"{salt}.err"
        with open(work / f"{salt}.out", "w") as out, open(errors, "w") as err:
            job = two_nodes.a.popen(argv, env=job_env(two_nodes.a, "tier", root, config, kind),
                                    stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + 300
            while not marker.exists() or state(job.pid) != "T":
                assert job.poll() is None, f"{point}: never reached ({errors.read_text()[-2000:]})"
                assert time.monotonic() < deadline, f"{point}: never reached"
                time.sleep(0.01)
            assert int(marker.read_text().split()[0]) == job.pid
            during = [seen_on(two_nodes.b, root), on_share(two_nodes, root)]  # A stopped
            os.kill(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        after = [seen_on(two_nodes.b, root), on_share(two_nodes, root)]
        assert job.returncode == -signal.SIGKILL
        assert not [broken(v) for v in (*during, *after) if broken(v)], point
        # node B's sshfs may list a folder from its cache: what was lost is asked of the share
        assert not lost(seen, during[1]) and not lost(seen, after[1]), f"{point}: {lost(seen, after[1])}"
        seen = after[1]
        salts[kind].append(salt)
    # The killed jobs promoted some whole entries: node B's jobs through the tier hit exactly
    # those, compile the rest, and the share ends with every entry of every key whole.
    whole = {kind: sum(entries.values()) for kind, entries in seen.items()}
    # whole once a group file (link 8, link 16) or a JAX entry (link 1) is linked: unlink 8 (1
    # group), tmp 9, link 9 and link 16 (1 each), unlink 16 (2); JAX's unlink 1 and link 2
    assert whole == {"triton": 6, "jax": 2}, whole
    for kind in ("triton", "jax"):
        argv = worker_argv(program, kind, KEYS, work / "sync-b", 0, 1, salts=salts[kind])
        done = run_job(two_nodes.b, argv, job_env(two_nodes.b, "tier", root, config, kind))
        assert done["ok"] == KEYS * len(salts[kind])
        assert done["hits"] == whole[kind], (kind, done, whole)
        assert done["misses"] == KEYS * len(salts[kind]) - whole[kind]
    final = on_share(two_nodes, root)
    assert not broken(final) and not lost(seen, final)
    assert {kind: len(entries) for kind, entries in final.items()} == \
        {kind: KEYS * len(salts[kind]) for kind in salts}


LOCAL_SIZE = ("import os, sys; r = os.path.join(sys.argv[1], 'triton'); "
              "print(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(r) for f in fs))")
#: Ages the local Triton entries and the trim stamp by two hours (as if used long ago).
AGE = ("import os, sys, time; r = sys.argv[1]; old = time.time() - 7200\n"
       "for d, _, fs in os.walk(r):\n"
       "    for p in [d, *(os.path.join(d, f) for f in fs)]:\n"
       "        os.utime(p, (old, old), follow_symlinks=False)\n")
KEYS_HERE = "import os, sys; print(' '.join(sorted(os.listdir(os.path.join(sys.argv[1], 'triton')))))"


def test_the_local_tier_is_trimmed_to_its_max_size_and_the_share_keeps_what_it_trims(two_nodes):
    work = two_nodes.workdir / "tier-bound"
    work.mkdir()
    program = worker(work)
    root = two_nodes.shared / "tier-bound"
    local = local_folder(root)
    node = two_nodes.a
    config = work / "config.json"
    config.write_text(json.dumps(CONFIG))

    def python(code: str) -> str:
        return node.run([sys.executable, "-c", code, str(local)], check=True).stdout.strip()

    first = run_job(node, worker_argv(program, "triton", 6, work / "sync", 0, 1, salts=[1]),
                    job_env(node, "tier", root, config))
    assert first["misses"] == 6
    old_keys, old_size = set(python(KEYS_HERE).split()), int(python(LOCAL_SIZE))
    assert len(old_keys) == 6
    python(AGE)
    bound = old_size * 3 // 2  # room for nine of the twelve entries
    config.write_text(json.dumps({**CONFIG, "local_tier": {"max_size": f"{bound}B"}}))
    environ = job_env(node, "tier", root, config)
    assert environ["GPU_CACHE_TIER_MAX_BYTES"] == str(bound)
    second = run_job(node, worker_argv(program, "triton", 6, work / "sync", 0, 1, salts=[2]), environ)
    assert second["misses"] == 6
    keys = set(python(KEYS_HERE).split())
    assert int(python(LOCAL_SIZE)) <= bound
    kept = keys & old_keys  # least recently used first: only entries used long ago went
    assert len(keys - old_keys) == 6 and len(kept) < 6, (len(keys - old_keys), len(kept))
    here = json.loads(node.run([sys.executable, "-c", SEEN, str(local), HARNESS],
                               env=clean_environ(), check=True).stdout)["triton"]
    assert set(here) == keys and all(here.values())  # whole entries went: no folder left half
    shared = on_share(two_nodes, root)["triton"]
    assert len(shared) == 12 and all(shared.values())  # the share keeps all of them
    again = run_job(node, worker_argv(program, "triton", 6, work / "sync", 0, 1, salts=[1]), environ)
    assert (again["hits"], again["misses"]) == (6, 0)  # what went is fetched back from the share
    assert old_keys <= set(python(KEYS_HERE).split())


def test_sbatch_jobs_through_the_tier_on_both_nodes(slurm_two_nodes, two_nodes):
    """gcnode-a's job compiles 4 Triton kernels and 4 JAX functions and promotes them; gcnode-b's
    job, later, hits every one of them through its own local tier."""
    cluster = slurm_two_nodes
    work = two_nodes.workdir / "tier-sbatch"
    work.mkdir()
    program = worker(work)
    root = two_nodes.shared / "tier-sbatch"
    config = work / "config.json"
    config.write_text(json.dumps(CONFIG))
    commands = [shlex.join(worker_argv(program, kind, 4, work / "sync", 0, 1)) for kind in ("triton", "jax")]
    script = "\n".join([
        "#!/bin/sh", "set -e",
        f'eval "$({shlex.quote(sys.executable)} -m gpu_cache env --cache-root {shlex.quote(str(root))} '
        f'--config {shlex.quote(str(config))})"',
        'echo "host $(hostname) tier $GPU_CACHE_TIER"', *commands, ""])
    results = {}
    for node in (two_nodes.a, two_nodes.b):
        out = work / f"{node.name}.out"
        done = two_nodes.head.run(["sbatch", "--parsable", f"--nodelist={node.hostname}", f"--output={out}",
                                   "--job-name=tier"], input=script, timeout=30, cwd=str(work),
                                  env=clean_environ(SLURM_CONF=str(cluster.slurm_conf)))
        assert done.returncode == 0, done.stderr
        job = int(done.stdout.strip().split(";")[0])
        job_state = cluster.wait_job(job, timeout=300)
        text = out.read_text() if out.exists() else ""
        assert job_state == "COMPLETED", f"job {job} {job_state}:\n{text[-3000:]}"
        assert f"host {node.hostname} tier {local_folder(root)}" in text.splitlines(), text
        triton_run, jax_run = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert triton_run["failed"] == [] and jax_run["failed"] == []
        results[node.name] = (triton_run, jax_run)
        local = node.run([sys.executable, "-c", SEEN, str(local_folder(root)), HARNESS],
                         env=clean_environ(), check=True)
        mine = json.loads(local.stdout)
        assert len(mine["triton"]) == 4 and all(mine["triton"].values())  # each node its own copy
        assert len(mine["jax"]) == 4 and all(mine["jax"].values())
    for run in results["a"]:
        assert (run["misses"], run["hits"]) == (4, 0)
    for run in results["b"]:
        assert (run["misses"], run["hits"]) == (0, 4)  # what gcnode-a promoted
    shared = seen_on(two_nodes.b, root)
    assert len(shared["triton"]) == 4 and all(shared["triton"].values())
    assert len(shared["jax"]) == 4 and all(shared["jax"].values())
    records = [json.loads(p.read_text()) for p in two_nodes.host_path(root / "records").glob("*.json")]
    for kind in ("triton", "jax"):
        tiers = [r[kind]["tier"] for r in records if r.get(kind, {}).get("tier")]
        assert sum(t["promoted"] for t in tiers) == 4, tiers
        assert sum(t["fetched"] for t in tiers) == 4, tiers
        assert sum(t["promote_failed"] for t in tiers) == 0, tiers
