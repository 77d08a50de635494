"""The node-local tier, the job side (issue 23): real JAX compiles on CPU and real Triton
ahead-of-time compiles, each "node" a mount namespace whose own folder is bound at the one
fixed local-tier path (as on a cluster, where every node has its own disk at that path; jax
0.10 hashes the cache path into its keys). The shared tier is a plain folder here; the
two-node sshfs tests are tests/test_tier_nodes.py's.

What a user notices: a node with an empty local tier hits what another node compiled; entries
appear in the shared root whole or not at all, even when the promoting process is killed -9
between its temporary file and the link; a read-only root, a kind folder of another user or a
planted link never fail a job (entries stay local); the local tier stays within its bound,
least recently used entries first; a Triton cache manager of your own turns the tier off for
Triton, and the record says so.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_cache.core import hook_records
from helpers import SCRIPTS, TINY, clean_environ, unavailable
from tier_local import node_env, on_node

#: Every test here binds a node's folder in a mount namespace of its own (a mount: slow).
pytestmark = pytest.mark.slow

TRITON = [sys.executable, "-m", "gpu_cache.workloads.triton_kernels", "--shape", "64", "--mode", "aot"]
TMP_PREFIX = ".gpu-cache-tmp."


@pytest.fixture(autouse=True)
def _root_and_unshare():
    if os.geteuid() != 0:
        unavailable("needs root (mount namespaces, bind mounts, chown)")


@pytest.fixture
def tier(tmp_path):
    """The shared root (with its kind folders, as gpu-cache env makes them) and the fixed
    local-tier path every node binds its own folder at."""
    root = tmp_path / "cache root"
    for kind in ("jax", "triton", "inductor"):
        (root / kind).mkdir(parents=True)
    local = tmp_path / "local tier"
    local.mkdir()
    return root, local


def run_on(node: Path, local: Path, command: list[str], environ: dict[str, str]) -> tuple[dict, str]:
    """Run ``command`` on a node; its record (the one process of the records folder) and stderr."""
    proc = on_node(node, local, command, environ)
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    records = list(Path(environ["GPU_CACHE_RECORDS"]).glob("*.json"))
    assert len(records) == 1, records
    return json.loads(records[0].read_text()), err


def jax_job(tmp_path: Path) -> list[str]:
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    return [sys.executable, str(script)]


def entries(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.glob("*-cache")}


def temporaries(folder: Path) -> list[Path]:
    return list(folder.rglob(f"{TMP_PREFIX}*"))


def test_a_second_node_hits_the_jax_entries_the_first_promoted(tmp_path, tier):
    root, local = tier
    job = jax_job(tmp_path)
    first, _ = run_on(tmp_path / "node-a", local, job, node_env(root, local, tmp_path / "rec-a"))
    assert first["jax"]["misses"] == 3
    assert first["jax"]["tier"]["promoted"] == 3 and first["jax"]["tier"]["state"] == "on"
    shared = entries(root / "jax")
    assert shared == entries(tmp_path / "node-a" / "jax") and len(shared) == 3  # whole, byte for byte
    assert not temporaries(root)

    second, _ = run_on(tmp_path / "node-b", local, job, node_env(root, local, tmp_path / "rec-b"))
    assert (second["jax"]["hits"], second["jax"]["misses"]) == (3, 0)
    counts = second["jax"]["tier"]
    assert (counts["fetched"], counts["promoted"]) == (3, 0)
    assert counts["fetched_bytes"] == sum(len(v) for v in shared.values())
    assert entries(tmp_path / "node-b" / "jax") == shared
    assert not temporaries(tmp_path / "node-b")
    tiers = [record["jax"]["tier"] for folder in ("rec-a", "rec-b")
             for record in hook_records.read(tmp_path / folder)]
    assert [(t["fetched"], t["promoted"], t["promote_failed"], t["state"]) for t in tiers] == \
        [(0, 3, 0, "on"), (3, 0, 0, "on")]


def test_a_second_node_hits_the_triton_groups_the_first_promoted(tmp_path, tier):
    root, local = tier
    first, _ = run_on(tmp_path / "node-a", local, TRITON, node_env(root, local, tmp_path / "rec-a"))
    assert first["triton"]["misses"] == 5 and first["triton"]["tier"]["promoted"] == 5
    groups = list((root / "triton").glob("*/__grp__*.json"))
    assert len(groups) == 5
    for group in groups:  # the shared group names the shared copies, each of them there
        children = json.loads(group.read_text())["child_paths"].values()
        assert all(Path(p).parent == group.parent and Path(p).is_file() for p in children)

    second, _ = run_on(tmp_path / "node-b", local, TRITON, node_env(root, local, tmp_path / "rec-b"))
    assert (second["triton"]["hits"], second["triton"]["misses"]) == (5, 0)
    assert second["triton"]["tier"]["fetched"] == 5
    for group in (tmp_path / "node-b" / "triton").glob("*/__grp__*.json"):  # local copies named
        children = json.loads(group.read_text())["child_paths"].values()
        assert all(Path(p).parent == local / "triton" / group.parent.name for p in children)
    assert not temporaries(root) and not temporaries(tmp_path / "node-b")


def killed_while_promoting(tmp_path: Path, root: Path, local: Path, command: list[str]) -> Path:
    """Run ``command`` on node A until its first promotion has written its temporary file and
    is about to link it; kill -9 it there. Returns node A's folder."""
    pause = tmp_path / "paused"
    environ = node_env(root, local, tmp_path / "rec-killed", GPU_CACHE_TIER_TEST_PAUSE=str(pause))
    proc = on_node(tmp_path / "node-a", local, command, environ, start_new_session=True)
    deadline = time.monotonic() + 240
    while not pause.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    return tmp_path / "node-a"


def test_kill_9_between_the_temporary_file_and_the_link_leaves_no_partial_jax_entry(tmp_path, tier):
    root, local = tier
    node = killed_while_promoting(tmp_path, root, local, jax_job(tmp_path))
    assert len(entries(node / "jax")) == 1  # written locally, whole
    assert entries(root / "jax") == {}  # nothing visible in the shared root
    left = temporaries(root / "jax")
    assert len(left) == 1 and left[0].parent == root / "jax"  # only the temporary file (prune's)
    assert left[0].read_bytes() == next(iter(entries(node / "jax").values()))

    # another node compiles, promotes whole entries, and hits them afterwards
    job = jax_job(tmp_path)
    run_on(tmp_path / "node-b", local, job, node_env(root, local, tmp_path / "rec-b"))
    assert len(entries(root / "jax")) == 3
    third, _ = run_on(tmp_path / "node-c", local, job, node_env(root, local, tmp_path / "rec-c"))
    assert (third["jax"]["hits"], third["jax"]["misses"]) == (3, 0)


def test_kill_9_during_a_triton_promotion_leaves_no_group_visible(tmp_path, tier):
    """Killed after its first child's temporary file: the shared root holds no group file, so
    Triton on another node misses that kernel (and compiles it) instead of reading half."""
    root, local = tier
    killed_while_promoting(tmp_path, root, local, TRITON)
    assert not list((root / "triton").glob("*/__grp__*"))
    assert len(temporaries(root / "triton")) == 1
    second, _ = run_on(tmp_path / "node-b", local, TRITON, node_env(root, local, tmp_path / "rec-b"))
    assert second["triton"]["misses"] == 5 and second["triton"]["tier"]["promoted"] == 5
    assert len(list((root / "triton").glob("*/__grp__*"))) == 5


def read_only(folder: Path):
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)


def test_a_read_only_root_keeps_entries_local_and_jobs_pass(tmp_path, tier):
    root, local = tier
    read_only(root)
    try:
        ran = {}
        for name, command in (("jax", jax_job(tmp_path)), ("triton", TRITON)):
            ran[name] = run_on(tmp_path / "node-a", local, command,
                               node_env(root, local, tmp_path / f"rec-{name}"))
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
    (jax_record, jax_err), (triton_record, triton_err) = ran["jax"], ran["triton"]
    assert jax_record["jax"]["tier"]["promoted"] == 0 and jax_record["jax"]["tier"]["promote_failed"] == 3
    assert triton_record["triton"]["tier"]["promote_failed"] == 5
    assert len(entries(tmp_path / "node-a" / "jax")) == 3
    assert len(list((tmp_path / "node-a" / "triton").glob("*/__grp__*"))) == 5
    assert not any((root / "jax").iterdir()) and not any((root / "triton").iterdir())
    for err in (jax_err, triton_err):
        assert err.count("gpu-cache: warning") == 1 and "Read-only file system" in err


NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.mark.parametrize("planted", ["another user's kind folder", "a link"])
def test_no_entry_goes_through_a_kind_folder_of_another_user_or_a_link(tmp_path, tier, planted):
    root, local = tier
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted == "a link":
        (root / "jax").rmdir()
        (root / "jax").symlink_to(elsewhere)
    else:
        os.chown(root / "jax", NOBODY, -1)
    # a filled node leaves its entries with the root (another node: nothing to fetch there)
    record, err = run_on(tmp_path / "node-a", local, jax_job(tmp_path),
                         node_env(root, local, tmp_path / "rec-a"))
    counts = record["jax"]["tier"]
    assert counts["promoted"] == 0 and counts["state"].startswith("off: ")
    assert ("is a link" if planted == "a link" else f"owned by uid {NOBODY}") in counts["state"]
    assert not any(elsewhere.iterdir())
    assert not any(p.name.endswith("-cache") for p in (root / "jax").iterdir())
    assert len(entries(tmp_path / "node-a" / "jax")) == 3  # the job ran with its local tier
    assert err.count("gpu-cache: warning") == 1


def fake_jax_entry(folder: Path, name: str, size: int, age: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-cache"
    path.write_bytes(b"x" * size)
    when = time.time() - age
    os.utime(path, (when, when))
    return path


def fake_triton_entry(folder: Path, key: str, size: int, age: float) -> Path:
    entry = folder / key
    entry.mkdir(parents=True)
    (entry / "k.cubin").write_bytes(b"x" * size)
    (entry / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": str(entry / "k.cubin")}}))
    when = time.time() - age
    for path in (*entry.iterdir(), entry):
        os.utime(path, (when, when))
    return entry


def test_the_local_tier_is_trimmed_to_its_bound_least_recently_used_first(tmp_path, tier):
    root, local = tier
    node = tmp_path / "node-a"
    old = [fake_jax_entry(node / "jax", f"old{i}", 100_000, 3600 * (10 - i)) for i in range(3)]
    triton_old = fake_triton_entry(node / "triton", "OLDKEY", 100_000, 3600 * 20)
    autotuned = fake_jax_entry(node / "jax/xla_gpu_per_fusion_autotune_cache_dir", "f", 100_000, 3600 * 30)
    recent = fake_jax_entry(node / "jax", "recent", 100_000, 600)
    environ = node_env(root, local, tmp_path / "rec-a", GPU_CACHE_TIER_MAX_BYTES="250000")
    run_on(node, local, jax_job(tmp_path), environ)
    # 612 kB to 250 kB: the four least recently used go, whatever their kind or layout (XLA's results)
    assert not any(p.exists() for p in (autotuned, triton_old, old[0], old[1]))
    assert old[2].exists() and recent.exists() and len(entries(node / "jax")) == 5  # and the job's 3
    assert sum(p.stat().st_size for p in node.rglob("*") if p.is_file()) <= 250_000

    # within ten minutes of the last trim, no process trims again
    again = fake_jax_entry(node / "jax", "again", 300_000, 3600)
    run_on(node, local, jax_job(tmp_path), node_env(root, local, tmp_path / "rec-b",
                                                     GPU_CACHE_TIER_MAX_BYTES="250000"))
    assert again.exists()


def test_a_trim_in_progress_elsewhere_is_not_waited_for(tmp_path, tier):
    root, local = tier
    node = tmp_path / "node-a"
    old = fake_jax_entry(node / "jax", "old", 300_000, 3600)
    lock = os.open(node / ".gpu-cache-trim.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        run_on(node, local, jax_job(tmp_path), node_env(root, local, tmp_path / "rec-a",
                                                         GPU_CACHE_TIER_MAX_BYTES="100000"))
        assert time.monotonic() - started < 60
    finally:
        os.close(lock)
    assert old.exists()


def test_your_own_triton_cache_manager_turns_the_tier_off_for_triton(tmp_path, tier):
    root, local = tier
    environ = node_env(root, local, tmp_path / "rec-a",
                       TRITON_CACHE_MANAGER="triton.runtime.cache:FileCacheManager")
    record, _ = run_on(tmp_path / "node-a", local, TRITON, environ)
    assert record["triton"]["tier"]["state"] == \
        "off: TRITON_CACHE_MANAGER=triton.runtime.cache:FileCacheManager is your own"
    assert record["triton"]["misses"] == 5 and not any((root / "triton").iterdir())


#: One job of the single-flight test: imports jax, says it is ready, waits for the go file, then
#: compiles three chains (three keys).
FLIGHT_JOB = r'''
import os, sys, time
import jax, jax.numpy as jnp, numpy as np
ready, go = sys.argv[1:3]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
def chain(n):
    def f(x):
        for i in range(n):
            x = jnp.tanh(x @ x.T * 0.01 + i)
        return x.sum()
    f.__name__ = f"chain{n}"
    return jax.jit(f)
print([round(float(chain(n)(np.ones((32, 32), np.float32))), 4) for n in (2, 3, 4)])
'''


def test_with_single_flight_two_nodes_compile_each_key_once_and_waiters_fetch_it(tmp_path, tier):
    """Two nodes, two processes each, one empty root, cluster single-flight: a waiter peeks at
    the SHARED folder, so it loads the leader's promoted entry wherever the leader ran."""
    root, local = tier
    job = tmp_path / "flight.py"
    job.write_text(FLIGHT_JOB)
    sync = tmp_path / "sync"
    sync.mkdir()
    records = tmp_path / "records"
    environ = node_env(root, local, records, GPU_CACHE_LOCKS=str(root / "locks"),
                       GPU_CACHE_LOCK_MODE="cluster", GPU_CACHE_LOCK_TIMEOUT="120")
    procs = [on_node(tmp_path / f"node-{n}", local, [sys.executable, str(job), str(sync / f"ready-{n}{i}"),
                                                     str(sync / "go")], environ)
             for n in "ab" for i in range(2)]
    deadline = time.monotonic() + 120
    while len(list(sync.glob("ready-*"))) < 4 and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs]
        time.sleep(0.01)
    (sync / "go").touch()
    done = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert all(rc == 0 for rc, _out, _err in done), [err[-2000:] for _rc, _out, err in done]
    assert len({out for _rc, out, _err in done}) == 1  # the same results everywhere
    sections = [json.loads(p.read_text())["jax"] for p in records.glob("*.json")]
    assert sum(s["misses"] for s in sections) == 3 and sum(s["hits"] for s in sections) == 9
    assert sum(s["tier"]["promoted"] for s in sections) == 3 and len(entries(root / "jax")) == 3
    assert not temporaries(root)


#: One job of the promotion test: FLIGHT_JOB's start, then one chain of 40 steps (seconds to
#: compile here: both jobs miss it before either writes it).
SLOW_JOB = FLIGHT_JOB.split("def chain")[0] + r'''
def fold(x):
    for i in range(40):
        x = jnp.tanh(x @ x.T * 0.01 + i) if i % 2 else jnp.sin(x * (i + 1)).cumsum(0)
    return x.sum()
print(float(jax.jit(fold)(np.ones((16, 16), np.float32))))
'''


def test_a_waiter_on_the_leaders_node_loads_its_entry_before_the_promotion_ends(tmp_path, tier):
    """Two jobs on one node miss one key at once; the leader writes the entry into the node's
    local tier and is held there, its promotion to the shared root not done (a slow network
    filesystem, a large entry). The waiter loads the local entry and finishes meanwhile, rather
    than waiting for a copy it does not need."""
    root, local = tier
    job, sync, pause = tmp_path / "slow.py", tmp_path / "sync", tmp_path / "paused"
    job.write_text(SLOW_JOB)
    sync.mkdir()
    records = tmp_path / "records"
    environ = node_env(root, local, records, GPU_CACHE_LOCKS=str(root / "locks"),
                       GPU_CACHE_LOCK_TIMEOUT="300",
                       GPU_CACHE_TIER_TEST_PAUSE=str(pause))  # whichever leads is held
    procs = [on_node(tmp_path / "node-a", local, [sys.executable, str(job), str(sync / f"ready-{i}"),
                                                  str(sync / "go")], environ) for i in range(2)]
    try:
        deadline = time.monotonic() + 120
        while len(list(sync.glob("ready-*"))) < 2 and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs]
            time.sleep(0.01)
        (sync / "go").touch()
        deadline = time.monotonic() + 240
        while not pause.exists():
            assert time.monotonic() < deadline, "the leader never promoted"
            time.sleep(0.05)
        deadline = time.monotonic() + 60  # the waiter's load takes well under a second here
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        waiter = next((p for p in procs if p.poll() is not None), None)
        assert waiter is not None, "the waiter waited for the leader's promotion"
        assert pause.exists()  # the leader is still held: nothing in the shared root yet
    finally:
        pause.unlink(missing_ok=True)
    done = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert all(rc == 0 for rc, _out, _err in done), [err[-2000:] for _rc, _out, err in done]
    assert len({out for _rc, out, _err in done}) == 1
    sections = {record["pid"]: record["jax"] for record in hook_records.read(records)}
    first = sections[waiter.pid]  # (on_node execs the job: its pid is the job's)
    assert (first["misses"], first["hits"], first["single_flight"]["hits_after_wait"]) == (0, 1, 1)
    assert first["tier"]["fetched"] == 0  # the local entry, not a copy of the shared one
    assert len(entries(root / "jax")) == 1 and not temporaries(root)


def test_xla_autotune_results_are_copied_in_at_import_and_promoted_at_exit(tmp_path, tier):
    """XLA writes no per-fusion autotune files on CPU: files stand in for them on both sides
    (the H200 figures show XLA writing and reusing real ones through the tier)."""
    root, local = tier
    shared = root / "jax" / "xla_gpu_per_fusion_autotune_cache_dir"
    shared.mkdir()
    (shared / "from-node-b.textproto").write_text("results of node b\n")
    node = tmp_path / "node-a"
    mine = node / "jax" / "xla_gpu_per_fusion_autotune_cache_dir"
    mine.mkdir(parents=True)
    (mine / "from-node-a.textproto").write_text("results of node a\n")
    (mine / "half.textproto.tmp").write_text("being written\n")
    record, _ = run_on(node, local, jax_job(tmp_path), node_env(root, local, tmp_path / "rec-a"))
    assert (mine / "from-node-b.textproto").read_text() == "results of node b\n"
    assert (shared / "from-node-a.textproto").read_text() == "results of node a\n"
    assert not (shared / "half.textproto.tmp").exists()
    counts = record["jax"]["tier"]
    assert counts["fetched"] == 1 and counts["promoted"] == 4  # 3 entries and one results file


INDUCTOR_JOB = """
import torch
from torch._dynamo.utils import counters
torch.manual_seed(0)
def f(x, y):
    return (x.sin() + y.cos()).relu() * 2
x, y = torch.randn(64), torch.randn(64)
assert torch.allclose(torch.compile(f)(x, y), f(x, y), atol=1e-5)
print(counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""


@pytest.mark.slow
def test_a_second_node_hits_the_inductor_graphs_the_first_promoted(tmp_path, tier):
    pytest.importorskip("torch")
    root, _ = tier
    local = tmp_path / "local"  # Inductor's own C++ builds fail on a path with a space (torch 2.x)
    local.mkdir()
    job = tmp_path / "inductor_job.py"
    job.write_text(INDUCTOR_JOB)
    outputs = []
    for node in ("node-a", "node-b"):
        environ = node_env(root, local, tmp_path / f"rec-{node}", TORCHINDUCTOR_COMPILE_THREADS="1",
                           TORCHINDUCTOR_CACHE_DIR=str(local / "inductor"))
        proc = on_node(tmp_path / node, local, [sys.executable, str(job)], environ)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out.split())
        record = json.loads(next((tmp_path / f"rec-{node}").glob("*.json")).read_text())
        outputs.append(record["inductor"]["tier"])
    (first, first_tier), (second, second_tier) = outputs[0:2], outputs[2:4]
    assert first == ["0", "1"] and first_tier["promoted"] > 0
    assert second == ["1", "0"] and second_tier["fetched"] == first_tier["promoted"]
    assert not temporaries(root)


def test_a_link_planted_in_the_shared_root_is_never_followed(tmp_path, tier):
    """A child of a promoted Triton group and a JAX entry replaced by links to a file of the
    user's own: node B copies neither, compiles those two, and its job passes."""
    root, local = tier
    run_on(tmp_path / "node-a", local, TRITON, node_env(root, local, tmp_path / "rec-a"))
    run_on(tmp_path / "node-a", local, jax_job(tmp_path), node_env(root, local, tmp_path / "rec-a2"))
    secret = tmp_path / "secret"
    secret.write_text("not a kernel\n")
    cubin = next((root / "triton").glob("*/*.cubin"))
    cubin.unlink()
    cubin.symlink_to(secret)
    entry = next((root / "jax").glob("*-cache"))
    entry.unlink()
    entry.symlink_to(secret)
    triton, err = run_on(tmp_path / "node-b", local, TRITON, node_env(root, local, tmp_path / "rec-b"))
    assert (triton["triton"]["hits"], triton["triton"]["misses"]) == (4, 1)
    assert err.count("gpu-cache: warning") == 1
    jax, _ = run_on(tmp_path / "node-b", local, jax_job(tmp_path), node_env(root, local, tmp_path / "rec-b2"))
    assert (jax["jax"]["hits"], jax["jax"]["misses"]) == (2, 1)
    node = tmp_path / "node-b"
    assert not any(p.is_symlink() or p.read_bytes() == secret.read_bytes()
                   for p in node.rglob("*") if p.is_file() or p.is_symlink())


#: Triton's cache manager as the hook installs it, used as Triton's driver and autotuner use it
#: for files read alone: ``put`` of a launcher ``.so`` and an ``*.autotune.json``, then
#: ``get_file`` of each (in a process that imports triton, the hook installed the manager).
ALONE_FILES = r'''
import sys
import triton
from triton import knobs
manager = knobs.cache.manager_class
print(manager.__name__)
for name, data in (("launcher.so", b"\x7fELF launcher"), ("kernel.autotune.json", '{"key": 1}')):
    cache = manager("K" * 52)
    if sys.argv[1] == "put":
        cache.put(data, name, binary=isinstance(data, bytes))
    print(name, open(cache.get_file(name), "rb").read() if cache.get_file(name) else None)
'''


def test_files_triton_reads_alone_are_promoted_when_written_and_fetched_when_missing(tmp_path, tier):
    root, local = tier
    script = tmp_path / "alone.py"
    script.write_text(ALONE_FILES)
    proc = on_node(tmp_path / "node-a", local, [sys.executable, str(script), "put"],
                   node_env(root, local, tmp_path / "rec-a"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.startswith("TierCacheManager"), err[-2000:]
    shared = root / "triton" / ("K" * 52)
    assert (shared / "launcher.so").read_bytes() == b"\x7fELF launcher"
    assert (shared / "kernel.autotune.json").read_text() == '{"key": 1}'
    proc = on_node(tmp_path / "node-b", local, [sys.executable, str(script), "get"],
                   node_env(root, local, tmp_path / "rec-b"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "launcher.so b'\\x7fELF launcher'" in out and """kernel.autotune.json b'{"key": 1}'""" in out
    assert (tmp_path / "node-b" / "triton" / ("K" * 52) / "launcher.so").is_file()


def test_a_second_node_neither_builds_the_launcher_nor_benchmarks_again(tmp_path, tier):
    """Triton's real CUDA utils library (built with a counting C compiler) and an autotune
    result (a benchmark that stands in for the GPU's) made on node A are promoted when written;
    node B, with an empty local tier, copies them in and builds and benchmarks nothing
    (tests/fixtures/triton_files.py, the jobs of tests/test_flight_triton_files.py)."""
    sys.path.insert(0, str(SCRIPTS.parent / "tests" / "fixtures"))
    import triton_files

    root, local = tier
    tools = tmp_path / "tools"
    job = SCRIPTS.parent / "tests" / "fixtures" / "triton_files.py"
    (tmp_path / "go").touch()
    found = {}
    for node in ("node-a", "node-b"):
        for what in ("launcher", "autotune"):
            environ = node_env(root, local, tmp_path / f"rec-{node}-{what}", **triton_files.prepare(tools))
            proc = on_node(tmp_path / node, local, [sys.executable, str(job), str(tmp_path / f"ready-{node}"),
                                                    str(tmp_path / "go"), what, str(tools), "0"], environ)
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-2000:]
            found[node, what] = json.loads(out.strip().splitlines()[-1])
    assert triton_files.calls(tools, "cc") == 1 and triton_files.calls(tools, "bench") == 1
    assert found["node-b", "autotune"]["chosen"]["BLOCK"] == 128
    assert len(list((root / "triton").glob("*/cuda_utils*.so"))) == 1
    assert len(list((root / "triton").glob("*/scale_kernel.autotune.json"))) == 1
    assert len(list((tmp_path / "node-b" / "triton").glob("*/scale_kernel.autotune.json"))) == 1


def test_through_gpu_cache_env_a_second_node_hits_what_the_first_compiled(tmp_path, tier):
    """The variables as ``gpu-cache env`` exports them with ``local_tier: {mode: on}`` (the
    local folder ``<folder>/<hash of the root>``; each node binds its own disk at ``<folder>``),
    single-flight and records on: node B hits every JAX entry and Triton kernel node A made."""
    from gpu_cache.config.settings import settings_from
    from gpu_cache.jobenv import env

    root, _ = tier
    folder = tmp_path / "tier folder"
    settings = settings_from({"local_tier": {"mode": "on", "folder": str(folder)}}, cache_root=str(root))
    base = clean_environ(TRITON_DEFAULT_FP_FUSION="1")
    environ = env.job_environ(env.resolve(settings, base), base)
    assert environ["GPU_CACHE_TIER"].startswith(str(folder)) and environ["GPU_CACHE_SHARED"] == str(root)
    job = jax_job(tmp_path)
    for node in ("node-a", "node-b"):
        for command in (job, TRITON):
            proc = on_node(tmp_path / node, folder, command, environ)
            _out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
    found = list(hook_records.read(root / "records"))
    by_node = {}
    for record in sorted(found, key=lambda r: r["time"]):
        for kind in ("jax", "triton"):
            if kind in record:
                by_node.setdefault(kind, []).append((record[kind]["hits"], record[kind]["misses"],
                                                     record[kind]["tier"]["fetched"],
                                                     record[kind]["tier"]["promoted"]))
    assert by_node["jax"] == [(0, 3, 0, 3), (3, 0, 3, 0)]
    assert by_node["triton"] == [(0, 5, 0, 5), (5, 0, 5, 0)]


def test_a_link_at_a_triton_key_folder_of_the_shared_root_is_never_read_through(tmp_path, tier):
    """A Triton key folder of the shared root swapped for a link to a folder of the user's own,
    whole and with that kernel's very files (as one who can rename in the root could do): node B
    does not read through it (the tier is off for Triton there, with one line), compiles that
    kernel itself, and its job passes."""
    root, local = tier
    run_on(tmp_path / "node-a", local, TRITON, node_env(root, local, tmp_path / "rec-a"))
    key = next((root / "triton").glob("*/__grp__*.json")).parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    key.rename(elsewhere / key.name)
    key.symlink_to(elsewhere / key.name, target_is_directory=True)
    second, err = run_on(tmp_path / "node-b", local, TRITON, node_env(root, local, tmp_path / "rec-b"))
    part = second["triton"]
    assert key.name in {m["key"] for m in part["missed"]}, part["missed"]
    assert part["tier"]["fetched"] < 5 and "is a link or not a folder" in part["tier"]["state"], part["tier"]
    assert err.count("gpu-cache: warning") == 1
    assert not any(p.is_symlink() for p in (tmp_path / "node-b" / "triton").rglob("*"))


def test_a_promotion_never_replaces_the_entry_the_shared_root_holds_under_its_name(tmp_path, tier):
    """The shared root holds an entry under a name node B is about to promote (here one that is
    not whole: B does not copy it in, so it compiles and promotes that key itself): the root's
    entry keeps its inode and its bytes; B's own stays on B (a promotion links a new name, never
    renames over one)."""
    root, local = tier
    job = jax_job(tmp_path)
    run_on(tmp_path / "node-a", local, job, node_env(root, local, tmp_path / "rec-a"))
    taken = next(iter(sorted((root / "jax").glob("*-cache"))))
    whole = taken.read_bytes()
    taken.write_bytes(whole[: len(whole) // 2])  # truncated in place: same inode
    before = (os.stat(taken).st_ino, taken.read_bytes())
    second, _ = run_on(tmp_path / "node-b", local, job, node_env(root, local, tmp_path / "rec-b"))
    assert second["jax"]["misses"] == 1 and second["jax"]["tier"]["fetched"] == 2, second["jax"]
    assert (os.stat(taken).st_ino, taken.read_bytes()) == before
    assert (tmp_path / "node-b" / "jax" / taken.name).read_bytes() != before[1]
    assert not temporaries(root)
