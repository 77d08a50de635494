"""The network-filesystem row of the README's fault table, proven on a real network filesystem:
sshfs over loopback (tests/harness/sshfs_mount.py: a private sshd on 127.0.0.1, an sshfs mount of a
server-side folder, type ``fuse.sshfs``). Every cache operation goes through the mount, i.e.
through SFTP over a real ssh connection; nothing of gpu-cache, JAX or Triton is mocked.

A second sshfs mount of the same server folder (``SshfsMount.mount()``) is a second client, as a
second node sees the share: FUSE keeps its locks and its attribute caches per mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.core.kinds import jax_format as jax_cache
from gpu_cache.core.kinds import tier_name as tier_digest
from gpu_cache.core.kinds import triton_format as triton_cache
from gpu_cache.jobenv.fs import check_folder
from helpers import (
    READER,
    SMALL,
    TINY,
    clean_environ,
    finish,
    jax_job_env,
    read_json,
    run_cli,
    start_many,
    write_config,
)

#: Jobs straight on the share: the node-local tier (on by default on sshfs, #23) off.
DIRECT = {"local_tier": {"mode": "off"}}
#: The job tests run both ways: straight on the share, and through the node-local tier (the
#: default on sshfs; its folder in the test's own tmp_path).
WAYS = [pytest.param("direct", id="direct"), pytest.param("tier", id="through-the-tier")]


def way(name: str, tmp_path: Path) -> dict:
    return DIRECT if name == "direct" else {"local_tier": {"folder": str(tmp_path / "node-local")}}


#: The small JAX transformer and the ahead-of-time Triton kernels (sm_90, no GPU needed).
JAX_AND_TRITON = {
    "workloads": {**SMALL["workloads"], "triton-kernels": {"shapes": [1000]}},
    "default_workloads": ["jax-transformer", "triton-kernels"],
    "validate": {"measure_cold": False},
}

# Three tiny programs, one entry each (as in test_safety): fast on 2 cores, distinct keys.
LOCK_PHRASE = "file locks there lock only within one machine"






def warnings_about_reads(stderr: str) -> int:
    return stderr.count("Error reading persistent compilation cache entry")


# ---------------------------------------------------------------- doctor / env


@pytest.fixture
def default_tier_of(sshfs_mount):
    """The default node-local tier folder of a root on the mount (under this machine's /tmp),
    removed after the test."""
    made: list[Path] = []

    def folder(root: Path) -> Path:
        made.append(Path("/tmp") / f"gpu-cache-{os.getuid()}" / "tier" / tier_digest(root))
        return made[-1]

    yield folder
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def test_doctor_names_sshfs_a_network_filesystem_whose_locks_stay_on_one_machine(sshfs_mount,
                                                                                 default_tier_of):
    root = sshfs_mount.mount_point / "cache"
    local = default_tier_of(root)
    result = run_cli("doctor", "--json", "--cache-root", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    for kind in ("jax", "triton", "inductor", "cuda"):
        check = report["kinds"][kind]
        assert (check["fs_type"], check["family"], check["network"]) == ("fuse.sshfs", "sshfs", True)
        assert check["problem"] is None and check["read_only"] is False
        assert any(LOCK_PHRASE in w for w in check["warnings"]), check["warnings"]
        assert check["missing"] and not (sshfs_mount.server_dir / "cache").exists()  # a diagnosis
    # one per exported kind's folder doctor probed (the registry decides how many; the hook's
    # records are a kind like the others, pruned like them)
    pruned_alone = [w for w in report["warnings"] if LOCK_PHRASE in w and "prune from one node" in w]
    assert len(pruned_alone) == len(report["kinds"])
    assert report["kinds"]["records"]["fs_type"] == "fuse.sshfs"
    # The root is on a network filesystem: the node-local tier is on by default (#23), in a
    # fixed folder under /tmp, where JAX keeps XLA's per-fusion autotune results safely.
    tier = report["tier"]
    assert tier["on"] is True and tier["mode"] == "auto" and tier["local"] == str(local)
    assert "fuse.sshfs, a network filesystem" in tier["why"]
    exported = report["exports"]["exports"]
    assert exported["JAX_COMPILATION_CACHE_DIR"] == str(local / "jax")
    assert exported["TRITON_CACHE_DIR"] == str(local / "triton")
    assert exported["CUDA_CACHE_PATH"] == str(root / "cuda")  # not tiered: stays in the root
    assert exported["GPU_CACHE_SHARED"] == str(root) and exported["GPU_CACHE_TIER"] == str(local)
    assert exported["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "xla_gpu_per_fusion_autotune_cache_dir"
    assert not local.exists()  # a diagnosis makes nothing
    text = run_cli("doctor", "--cache-root", str(root))
    assert text.returncode == 0
    assert "fuse.sshfs [sshfs, network]" in text.stdout and "result: ok" in text.stdout
    assert "warning: jax:" in text.stdout and LOCK_PHRASE in text.stdout
    assert f"local tier: on in {local} (" in text.stdout
    assert run_cli("doctor", "--fix", "--cache-root", str(root)).returncode == 0  # --fix makes them
    assert (sshfs_mount.server_dir / "cache" / "jax").is_dir()  # over ssh
    assert (local / "jax").is_dir() and oct(local.stat().st_mode & 0o777) == "0o700"
    # On local disk: no lock warning.
    assert not any("file locks" in w for w in check_folder(sshfs_mount.workdir / "local").warnings)


def test_xla_caches_all_is_exported_as_none_on_sshfs_without_the_tier_and_said(sshfs_root, tmp_path):
    config = write_config(tmp_path / "c.yaml", {"xla_caches": "all", **DIRECT})
    result = run_cli("env", "--json", "--config", str(config), "--cache-root",
                     str(sshfs_root / "cache"))
    assert result.returncode == 0, result.stderr
    exports = json.loads(result.stdout)
    assert exports["exports"]["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    why = exports["adjusted"]["jax"]
    assert "fuse.sshfs" in why and "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none" in why \
        and "'all'" in why
    # The shell form exports the same and warns once on stderr.
    shell = run_cli("env", "--config", str(config), "--cache-root", str(sshfs_root / "cache"))
    assert "export JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES=none\n" in shell.stdout
    assert "instead of 'all'" in shell.stderr
    # The same config on local disk keeps 'all': the override comes from the mount.
    local = json.loads(run_cli("env", "--json", "--config", str(config), "--cache-root",
                               str(tmp_path / "local")).stdout)
    assert local["exports"]["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "all"
    assert local["adjusted"] == {}
    # With the node-local tier (sshfs's default) JAX writes on local disk: 'all' is kept.
    tiered = write_config(tmp_path / "t.yaml", {"xla_caches": "all",
                                                "local_tier": {"folder": str(tmp_path / "tier")}})
    through = json.loads(run_cli("env", "--json", "--config", str(tiered), "--cache-root",
                                 str(sshfs_root / "cache")).stdout)
    assert through["tier"]["on"] is True and through["adjusted"] == {}
    assert through["exports"]["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "all"


# ---------------------------------------------------------------- jobs


@pytest.mark.parametrize("how", WAYS)
def test_jax_and_triton_warm_then_validate_with_zero_misses_on_sshfs(sshfs_mount, tmp_path, how):
    root = sshfs_mount.mount_point / "cache"
    config = write_config(tmp_path / "c.yaml", {**JAX_AND_TRITON, **way(how, tmp_path)})
    warm = run_cli("warm", "--config", str(config), "--cache-root", str(root),
                   "--output", str(tmp_path / "w.json"), "--log", str(tmp_path / "log"))
    assert warm.returncode == 0, warm.stderr[-2000:]
    new = read_json(tmp_path / "w.json")["new_entries"]
    assert new["jax"] > 0 and new["triton"] == 5
    # The entries are on the server side of the mount, whole. (Triton's group manifests name
    # their files by absolute path, the mount's: scan Triton through the mount.)
    server = sshfs_mount.server_dir / "cache"
    entries = jax_cache.scan(server / "jax", verify_after=0.0)
    assert len(entries) == new["jax"] and all(e.problem is None for e in entries)
    assert len(list((server / "triton").iterdir())) >= 5
    kernels = triton_cache.scan(root / "triton").kernels
    assert len(kernels) == 5 and all(k.complete and not k.problems for k in kernels)
    assert not (server / "jax" / "xla_gpu_per_fusion_autotune_cache_dir").exists()
    validate = run_cli("validate", "--config", str(config), "--cache-root", str(root),
                       "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    assert validate.returncode == 0, validate.stderr[-2000:]
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is True and verdict["misses"] == 0, verdict["problems"]
    assert verdict["new_entries"] == 0 and verdict["problems"] == []
    assert verdict["jax"]["hits"] == new["jax"] and verdict["jax"]["misses"] == 0
    assert verdict["triton"]["hits"] == 5 and verdict["triton"]["misses"] == 0
    assert any(LOCK_PHRASE in w for w in verdict["cache_warnings"])


@pytest.mark.parametrize("how", WAYS)
def test_four_warmers_at_once_on_an_empty_sshfs_root(sshfs_mount, tmp_path, how):
    root = sshfs_mount.mount_point / "cache"
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"tiny": {"command": f"{{python}} '{script}'"},
                      "triton-kernels": {"shapes": [1000]}},
        "default_workloads": ["tiny", "triton-kernels"], "validate": {"measure_cold": False},
        **way(how, tmp_path)})
    command = [sys.executable, "-m", "gpu_cache", "warm", "--config", str(config),
               "--cache-root", str(root)]
    results = finish(start_many(4, command, clean_environ()))
    assert [code for code, _err in results] == [0] * 4, [err[-800:] for _c, err in results]
    for _code, err in results:
        for symptom in ("EBUSY", "Device or resource busy", "Stale file handle", "Traceback",
                        "Error writing persistent compilation cache entry"):
            assert symptom not in err, err[-2000:]
    server = sshfs_mount.server_dir / "cache"
    jax_entries = jax_cache.scan(server / "jax", verify_after=0.0)
    assert len(jax_entries) == 3
    assert all(e.problem is None and e.size > 0 for e in jax_entries), jax_entries
    inventory = triton_cache.scan(root / "triton")  # manifests name the mount's paths
    assert len(inventory.kernels) == 5
    assert all(k.complete and not k.problems for k in inventory.kernels)
    assert not inventory.temp_dirs  # no writer left half a file behind
    validate = run_cli("validate", "--config", str(config), "--cache-root", str(root),
                       "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    assert validate.returncode == 0, validate.stderr[-2000:]
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is True and verdict["misses"] == 0, verdict["problems"]
    assert verdict["jax"]["hits"] == 3 and verdict["triton"]["hits"] == 5


# ---------------------------------------------------------------- prune


def test_prune_while_four_readers_load_the_cache_over_sshfs(sshfs_root, tmp_path, twelve_entries):
    root = sshfs_root / "cache"
    shutil.copytree(twelve_entries, root / "jax")
    stop = tmp_path / "stop"
    # sshfs caches file attributes, so JAX's exists-then-read can see an entry that prune has
    # just removed (about 1 in 3 runs here): JAX then warns once and compiles again. That is
    # JAX's own race (with JAX_RAISE_PERSISTENT_CACHE_ERRORS it raises instead); what must
    # hold is that no reader fails and no half entry is ever served.
    env = jax_job_env(root / "jax", shared_fs=True)
    readers = start_many(4, [sys.executable, "-c", READER, str(stop)], env)
    for reader in readers:
        assert reader.stdout.readline().strip() == "ready"
    pruned = run_cli("prune", "--json", "--max-size", "20K", "--cache-root", str(root))
    stop.touch()
    results = finish(readers)
    assert pruned.returncode == 0, pruned.stderr
    report = json.loads(pruned.stdout)
    assert report["problems"] == [] and report["jax"]["entries_removed"] > 0
    assert [code for code, _ in results] == [0] * 4, [err[-800:] for _c, err in results]
    assert all("decompress" not in err and "truncated" not in err for _c, err in results)
    # The readers compiled the removed programs again and wrote them back: all whole.
    assert all(e.problem is None for e in jax_cache.scan(root / "jax", verify_after=0.0))


def test_two_prunes_at_once_on_one_mount_serialize(sshfs_root, twelve_entries):
    # SFTP carries whole seconds only: the copies' mtimes (the LRU order) are truncated, so the
    # single prune that sets the expectation runs on sshfs too.
    single, root = sshfs_root / "single", sshfs_root / "cache"
    for folder in (single, root):
        shutil.copytree(twelve_entries, folder / "jax")
    expected = json.loads(run_cli("prune", "--json", "--max-size", "20K", "--cache-root",
                                  str(single)).stdout)["jax"]
    command = [sys.executable, "-m", "gpu_cache", "prune", "--json", "--max-size", "20K",
               "--cache-root", str(root)]
    both = [subprocess.Popen(command, env=clean_environ(), stdout=subprocess.PIPE, text=True,
                             stderr=subprocess.PIPE) for _ in range(2)]
    reports = sorted((json.loads(p.communicate(timeout=120)[0]) for p in both),
                     key=lambda r: -r["jax"]["entries_removed"])
    assert all(r["problems"] == [] for r in reports), reports
    first, second = (r["jax"] for r in reports)
    assert first["entries_removed"] == expected["entries_removed"] > 0
    # The second ran after the first had finished: it saw the pruned cache, removed nothing.
    assert second["entries_before"] == 12 - expected["entries_removed"]
    assert second["entries_removed"] == 0
    assert sorted(p.name for p in (single / "jax").iterdir()) == \
        sorted(p.name for p in (root / "jax").iterdir())


def test_prune_on_one_node_while_another_node_reads(sshfs_mount, tmp_path, twelve_entries):
    """Readers through a second mount (another node) while a prune runs through the first. The
    second client's attribute cache still shows removed entries for a while, so JAX's
    ``exists()`` then ``read_bytes()`` fails with FileNotFoundError there (with
    JAX_RAISE_PERSISTENT_CACHE_ERRORS=true that kills the reader: measured, not asserted); with
    JAX's default it is a warning and a recompile: no job fails, no half entry is read."""
    other_node = sshfs_mount.mount()
    root = sshfs_mount.mount_point / "cache"
    shutil.copytree(twelve_entries, root / "jax")
    stop = tmp_path / "stop"
    readers = start_many(4, [sys.executable, "-c", READER, str(stop)],
                         jax_job_env(other_node / "cache" / "jax", shared_fs=True))
    for reader in readers:
        assert reader.stdout.readline().strip() == "ready"
    pruned = run_cli("prune", "--json", "--max-size", "20K", "--cache-root", str(root))
    stop.touch()
    results = finish(readers)
    assert pruned.returncode == 0 and json.loads(pruned.stdout)["jax"]["entries_removed"] > 0
    assert [code for code, _ in results] == [0] * 4, [err[-800:] for _c, err in results]
    for _code, err in results:  # a read that fails finds no file; it never reads half of one
        reads = [line for line in err.splitlines()
                 if "Error reading persistent compilation cache entry" in line]
        assert all("FileNotFoundError" in line for line in reads), reads
        print(f"reader on the other mount: {len(reads)} reads found no file")  # shown with -s
    assert all(e.problem is None for e in jax_cache.scan(root / "jax", verify_after=0.0))


def test_the_prune_lock_does_not_exclude_a_prune_through_a_second_mount(sshfs_mount, twelve_entries):
    """What the doctor's lock warning says, with gpu-cache's own prune: while a process holds
    ``<root>/.prune.lock`` through one mount, a prune through that mount waits, and a prune
    through a second mount of the same folder (another node) runs at once."""
    other_node = sshfs_mount.mount()
    root = sshfs_mount.mount_point / "cache"
    shutil.copytree(twelve_entries, root / "jax")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(root / ".prune.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    waiting = None
    try:
        assert holder.stdout.readline().strip() == "held"
        waiting = subprocess.Popen(
            [sys.executable, "-m", "gpu_cache", "prune", "--json", "--max-size", "20K",
             "--cache-root", str(root)], env=clean_environ(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        elsewhere = run_cli("prune", "--json", "--max-size", "20K", "--cache-root",
                            str(other_node / "cache"), timeout=60)
        assert elsewhere.returncode == 0, elsewhere.stderr
        report = json.loads(elsewhere.stdout)
        assert report["problems"] == [] and report["jax"]["entries_removed"] > 0
        assert waiting.poll() is None  # same mount: still waiting for the lock
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    # It then prunes a cache that is already pruned (its mount may still list the removed
    # entries for a while: removing a file that is gone is not an error).
    assert json.loads(out)["problems"] == []
    left = jax_cache.scan(sshfs_mount.server_dir / "cache" / "jax", verify_after=0.0)
    assert len(left) == 12 - report["jax"]["entries_removed"]
    assert all(e.problem is None for e in left)


# ---------------------------------------------------------------- file locks on sshfs

HOLD = ("import filelock, sys\n"
        "lock = filelock.FileLock(sys.argv[1], mode=0o600)  # private, as the lock rules make it\n"
        "lock.acquire(timeout=10)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()  # hold until the test closes stdin\n")
TRY = ("import filelock, sys\n"
       "try:\n"
       "    filelock.FileLock(sys.argv[1]).acquire(timeout=0.5)\n"
       "    print('acquired')\n"
       "except filelock.Timeout:\n"
       "    print('excluded')\n")
HOLD_POSIX = ("import fcntl, sys\n"
              "f = open(sys.argv[1], 'a')\n"
              "fcntl.lockf(f, fcntl.LOCK_EX)\n"
              "print('held', flush=True)\n"
              "sys.stdin.read()\n")
TRY_POSIX = ("import fcntl, sys\n"
             "f = open(sys.argv[1], 'a')\n"
             "try:\n"
             "    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "    print('acquired')\n"
             "except OSError:\n"
             "    print('excluded')\n")


@pytest.mark.parametrize("api", ["flock (filelock, as prune and JAX use)", "fcntl POSIX lockf"])
def test_file_locks_on_sshfs_exclude_only_within_one_mount(sshfs_mount, api):
    """Two processes that lock the same file through one mount exclude each other; through a
    second mount of the same folder (a second node) or on the server side, they do not."""
    hold, attempt = (HOLD, TRY) if api.startswith("flock") else (HOLD_POSIX, TRY_POSIX)
    second = sshfs_mount.mount()
    name = ".prune.lock"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(sshfs_mount.mount_point / name)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"

        def other(where: Path) -> str:
            return subprocess.run([sys.executable, "-c", attempt, str(where / name)],
                                  capture_output=True, text=True, timeout=60, check=False).stdout.strip()

        assert other(sshfs_mount.mount_point) == "excluded"  # same machine, same mount
        assert other(second) == "acquired"  # another client of the same share: not excluded
        assert other(sshfs_mount.server_dir) == "acquired"  # the server's own view: not excluded
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


# ---------------------------------------------------------------- two nodes (tests/harness/nodes.py)


def test_two_nodes_have_their_own_hostname_tmp_and_mount_and_locks_of_one_share(two_nodes, tmp_path):
    """The ``two_nodes`` fixture: each node its own hostname, ``/tmp`` and sshfs mount of one share
    at the same path; a lock held through node a's mount excludes a process on node a, not one on
    node b (what single-flight across nodes has to live with)."""
    (tmp_path / "host-only").write_text("")
    lock = two_nodes.shared / "locks" / ".prune.lock"
    two_nodes.host_path(lock).parent.mkdir()
    look = ("import os, socket, sys\n"
            "print(socket.gethostname(), os.path.exists(sys.argv[1]), open(sys.argv[2]).read())\n")
    two_nodes.host_path(two_nodes.shared / "note").write_text("shared")
    for node in (two_nodes.a, two_nodes.b):
        done = node.run([sys.executable, "-c", look, str(tmp_path / "host-only"),
                         str(two_nodes.shared / "note")], env=clean_environ())
        assert done.stdout.split() == [node.hostname, "False", "shared"], done.stderr
        assert node.mounted_type(two_nodes.shared) == "fuse.sshfs"
        assert node.mounted_type("/tmp") == "tmpfs"
    holder = two_nodes.a.popen([sys.executable, "-c", HOLD, str(lock)], env=clean_environ(),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for node, outcome in ((two_nodes.a, "excluded"), (two_nodes.b, "acquired")):
            done = node.run([sys.executable, "-c", TRY, str(lock)], env=clean_environ(), timeout=60)
            assert done.stdout.strip() == outcome, (node.name, done.stderr)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
