"""``stats`` and ``prune`` over both tiers (issue 23): the shared cache root as before, and this
node's local tier of it, bounded as a whole to ``local_tier.max_size``; the promotion's
temporary files (``.gpu-cache-tmp.*``) are removed in both once older than the grace period, a
young one (a promotion under way) is left alone. Real JAX entries (compiled on the CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_cache.core import kinds
from gpu_cache.core.kinds import jax_format as jax_cache
from gpu_cache.core.kinds import tier_name as tier_digest
from helpers import FILLER, clean_environ, run_cli, write_config

HOUR = 3600.0


def two_tiers(tmp_path: Path, twelve_entries: Path, max_size: str = "20G") -> tuple[Path, Path, Path]:
    """A cache root with the twelve entries, this node's tier of it with the same twelve (as
    after fetches) and a config whose tier is there; returns (root, local, config)."""
    root, base = tmp_path / "cache", tmp_path / "node-local"
    local = base / tier_digest(root)
    shutil.copytree(twelve_entries, root / "jax")
    shutil.copytree(twelve_entries, local / "jax")
    for folder in (base, local, local / "jax"):
        folder.chmod(0o700)
    config = write_config(tmp_path / "c.yaml", {"local_tier": {"mode": "on", "folder": str(base),
                                                               "max_size": max_size}})
    return root, local, config


def aged(path: Path, seconds: float) -> Path:
    when = time.time() - seconds
    os.utime(path, (when, when))
    return path


def temporary(folder: Path, name: str, age: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".gpu-cache-tmp.node-a.{os.getpid()}.{name}"
    path.write_bytes(b"x" * 100)
    return aged(path, age)


def test_stats_shows_both_tiers(tmp_path, twelve_entries):
    root, local, config = two_tiers(tmp_path, twelve_entries)
    shutil.rmtree(local / "jax")
    (local / "jax").mkdir()
    for entry in jax_cache.scan(twelve_entries)[:6]:  # six entries fetched on this node
        for path in (entry.cache_path, entry.atime_path):
            if path is not None:
                shutil.copy2(path, local / "jax" / path.name)
    stale = temporary(local / "jax", "old", 2 * HOUR)  # a killed promotion, seen as broken
    result = run_cli("stats", "--json", "--config", str(config), "--cache-root", str(root))
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["kinds"]["jax"]["entries"] == 12
    tier = stats["tier"]
    assert tier["local"] == str(local) and tier["max_size"] == 20 << 30
    assert tier["kinds"]["jax"]["entries"] == 6 + 1  # and the stale temporary
    assert tier["kinds"]["jax"]["broken"] == 1
    assert tier["kinds"]["jax"]["broken_entries"][0]["key"] == stale.name
    assert set(tier["kinds"]) == set(kinds.names_of(kinds.TIERED))  # every kind the tier holds, empty or not
    text = run_cli("stats", "--config", str(config), "--cache-root", str(root)).stdout
    assert f"local tier (this node): {local}, " in text and "of 20.0 GiB" in text
    # No tier on this node: the section is empty.
    shutil.rmtree(local)
    none = json.loads(run_cli("stats", "--json", "--config", str(config), "--cache-root", str(root)).stdout)
    assert none["tier"]["kinds"] == {} and "local tier" not in run_cli(
        "stats", "--config", str(config), "--cache-root", str(root)).stdout


def test_prune_bounds_the_local_tier_to_its_own_size_and_leaves_the_root_to_its_own(tmp_path, twelve_entries):
    root, local, config = two_tiers(tmp_path, twelve_entries, max_size="20K")
    one = sum(e.size for e in jax_cache.scan(twelve_entries)) / 12
    assert 20_000 / one < 12  # the bound holds fewer than twelve
    # The local entries used longest ago go first: make half of them an hour older.
    entries = sorted(jax_cache.scan(local / "jax"), key=lambda e: e.key)
    for entry in entries[:6]:
        for path in (entry.cache_path, entry.atime_path):
            if path is not None:
                aged(path, HOUR)
    result = run_cli("prune", "--json", "--config", str(config), "--cache-root", str(root))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == []
    assert report["jax"]["entries_removed"] == 0 and len(jax_cache.scan(root / "jax")) == 12
    tier = report["tier"]
    assert tier["local"] == str(local) and tier["max_size"] == 20 * 1024
    jax = tier["kinds"]["jax"]
    assert jax["entries_before"] == 12 and jax["entries_removed"] > 0
    assert jax["bytes_after"] <= 20 * 1024
    left = jax_cache.scan(local / "jax", verify_after=0.0)
    assert sum(e.size for e in left) <= 20 * 1024 and all(e.problem is None for e in left)
    removed = {row["key"] for row in jax["removed"]}
    old = {e.key for e in entries[:6]}
    assert removed <= old or old <= removed  # the oldest went first
    assert all(row["reason"] == "least recently used over max_size" for row in jax["removed"])
    (tmp_path / "prune.json").write_text(result.stdout)
    summary = run_cli("summary", "--prune", str(tmp_path / "prune.json"))
    assert summary.returncode == 0, summary.stderr
    line = next(x for x in summary.stdout.splitlines() if "local tier of the pruning node: " in x)
    assert line.endswith(f"in {12 - jax['entries_removed']} entries (bound 20.0 KiB; removed "
                         f"{jax['entries_removed']}) in {local}"), line
    text = run_cli("prune", "--dry-run", "--max-size", "1K", "--config", str(config),
                   "--cache-root", str(root))
    assert "would remove local tier jax " not in text.stdout  # within its bound now
    assert "would remove jax " in text.stdout  # the root's own --max-size


def test_prune_removes_old_promotion_temporaries_in_both_tiers_leaves_young_ones(tmp_path, twelve_entries):
    root, local, config = two_tiers(tmp_path, twelve_entries)
    old = [temporary(root / "jax", "a", 2 * HOUR), temporary(root / "triton", "b", 2 * HOUR),
           temporary(root / "inductor", "c", 2 * HOUR), temporary(local / "jax", "d", 2 * HOUR),
           temporary(local / "triton", "e", 2 * HOUR)]
    young = [temporary(root / "jax", "f", 60), temporary(root / "triton", "g", 60),
             temporary(local / "jax", "h", 60), temporary(local / "inductor", "i", 60)]
    dry = json.loads(run_cli("prune", "--json", "--dry-run", "--config", str(config), "--cache-root",
                             str(root)).stdout)
    planned = [row["key"] for kind in ("jax", "triton", "inductor") for row in dry[kind]["removed"]]
    planned += [row["key"] for part in dry["tier"]["kinds"].values() for row in part["removed"]]
    assert sorted(planned) == sorted(p.name for p in old)
    assert all(p.exists() for p in old + young)  # a dry run removes nothing
    result = run_cli("prune", "--json", "--config", str(config), "--cache-root", str(root))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["problems"] == []
    assert all("interrupted promotion" in row["reason"] for kind in ("jax", "triton", "inductor")
               for row in report[kind]["removed"])
    assert not any(p.exists() for p in old)
    assert all(p.exists() for p in young)
    # The entries themselves stay (within both bounds).
    assert len(jax_cache.scan(root / "jax")) == len(jax_cache.scan(local / "jax")) == 12


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's folder needs root")
def test_prune_leaves_an_untrusted_local_tier_alone(tmp_path, twelve_entries):
    root, local, config = two_tiers(tmp_path, twelve_entries, max_size="1K")
    local.chmod(0o777)
    result = run_cli("prune", "--json", "--config", str(config), "--cache-root", str(root))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert any(p.startswith("local tier: ") and "world-writable" in p and p.endswith("not pruned")
               for p in report["problems"]), report["problems"]
    assert report["tier"]["kinds"] == {} and len(jax_cache.scan(local / "jax")) == 12


@pytest.mark.slow  # a JAX job in a fresh process: more than 2 s here
def test_a_job_in_the_tier_used_the_roots_cache_not_one_outside_it(tmp_path):
    """A job whose JAX cache folder is the root's tier (its record names that folder): stats
    and doctor do not call it a folder outside the cache root, and its new entries count."""
    root, base = tmp_path / "cache", tmp_path / "node-local"
    config = write_config(tmp_path / "c.yaml", {"local_tier": {"mode": "on", "folder": str(base)}})
    exports = json.loads(run_cli("env", "--json", "--config", str(config), "--cache-root",
                                 str(root)).stdout)["exports"]
    assert exports["JAX_COMPILATION_CACHE_DIR"] == str(base / tier_digest(root) / "jax")
    job = subprocess.run([sys.executable, "-c", FILLER, "2"], env=clean_environ(**exports),
                         capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    stats = json.loads(run_cli("stats", "--json", "--config", str(config), "--cache-root", str(root)).stdout)
    assert stats["usage"]["by_rule"]["-"]["processes"] == 1
    assert stats["outside_root"] == []
    assert stats["tier"]["kinds"]["jax"]["entries"] + stats["kinds"]["jax"]["entries"] >= 2


def test_pack_takes_the_root_and_the_local_entries_it_lacks(tmp_path, twelve_entries):
    """Six entries were promoted to the root, twelve are in this node's tier: the archive holds
    the twelve, each once; an unpack elsewhere gets them all."""
    root, local, config = two_tiers(tmp_path, twelve_entries)
    for entry in jax_cache.scan(root / "jax")[6:]:  # six not promoted (yet)
        jax_cache.remove(root / "jax", entry)
    archive = tmp_path / "cache.tar"
    packed = run_cli("pack", str(archive), "--json", "--kind", "jax", "--config", str(config),
                     "--cache-root", str(root))
    assert packed.returncode == 0, packed.stderr
    assert json.loads(packed.stdout)["entries"] == {"jax": 12}
    other = tmp_path / "other"
    unpacked = run_cli("unpack", str(archive), "--cache-root", str(other))
    assert unpacked.returncode == 0, unpacked.stderr
    assert sorted(e.key for e in jax_cache.scan(other / "jax")) == \
        sorted(e.key for e in jax_cache.scan(twelve_entries))
    # Without a tier on this node: the root's six.
    shutil.rmtree(local)
    alone = run_cli("pack", str(tmp_path / "six.tar"), "--json", "--kind", "jax", "--config", str(config),
                    "--cache-root", str(root))
    assert json.loads(alone.stdout)["entries"] == {"jax": 6}

