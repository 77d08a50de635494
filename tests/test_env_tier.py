"""The node-local tier's side of ``gpu-cache env`` and ``doctor`` (issue 23): when it is on
(auto: the cache root on a network filesystem; ``local_tier.mode``), what jobs get, and that a
local folder that cannot be trusted or used leaves the tier off with one warning line and the
jobs on the cache root as without it. The network filesystem is a real sshfs mount
(tests/harness/sshfs_mount.py); untrusted folders are real folders of another user (``nobody``)."""

from __future__ import annotations

import json
import os
import pwd
import stat
from pathlib import Path

import pytest

from gpu_cache.core.kinds import tier_name as tier_digest
from helpers import HOOK, clean_environ, run_cli, write_config

TIERED = ("JAX_COMPILATION_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
NOT_TIERED = {"CUDA_CACHE_PATH": "cuda", "GPU_CACHE_AUTOTUNE": "autotune", "GPU_CACHE_RECORDS": "records",
              "GPU_CACHE_LOCKS": "locks"}
TIER_VARS = ("GPU_CACHE_TIER", "GPU_CACHE_SHARED", "GPU_CACHE_TIER_MAX_BYTES")
PER_FUSION = "xla_gpu_per_fusion_autotune_cache_dir"


def env_json(root: Path, config: dict, tmp_path: Path, environ: dict[str, str] | None = None) -> dict:
    path = write_config(tmp_path / "tier.yaml", config)
    result = run_cli("env", "--json", "--config", str(path), "--cache-root", str(root), env=environ)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def tier_config(folder: Path, **more: object) -> dict:
    return {"local_tier": {"folder": str(folder), **more}}


def test_a_root_on_a_network_filesystem_gets_the_tier_by_default(sshfs_root, tmp_path):
    root = sshfs_root / "cache"
    base = tmp_path / "node-local"
    local = base / tier_digest(root)
    out = env_json(root, tier_config(base, max_size="3G"), tmp_path)
    exports = out["exports"]
    assert out["tier"]["on"] is True and out["tier"]["mode"] == "auto"
    assert "fuse.sshfs, a network filesystem" in out["tier"]["why"]
    # Jobs' JAX, Triton and Inductor caches work on local disk, mapped to the shared root ...
    assert [exports[name] for name in TIERED] == [str(local / k) for k in ("jax", "triton", "inductor")]
    assert (exports["GPU_CACHE_TIER"], exports["GPU_CACHE_SHARED"]) == (str(local), str(root))
    assert exports["GPU_CACHE_TIER_MAX_BYTES"] == str(3 << 30)
    # ... with XLA's per-fusion autotune results kept there (on the share they stay off) ...
    assert exports["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == PER_FUSION
    # ... and everything else where it was.
    assert {name: exports[name] for name in NOT_TIERED} == {n: str(root / f) for n, f in NOT_TIERED.items()}
    # The hook does the copying: on PYTHONPATH. Containers see /tmp as it is (Apptainer binds
    # it): no bind of a folder that another node may lack.
    assert exports["PYTHONPATH"].split(os.pathsep)[0] == str(HOOK)
    assert str(local) not in exports["APPTAINER_BIND"].split(",")
    # Made private: mode 0700 from the configured folder down.
    for folder in (base, local, local / "jax", local / "triton", local / "inductor"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert not any(w.startswith("local tier:") for w in out["warnings"])


def test_a_root_on_local_disk_gets_no_tier_unless_asked(tmp_path):
    root = tmp_path / "cache"
    base = tmp_path / "node-local"
    out = env_json(root, tier_config(base), tmp_path)
    assert out["tier"]["on"] is False and "local to this node" in out["tier"]["why"]
    assert not set(TIER_VARS) & set(out["exports"])
    assert out["exports"]["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax")
    assert out["exports"]["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    assert not base.exists()  # nothing made for a tier that is off
    # mode: on turns it on for a local root too.
    on = env_json(root, tier_config(base, mode="on"), tmp_path)
    assert on["tier"]["on"] is True and on["tier"]["why"] == "local_tier.mode: on"
    assert on["exports"]["JAX_COMPILATION_CACHE_DIR"] == str(base / tier_digest(root) / "jax")
    assert on["exports"]["GPU_CACHE_SHARED"] == str(root)


def test_mode_off_and_an_empty_gpu_cache_tier_keep_jobs_on_the_shared_root(sshfs_root, tmp_path):
    root = sshfs_root / "cache"
    off = env_json(root, tier_config(tmp_path / "t", mode="off"), tmp_path)
    assert off["tier"]["on"] is False and off["tier"]["why"] == "local_tier.mode: off"
    assert off["exports"]["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax")
    assert off["exports"]["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"  # the share: off
    assert not set(TIER_VARS) & set(off["exports"])
    # A user's GPU_CACHE_TIER="" turns it off for the jobs started from that environment.
    mine = env_json(root, tier_config(tmp_path / "t"), tmp_path, clean_environ(GPU_CACHE_TIER=""))
    assert mine["tier"]["on"] is False and "GPU_CACHE_TIER=''" in mine["tier"]["why"]
    assert mine["exports"]["TRITON_CACHE_DIR"] == str(root / "triton")
    # gpu-cache's own earlier GPU_CACHE_TIER (the profile's) is switched off explicitly.
    earlier = clean_environ(GPU_CACHE_TIER=str(tmp_path / "t" / "x"), GPU_CACHE_MANAGED="GPU_CACHE_TIER")
    again = env_json(root, tier_config(tmp_path / "t", mode="off"), tmp_path, earlier)
    assert again["exports"]["GPU_CACHE_TIER"] == ""


def nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


def _anothers(folder: Path) -> None:
    folder.mkdir(parents=True)
    os.chown(folder, *nobody())


def _world_writable(folder: Path) -> None:
    folder.mkdir(parents=True)
    folder.chmod(0o777)


def _planted_link(folder: Path) -> None:
    """What another user can do in a sticky, world-writable folder such as /tmp: put a link
    where the tier will be, to a folder of theirs."""
    folder.parent.mkdir(parents=True)
    folder.parent.chmod(0o1777)
    theirs = folder.parent / "theirs"
    _anothers(theirs)
    folder.symlink_to(theirs)
    os.lchown(folder, *nobody())


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's folders needs root")
@pytest.mark.parametrize(("make", "said"), [
    (_anothers, "is owned by nobody"),
    (_world_writable, "is world-writable"),
    (_planted_link, "not by you: another user made it in"),
], ids=["another-users", "world-writable", "planted-symlink"])
def test_an_untrusted_local_folder_leaves_the_tier_off_with_one_warning(sshfs_root, tmp_path, make, said):
    root = sshfs_root / "cache"
    base = tmp_path / "scratch" / "tier"
    make(base)
    out = env_json(root, tier_config(base), tmp_path)
    assert out["tier"]["on"] is False and said in out["tier"]["problem"], out["tier"]
    exports = out["exports"]
    assert not set(TIER_VARS) & set(exports)
    assert exports["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax")  # today's behaviour
    assert exports["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == "none"
    lines = [w for w in out["warnings"] if w.startswith("local tier:")]
    assert len(lines) == 1 and said in lines[0] and f"the cache root {root} directly" in lines[0]
    assert not any(p.name == tier_digest(root) for p in base.parent.rglob("*") if p.is_dir())
    # The shell form: exports without the tier, and that one line on stderr.
    config = write_config(tmp_path / "shell.yaml", tier_config(base))
    shell = run_cli("env", "--config", str(config), "--cache-root", str(root))
    assert shell.returncode == 0 and "GPU_CACHE_TIER" not in shell.stdout
    assert sum("local tier:" in line for line in shell.stderr.splitlines()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_a_local_folder_on_a_read_only_mount_leaves_the_tier_off(sshfs_root, tmp_path):
    """A folder that cannot be written (here a read-only bind mount: it binds root too)."""
    root = sshfs_root / "cache"
    base = tmp_path / "ro"
    base.mkdir()
    os.system(f"mount --bind {base} {base} && mount -o remount,ro,bind {base}")
    try:
        out = env_json(root, tier_config(base), tmp_path)
    finally:
        os.system(f"umount {base}")
    assert out["tier"]["on"] is False and "read-only" in out["tier"]["problem"]
    assert out["exports"]["JAX_COMPILATION_CACHE_DIR"] == str(root / "jax")


def test_doctor_says_whether_the_tier_is_on_where_and_why(sshfs_root, tmp_path):
    base = tmp_path / "node-local"
    on = write_config(tmp_path / "on.yaml", tier_config(base))
    text = run_cli("doctor", "--config", str(on), "--cache-root", str(sshfs_root / "cache"))
    assert text.returncode == 0, text.stderr
    line = next(line for line in text.stdout.splitlines() if line.startswith("local tier:"))
    local = base / tier_digest(sshfs_root / "cache")
    assert line.startswith(f"local tier: on in {local} (")
    assert "free, bound 20.0 GiB; the cache root is on fuse.sshfs, a network filesystem" in line
    report = json.loads(run_cli("doctor", "--json", "--config", str(on), "--cache-root",
                                str(sshfs_root / "cache")).stdout)
    assert report["tier"]["on"] is True and report["tier"]["free_bytes"] > 0
    local_root = run_cli("doctor", "--config", str(on), "--cache-root", str(tmp_path / "cache"))
    assert "local tier: off (the cache root is on " in local_root.stdout
    assert "local to this node (local_tier.mode: auto))" in local_root.stdout
    _world_writable(tmp_path / "bad")
    bad = write_config(tmp_path / "bad.yaml", tier_config(tmp_path / "bad"))
    refused = run_cli("doctor", "--config", str(bad), "--cache-root", str(sshfs_root / "cache"))
    assert "local tier: off (PROBLEM: " in refused.stdout and "world-writable" in refused.stdout
    assert "result: ok" in refused.stdout  # jobs still run, on the shared root


def test_the_schema_gives_local_tier_defaults_and_refuses_bad_values(tmp_path):
    from gpu_cache.config import settings

    loaded = settings.settings_from({})
    assert loaded.local_tier == settings.LocalTierConfig("auto", "", 20 << 30)
    for bad, key in (({"mode": "sometimes"}, "local_tier.mode"),
                     ({"max_size": "lots"}, "local_tier.max_size"), ({"folders": "/x"}, "local_tier")):
        config = write_config(tmp_path / "bad.yaml", {"local_tier": bad})
        result = run_cli("env", "--config", str(config), "--cache-root", str(tmp_path / "c"))
        assert result.returncode == 2 and key in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    # ~ and $VARS in the folder are expanded (a per-user folder from one team config).
    expanded = settings.settings_from({"local_tier": {"folder": "$GPU_CACHE_TEST_X/t"}}, str(tmp_path / "c"))
    from gpu_cache.jobenv import tier

    os.environ["GPU_CACHE_TEST_X"] = str(tmp_path)
    try:
        assert tier.location(expanded).folder.parent == tmp_path / "t"
    finally:
        del os.environ["GPU_CACHE_TEST_X"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_a_read_only_root_with_the_tier_keeps_new_entries_on_the_node(tmp_path):
    """The read-only root with the tier on: jobs read it on a miss and keep what they compile
    in the tier (promotion cannot happen); no seed reader is needed for Triton."""
    root = tmp_path / "cache"
    run_cli("env", "--cache-root", str(root))  # its folders, made while writable
    os.system(f"mount --bind {root} {root} && mount -o remount,ro,bind {root}")
    try:
        out = env_json(root, tier_config(tmp_path / "t", mode="on"), tmp_path)
        plain = env_json(root, {}, tmp_path)  # local disk: no tier by default
    finally:
        os.system(f"umount {root}")
    local = tmp_path / "t" / tier_digest(root)
    exports = out["exports"]
    assert out["tier"]["on"] is True
    assert [exports[name] for name in TIERED] == [str(local / k) for k in ("jax", "triton", "inductor")]
    assert "GPU_CACHE_TRITON_SEED" not in exports and "TRITON_CACHE_MANAGER" not in exports
    for kind in ("jax", "triton", "inductor"):
        assert out["adjusted"][kind] == (f"{root / kind} is read-only: jobs read it on a miss and keep "
                                         f"new entries on this node in {local / kind}")
    # Without the tier the seed reader serves Triton as before.
    assert plain["tier"]["on"] is False
    assert plain["exports"]["GPU_CACHE_TRITON_SEED"] == str(root / "triton")


@pytest.mark.skipif(not os.access("/srv", os.W_OK), reason="needs a writable /srv (outside /tmp)")
def test_a_local_folder_outside_tmp_is_bound_into_containers(tmp_path):
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="gpu-cache-tier-test-", dir="/srv"))
    try:
        root = tmp_path / "cache"
        out = env_json(root, tier_config(base, mode="on"), tmp_path)
        local = str(base / tier_digest(root))
        assert out["tier"]["on"] is True
        assert local in out["exports"]["APPTAINER_BIND"].split(",")
        assert local in out["exports"]["SINGULARITY_BIND"].split(",")
    finally:
        shutil.rmtree(base)
