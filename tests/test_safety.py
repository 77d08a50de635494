"""Safety under real faults: full and read-only filesystems, hostile owners and modes, shared
groups, concurrent warmers, readers and pruners, killed prunes, bad input.

Every fault is made for real (tmpfs mounts, read-only bind mounts, chown/chmod, groupadd,
SIGKILL, concurrent processes); nothing of gpu-cache, JAX or Triton is mocked.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpu_cache.core.kinds import jax_format as jax_cache
from gpu_cache.core.kinds import triton_format as triton_cache
from gpu_cache.jobenv.fs import family, fs_type
from helpers import (
    FILLER,
    READER,
    REPO,
    TINY,
    clean_environ,
    finish,
    jax_job_env,
    read_json,
    run_cli,
    run_snakemake,
    start_many,
    write_config,
)

IS_ROOT = os.geteuid() == 0
# Under CI (root there) a test never skips for this: it would fail instead.
needs_root = pytest.mark.skipif(not IS_ROOT and not os.environ.get("CI"),
                                reason="mounts, chown and groupadd need root")

# Three tiny programs, one entry each: fast on 2 cores, distinct keys.
# Eight programs of growing size (3 to 7 KiB entries): more than a 16 KiB tmpfs holds.
GROWING = ("import jax, jax.numpy as jnp, numpy as np\n"
           "def prog(i):\n"
           "    def f(x):\n"
           "        for k in range(i + 1):\n"
           "            x = jnp.tanh(x @ x.T + k) * (i + 1)\n"
           "        return x\n"
           "    return f\n"
           "for i in range(8):\n"
           "    jax.jit(prog(i))(np.ones((32, 32), np.float32)).block_until_ready()\n")

# One program whose entry is several pages long, whatever the compression.
BIG_ENTRY = ("import jax, jax.numpy as jnp, numpy as np\n"
             "def f(x):\n"
             "    for k in range(24):\n"
             "        x = jnp.tanh(x @ x.T + k) * jnp.sin(x + k)\n"
             "    return x\n"
             "jax.jit(f)(np.ones((32, 32), np.float32)).block_until_ready()\n")


def python_workload(tmp_path: Path, name: str, source: str, **extra) -> Path:
    """A config whose only workload runs ``source`` with the cache environment."""
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    return write_config(tmp_path / f"{name}.yaml", {
        "workloads": {name: {"command": f"{{python}} '{script}'"}},
        "default_workloads": [name], "validate": {"measure_cold": False}, **extra})


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def mounts():
    """Mount points to unmount after the test, last first."""
    points: list[Path] = []
    yield points
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def tmpfs(mounts: list[Path], where: Path, size: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    # mode 0755: a fresh tmpfs is 1777, which gpu-cache refuses (others could plant entries)
    mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where))
    mounts.append(where)
    return where


def read_only(mounts: list[Path], folder: Path) -> None:
    mount("--bind", str(folder), str(folder))
    mounts.append(folder)
    mount("-o", "remount,ro,bind", str(folder))


def warnings_about_reads(stderr: str) -> int:
    return stderr.count("Error reading persistent compilation cache entry")


# ---------------------------------------------------------------- doctor / preflight


def test_filesystem_families_are_named():
    assert [family(t) for t in ("nfs", "nfs4", "lustre", "beegfs", "gpfs", "tmpfs", "ext4",
                                "xfs", "fuse.sshfs", "fuse", "unknown")] == [
        "nfs", "nfs", "lustre", "beegfs", "gpfs", "tmpfs", "local", "local", "sshfs", "fuse",
        "unknown"]


@needs_root
def test_doctor_names_tmpfs_and_warns_when_space_is_low(tmp_path, mounts):
    root = tmpfs(mounts, tmp_path / "small", "200k")
    assert fs_type(root) == "tmpfs"
    result = run_cli("doctor", "--json", "--cache-root", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    jax = report["kinds"]["jax"]
    assert jax["family"] == "tmpfs" and jax["problem"] is None and jax["free_bytes"] < 1 << 20
    # One line per kind's folder, each naming that kind's entries (not JAX's for all).
    low = [w for w in report["warnings"] if " free (less than 1.0 GiB); a full disk" in w]
    assert low and len(low) == len(report["kinds"]), low
    for kind in report["kinds"]:
        (line,) = [w for w in low if w.startswith(f"{kind}: {root / kind} has only ")]
        assert f"leaves empty or truncated {kind} entries (`gpu-cache doctor --fix`" in line, line
    # A threshold below the free space: no warning.
    config = write_config(tmp_path / "c.yaml", {"min_free_space": "1K"})
    quiet = json.loads(run_cli("doctor", "--json", "--config", str(config), "--cache-root",
                               str(root)).stdout)
    assert not any("a full disk" in w for w in quiet["warnings"])
    text = run_cli("doctor", "--cache-root", str(tmp_path / "local")).stdout
    assert "[local]" in text and "result: ok" in text


# ---------------------------------------------------------------- trust


@needs_root
def test_world_writable_cache_is_refused_and_jobs_still_run(tmp_path):
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    os.chmod(root / "jax", 0o777)
    result = run_cli("env", "--json", "--cache-root", str(root))
    assert result.returncode == 0
    exports = json.loads(result.stdout)
    why = exports["problems"]["jax"]
    assert "world-writable" in why and f"chmod o-w,g-w {root / 'jax'}" in why  # 777: group root too
    assert exports["exports"]["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    assert "JAX_COMPILATION_CACHE_DIR" not in exports["exports"]
    doctor = run_cli("doctor", "--cache-root", str(root))
    assert doctor.returncode == 1 and "world-writable" in doctor.stdout
    # A world-writable root refuses every kind below it; Triton falls back to node-local.
    os.chmod(root / "jax", 0o755)
    os.chmod(root, 0o777)
    exports = json.loads(run_cli("env", "--json", "--cache-root", str(root)).stdout)
    assert "world-writable" in exports["problems"]["triton"]
    assert "node-local" in exports["problems"]["triton"]
    assert not exports["exports"]["TRITON_CACHE_DIR"].startswith(str(root))


@pytest.fixture
def team_group():
    """A real group, made for the test and deleted after it."""
    name = f"gpucache{os.getpid() % 100000}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


@pytest.mark.slow
@needs_root
def test_a_cache_owned_by_another_user_is_refused_unless_its_group_is_shared(tmp_path, team_group):
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    shutil.chown(root, user="nobody")
    shutil.chown(root / "jax", user="nobody")
    refused = json.loads(run_cli("env", "--json", "--cache-root", str(root)).stdout)
    assert "owned by nobody" in refused["problems"]["jax"]
    assert "shared_group" in refused["problems"]["jax"]
    config = write_config(tmp_path / "c.yaml", {"shared_group": team_group})
    wrong_group = json.loads(run_cli("env", "--json", "--config", str(config), "--cache-root",
                                     str(root)).stdout)
    assert f"not the shared_group {team_group}" in wrong_group["problems"]["jax"]
    for folder in (root, root / "jax"):
        shutil.chown(folder, group=team_group)
    shared = json.loads(run_cli("env", "--json", "--config", str(config), "--cache-root",
                                str(root)).stdout)
    assert "jax" not in shared["problems"]
    assert shared["exports"]["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax")


@pytest.mark.slow
@needs_root
def test_shared_group_mode_makes_a_cache_another_member_can_extend(tmp_path, team_group):
    # pytest's own folders are private to root: the team's cache lives where others can reach.
    base = Path(tempfile.mkdtemp(prefix="gpu-cache-team-"))
    os.chmod(base, 0o755)
    try:
        shared_group_mode(tmp_path, base / "cache", team_group)
    finally:
        shutil.rmtree(base)


def shared_group_mode(tmp_path: Path, root: Path, team_group: str) -> None:
    """Warm JAX and Triton in shared-group mode, then write into the result as another member."""
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    config = write_config(tmp_path / "shared.yaml", {
        "shared_group": team_group,
        "workloads": {"tiny": {"command": f"{{python}} '{script}'"},
                      "triton-kernels": {"shapes": [1000]}},
        "default_workloads": ["tiny", "triton-kernels"]})
    warm = run_cli("warm", "--config", str(config), "--cache-root", str(root),
                   "--output", str(tmp_path / "w.json"), "--log", str(tmp_path / "log"))
    assert warm.returncode == 0, warm.stderr
    gid = grp.getgrnam(team_group).gr_gid
    for folder in (root, root / "jax", root / "triton"):
        info = folder.stat()
        assert info.st_gid == gid and stat.S_IMODE(info.st_mode) & 0o2070 == 0o2070, folder
    entries = [p for p in (root / "jax").iterdir() if p.name.endswith("-cache")]
    key_dirs = [p for p in (root / "triton").iterdir() if triton_cache.KEY_RE.match(p.name)]
    assert entries and key_dirs
    for path in entries + key_dirs:
        info = path.stat()
        assert info.st_gid == gid, path  # setgid folders pass the group on
        assert info.st_mode & stat.S_IWGRP, f"{path} not group-writable: the umask was not relaxed"
    # Another member (nobody, in the group) can add what JAX and Triton add on a miss.
    member = subprocess.run(
        ["runuser", "-u", "nobody", "-g", team_group, "--", "sh", "-c",
         f"touch '{root}/jax/x-cache' && mkdir '{key_dirs[0]}/tmp.pid_1_x' && "
         f"echo 1 > '{key_dirs[0]}/tmp.pid_1_x/f' && mv '{key_dirs[0]}/tmp.pid_1_x/f' '{key_dirs[0]}/f'"],
        capture_output=True, text=True)
    assert member.returncode == 0, member.stderr


# ---------------------------------------------------------------- concurrency




@pytest.mark.slow
def test_eight_warmers_on_one_empty_cache(tmp_path):
    root = tmp_path / "root"
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"tiny": {"command": f"{{python}} '{script}'"},
                      "triton-kernels": {"shapes": [1000]}},
        "default_workloads": ["tiny", "triton-kernels"], "validate": {"measure_cold": False}})
    command = [sys.executable, "-m", "gpu_cache", "warm", "--config", str(config),
               "--cache-root", str(root)]
    results = finish(start_many(8, command, clean_environ()))
    assert [code for code, _err in results] == [0] * 8, [err[-800:] for _c, err in results]
    jax_entries = jax_cache.scan(root / "jax", verify_after=0.0)
    assert len(jax_entries) == 3
    assert all(e.problem is None and e.size > 0 for e in jax_entries), jax_entries
    inventory = triton_cache.scan(root / "triton")
    kernels = inventory.kernels
    assert kernels and all(k.complete and not k.problems for k in kernels)
    assert not inventory.temp_dirs  # no writer left half a file behind
    run_cli("validate", "--config", str(config), "--cache-root", str(root),
            "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is True and verdict["misses"] == 0, verdict["problems"]
    assert verdict["jax"]["hits"] == 3 and verdict["triton"]["hits"] >= len(kernels)






def test_prune_while_eight_readers_load_the_cache(tmp_path, twelve_entries):
    root = tmp_path / "root"
    shutil.copytree(twelve_entries, root / "jax")
    stop = tmp_path / "stop"
    # A half-removed or half-read entry raises with JAX_RAISE_PERSISTENT_CACHE_ERRORS and
    # fails the reader.
    env = jax_job_env(root / "jax", shared_fs=True, JAX_RAISE_PERSISTENT_CACHE_ERRORS="true")
    readers = start_many(8, [sys.executable, "-c", READER, str(stop)], env)
    for reader in readers:
        assert reader.stdout.readline().strip() == "ready"
    pruned = run_cli("prune", "--json", "--max-size", "20K", "--cache-root", str(root))
    stop.touch()
    results = finish(readers)
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["jax"]["entries_removed"] > 0
    assert [code for code, _ in results] == [0] * 8, [err[-800:] for _c, err in results]
    assert all(warnings_about_reads(err) == 0 for _c, err in results)


def test_two_prunes_at_once_serialize_and_equal_one(tmp_path, twelve_entries):
    single, double = tmp_path / "single", tmp_path / "double"
    for root in (single, double):
        shutil.copytree(twelve_entries, root / "jax")
    one = run_cli("prune", "--json", "--max-size", "20K", "--cache-root", str(single))
    expected = json.loads(one.stdout)["jax"]
    command = [sys.executable, "-m", "gpu_cache", "prune", "--json", "--max-size", "20K",
               "--cache-root", str(double)]
    both = [subprocess.Popen(command, env=clean_environ(), stdout=subprocess.PIPE, text=True,
                             stderr=subprocess.PIPE) for _ in range(2)]
    reports = sorted((json.loads(p.communicate(timeout=120)[0])["jax"] for p in both),
                     key=lambda r: -r["entries_removed"])
    assert reports[0]["entries_removed"] == expected["entries_removed"] > 0
    # The second ran after the first had finished: it saw the pruned cache, removed nothing.
    assert reports[1]["entries_before"] == 12 - expected["entries_removed"]
    assert reports[1]["entries_removed"] == 0
    assert sorted(p.name for p in (single / "jax").iterdir()) == \
        sorted(p.name for p in (double / "jax").iterdir())


# ---------------------------------------------------------------- faults


@needs_root
def test_full_disk_during_warm_then_doctor_fix_removes_broken_entries(tmp_path, mounts):
    root = tmpfs(mounts, tmp_path / "full", "16k")
    config = python_workload(tmp_path, "growing", GROWING)
    warm = run_cli("warm", "--config", str(config), "--cache-root", str(root),
                   "--output", str(tmp_path / "w.json"), "--log", str(tmp_path / "log"))
    assert warm.returncode == 0, warm.stderr
    report = read_json(tmp_path / "w.json")
    assert report["runs"][0]["returncode"] == 0  # the job finished
    assert any("a full disk leaves empty or truncated jax entries" in w for w in report["cache_warnings"])
    assert any("broken" in p and "doctor --fix" in p for p in report["problems"])
    assert "gpu-cache: warning: jax:" in warm.stderr
    time.sleep(jax_cache.WRITE_GRACE_SECONDS)  # younger entries may be mid-write: not verified
    broken = [e for e in jax_cache.scan(root / "jax", verify_after=0.0) if e.problem]
    # What always happens once the disk is full: JAX creates the entry's file, then cannot
    # write a byte (#19: whether an entry is also cut off midway depends on entry sizes,
    # compression and the filesystem; the next test makes that happen on purpose).
    assert any(e.size == 0 and e.problem.startswith("empty") for e in broken), broken
    # JAX itself never repairs them: every later run warns and recompiles.
    env = jax_job_env(root / "jax", shared_fs=True)
    again = subprocess.run([sys.executable, "-c", GROWING], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and warnings_about_reads(again.stderr) > 0
    fixed = run_cli("doctor", "--fix", "--json", "--cache-root", str(root))
    assert json.loads(fixed.stdout)["fixed"]["jax"]["entries_removed"] == len(broken)
    left = jax_cache.scan(root / "jax", verify_after=0.0)
    assert left and all(e.problem is None for e in left)
    after = subprocess.run([sys.executable, "-c", GROWING], env=env, capture_output=True, text=True)
    assert after.returncode == 0 and warnings_about_reads(after.stderr) == 0


def test_an_entry_cut_off_by_a_full_disk_is_found_and_removed(tmp_path, mounts):
    """One page left free, one entry larger than a page: JAX writes the entry in place, so the
    disk fills up halfway through it and a cut-off entry stays."""
    root = tmpfs(mounts, tmp_path / "cut", "1m")
    folder = root / "jax"
    folder.mkdir()
    page = os.statvfs(root).f_frsize
    free = os.statvfs(root).f_bavail * page
    (root / "filler").write_bytes(b"\0" * (free - page))
    env = jax_job_env(folder, shared_fs=True)
    one = subprocess.run([sys.executable, "-c", BIG_ENTRY], env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    time.sleep(jax_cache.WRITE_GRACE_SECONDS)  # younger entries may be mid-write: not verified
    [entry] = jax_cache.scan(folder, verify_after=0.0)
    assert entry.size == page and entry.problem, entry  # cut off after the one free page
    (root / "filler").unlink()
    again = subprocess.run([sys.executable, "-c", BIG_ENTRY], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and warnings_about_reads(again.stderr) == 1  # never repaired
    fixed = run_cli("doctor", "--fix", "--json", "--cache-root", str(root))
    assert json.loads(fixed.stdout)["fixed"]["jax"]["entries_removed"] == 1
    subprocess.run([sys.executable, "-c", BIG_ENTRY], env=env, check=True, capture_output=True)
    time.sleep(jax_cache.WRITE_GRACE_SECONDS)
    [good] = jax_cache.scan(folder, verify_after=0.0)
    assert good.size > page and good.problem is None
    hit = subprocess.run([sys.executable, "-c", BIG_ENTRY], env=env, capture_output=True, text=True)
    assert hit.returncode == 0 and warnings_about_reads(hit.stderr) == 0


def test_prune_killed_with_sigkill_leaves_a_working_cache_that_the_next_prune_completes(
        tmp_path, twelve_entries):
    """Capped cache (-atime files): 12 real recent entries and 3000 old copies to remove."""
    folder = tmp_path / "root" / "jax"
    shutil.copytree(twelve_entries, folder)
    env = jax_job_env(folder, shared_fs=True, JAX_COMPILATION_CACHE_MAX_SIZE=str(1 << 30))
    subprocess.run([sys.executable, "-c", FILLER, "12"], env=env, check=True)  # writes -atime
    real = {e.key for e in jax_cache.scan(folder)}
    sample = next(e for e in jax_cache.scan(folder))
    old = time.time() - 90 * 86400
    for n in range(3000):
        key = f"jit_old-{n:064x}"
        shutil.copyfile(sample.cache_path, folder / f"{key}-cache")
        (folder / f"{key}-atime").write_bytes(int(old * 1e9).to_bytes(8, "little"))
        for suffix in ("-cache", "-atime"):
            os.utime(folder / f"{key}{suffix}", (old, old))
    total = len(list(folder.iterdir()))
    prune = subprocess.Popen([sys.executable, "-m", "gpu_cache", "prune", "--max-age", "30d",
                              "--cache-root", str(folder.parent)], env=clean_environ(),
                             stderr=subprocess.PIPE)
    while len(os.listdir(folder)) > total - 1000 and prune.poll() is None:
        time.sleep(0.01)
    prune.send_signal(signal.SIGKILL)
    prune.wait()
    remaining = jax_cache.scan(folder)
    assert 12 < len(remaining) < 3012, "the kill must land halfway"
    assert {e.key for e in remaining} >= real
    assert all(e.cache_path is not None for e in remaining if e.key in real)
    # The half-pruned, capped cache still serves every hit and takes writes.
    keys = {e.key for e in remaining}
    hit = subprocess.run([sys.executable, "-c", FILLER, "12"], env=env, capture_output=True, text=True)
    assert hit.returncode == 0 and warnings_about_reads(hit.stderr) == 0
    assert "Error writing" not in hit.stderr
    assert {e.key for e in jax_cache.scan(folder)} == keys  # all 12 hit: nothing new written
    again = run_cli("prune", "--json", "--max-age", "30d", "--cache-root", str(folder.parent))
    assert again.returncode == 0
    assert {e.key for e in jax_cache.scan(folder)} == real
    assert all(e.atime_path and e.cache_path for e in jax_cache.scan(folder))


@needs_root
def test_read_only_cache_root_serves_hits_and_the_workflow_succeeds(tmp_path, mounts):
    import yaml

    root = tmp_path / "cache"
    work = tmp_path / "work"
    (work / "config").mkdir(parents=True)
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text()) | {
        "workloads": {"tiny": {"command": f"{{python}} '{script}'"}},
        "default_workloads": ["tiny"], "validate": {"measure_cold": False}}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    env = clean_environ(GPU_CACHE_ROOT=str(root))
    snakefile = str(REPO / "workflow" / "Snakefile")
    first = run_snakemake(work, "-s", snakefile, "--cores", "2", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(work / "results")
    before = sorted(p.name for p in (root / "jax").iterdir())
    read_only(mounts, root)
    second = run_snakemake(work, "-s", snakefile, "--cores", "2", env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    verdict = read_json(work / "results" / "gpu-cache" / "validate" / "cpu.json")
    assert verdict["jax"]["misses"] == 0 and verdict["passed"] is True, verdict["problems"]
    assert any("read-only" in w for w in verdict["cache_warnings"])
    prune = read_json(work / "results" / "gpu-cache" / "prune.json")
    assert any("cannot lock" in p for p in prune["problems"])
    assert sorted(p.name for p in (root / "jax").iterdir()) == before
    doctor = run_cli("doctor", "--json", "--cache-root", str(root))
    assert json.loads(doctor.stdout)["kinds"]["jax"]["read_only"] is True


# ---------------------------------------------------------------- bad input


@pytest.fixture
def kept_cache(tmp_path, twelve_entries) -> Path:
    root = tmp_path / "kept"
    shutil.copytree(twelve_entries, root / "jax")
    return root


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# Each would delete every entry (--max-size 0) if it were not refused.
@pytest.mark.parametrize("args,config,message", [
    (["prune", "--max-size", "0", "--kind", "foo"], None, "cannot prune kind 'foo'"),
    (["prune", "--max-size=-5G"], None, "--max-size"),
    (["prune"], {"prune": {"max_size": -1}}, "negative"),
    (["prune", "--max-size", "0"], {"xla_caches": "maybe"}, "xla_caches"),
    (["prune", "--max-size", "0"], {"shared_group": "no-such-group-xyz"}, "no group 'no-such-group-xyz'"),
    (["prune", "--max-size", "0"], {"min_free_space": "lots"}, "min_free_space"),
    (["prune", "--max-size", "0"], {"prune": {"max_age": "-3d"}}, "prune.max_age"),
])
def test_bad_input_is_one_line_exit_2_and_deletes_nothing(args, config, message, kept_cache, tmp_path):
    before = listing(kept_cache)
    extra = ["--config", str(write_config(tmp_path / "bad.yaml", config))] if config else []
    result = run_cli(*args, *extra, "--cache-root", str(kept_cache))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-cache: error:") and message in lines[0], lines
    assert listing(kept_cache) == before


@pytest.mark.parametrize("command", ["prune", "stats"])
@pytest.mark.parametrize("shape", ["file", "loop"])
def test_a_root_that_is_a_file_or_a_link_loop_is_exit_2(command, shape, tmp_path):
    root = tmp_path / "root"
    if shape == "file":
        root.write_text("not a cache")
    else:
        os.symlink(tmp_path / "other", root)
        os.symlink(root, tmp_path / "other")
    result = run_cli(command, "--cache-root", str(root))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(root) in lines[0] and "Traceback" not in result.stderr
    if shape == "file":
        assert root.read_text() == "not a cache"
    # The workflow's prune degrades instead: report, exit 0.
    if command == "prune":
        lenient = run_cli("prune", "--no-fail", "--json", "--cache-root", str(root))
        assert lenient.returncode == 0 and json.loads(lenient.stdout)["problems"]
    doctor = run_cli("doctor", "--cache-root", str(root))
    assert doctor.returncode == 1 and "PROBLEM" in doctor.stdout


@pytest.mark.slow
def test_paths_with_spaces_and_unicode_work(tmp_path):
    root = tmp_path / "ca che" / "ünï cødé"
    config = python_workload(tmp_path, "tiny", TINY)
    warm = run_cli("warm", "--config", str(config), "--cache-root", str(root),
                   "--output", str(tmp_path / "w.json"), "--log", str(tmp_path / "log"))
    assert warm.returncode == 0, warm.stderr
    assert read_json(tmp_path / "w.json")["new_entries"]["jax"] == 3
    shell = run_cli("env", "--cache-root", str(root)).stdout
    echoed = subprocess.run(["bash", "-c", shell + 'printf %s "$JAX_COMPILATION_CACHE_DIR"'],
                            capture_output=True, text=True).stdout
    assert echoed == str(root / "jax")
    pruned = run_cli("prune", "--json", "--max-size", "0", "--cache-root", str(root))
    assert json.loads(pruned.stdout)["jax"]["entries_removed"] == 3


@needs_root
def test_read_only_triton_cache_serves_hits_and_a_miss_does_not_fail(tmp_path, mounts):
    root = tmp_path / "cache"
    config = write_config(tmp_path / "c.yaml", {"workloads": {"triton-kernels": {"shapes": [1000]}},
                                                "default_workloads": ["triton-kernels"]})
    warm = run_cli("warm", "--config", str(config), "--cache-root", str(root),
                   "--output", str(tmp_path / "w.json"), "--log", str(tmp_path / "log"))
    assert warm.returncode == 0 and read_json(tmp_path / "w.json")["new_entries"]["triton"] > 0
    seeded = listing(root / "triton")
    read_only(mounts, root)
    local = tmp_path / "node-local"  # the node-local fallback goes under $TMPDIR
    local.mkdir()
    environ = clean_environ(TMPDIR=str(local))
    exports = run_cli("env", "--cache-root", str(root), env=environ)
    assert "read-only" in exports.stderr and "seed" in exports.stderr

    def kernels(shape: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", exports.stdout + f'"{sys.executable}" -m gpu_cache.workloads.triton_kernels '
             f"--shape {shape}"], env=environ, capture_output=True, text=True)

    hit = kernels(1000)
    assert hit.returncode == 0, hit.stderr[-2000:]
    summary = json.loads(hit.stdout.strip().splitlines()[-1])
    assert summary["hits"] == summary["kernels"] == 5 and summary["misses"] == 0
    # Without gpu-cache's seed manager, Triton on the read-only folder fails on a miss.
    plain = subprocess.run([sys.executable, "-m", "gpu_cache.workloads.triton_kernels", "--shape",
                            "4096"], env=clean_environ(TRITON_CACHE_DIR=str(root / "triton")),
                           capture_output=True, text=True)
    assert plain.returncode != 0 and "Read-only file system" in plain.stdout + plain.stderr
    miss = kernels(4096)
    assert miss.returncode == 0, miss.stderr[-2000:]
    assert json.loads(miss.stdout.strip().splitlines()[-1])["misses"] == 5
    assert listing(root / "triton") == seeded
    fallback = local / f"gpu-cache-{os.getuid()}" / "triton"
    assert len(triton_cache.scan(fallback).kernels) == 5  # the new kernels went node-local
