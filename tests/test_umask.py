"""Everything gpu-cache creates gets safe modes whatever the umask.

Under ``umask 000`` a file made with ``open(..., 0o666)`` is world-writable, and whoever may
write a cache entry, a record or a promoted copy decides what the jobs that load it run (the
tokamax results saved 0666 in a 0777 folder were rewritten by another user and loaded by the
next job). Real processes under a real umask; the modes are read back from the filesystem.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.core import safe_io
from helpers import HOOK, SCRIPTS, TINY, clean_environ, jax_job_env, run_cli


def writable_by_others(top: Path) -> list[str]:
    """The files and folders under ``top`` that a group or others may write."""
    return [f"{p} {stat.filemode(p.lstat().st_mode)}" for p in [top, *top.rglob("*")]
            if not p.is_symlink() and p.lstat().st_mode & 0o022]


def test_safe_io_never_makes_what_others_may_write_under_umask_000(tmp_path):
    old = os.umask(0)
    try:
        safe_io.add_file(tmp_path / "added", b"x")
        safe_io.replace_file(tmp_path / "replaced", b"x")
        safe_io.new_folder(tmp_path / "folder")
        os.close(safe_io.new_file(tmp_path / "folder" / "new"))
    finally:
        os.umask(old)
    assert writable_by_others(tmp_path / "folder") == []
    assert [stat.S_IMODE((tmp_path / n).stat().st_mode) for n in ("added", "replaced")] == [0o644, 0o644]


@pytest.mark.slow
def test_a_jobs_record_and_an_unpacked_cache_are_safe_under_umask_000(tmp_path, twelve_entries):
    # the hook's record of a JAX job run under umask 000
    records = tmp_path / "root" / "records"
    environ = jax_job_env(tmp_path / "root" / "jax", records=records)
    job = subprocess.run([sys.executable, "-c", TINY], env=environ, capture_output=True, text=True, umask=0,
                         timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    assert list(records.glob("*.json")) and writable_by_others(records) == []
    # a pack unpacked under umask 000 into an empty root
    source = tmp_path / "source"
    shutil.copytree(twelve_entries, source / "jax")
    archive = tmp_path / "cache.tar"
    assert run_cli("pack", str(archive), "--kind", "jax", "--cache-root", str(source)).returncode == 0
    target = tmp_path / "target"
    (target / "jax").mkdir(parents=True)
    env = clean_environ()
    unpacked = subprocess.run([sys.executable, "-m", "gpu_cache", "unpack", str(archive), "--cache-root",
                               str(target)], env=env, capture_output=True, text=True, umask=0, timeout=300)
    assert unpacked.returncode == 0, unpacked.stderr
    assert len(list((target / "jax").glob("*-cache"))) == 12
    assert writable_by_others(target / "jax") == []


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="a node's own mount of the local tier needs root")
def test_the_tier_promotes_and_fetches_safe_copies_under_umask_000(tmp_path):
    root, local, node = tmp_path / "root", tmp_path / "local", tmp_path / "node"
    for kind in ("jax", "triton"):
        (root / kind).mkdir(parents=True)
    local.mkdir()
    node.mkdir()
    environ = clean_environ(**{
        "PYTHONPATH": f"{HOOK}:{SCRIPTS}", "GPU_CACHE_RECORDS": str(tmp_path / "records"),
        "JAX_COMPILATION_CACHE_DIR": str(local / "jax"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "GPU_CACHE_TIER": str(local), "GPU_CACHE_SHARED": str(root)})
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    node_script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    for where in (node, tmp_path / "node-b"):  # the first promotes, the second fetches
        where.mkdir(exist_ok=True)
        done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", node_script, "sh",
                               str(where), str(local), sys.executable, str(script)],
                              env=environ, capture_output=True, text=True, umask=0, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((root / "jax").glob("*-cache"))) == 3
    fetched = list((tmp_path / "node-b" / "jax").glob("*-cache"))
    assert len(fetched) == 3
    assert writable_by_others(root / "jax") == [] and all(not p.stat().st_mode & 0o022 for p in fetched)
