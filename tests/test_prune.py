"""Pruning real JAX caches: LRU order, max age, whole pairs, dry runs, repairs, the CLI."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_cache.commands.prune import prune
from gpu_cache.config.settings import settings_from
from gpu_cache.core import verified
from gpu_cache.core.kinds import jax_format as jax_cache
from helpers import jax_job_env, read_json, run_cli

FILL = """
import jax, jax.numpy as jnp, numpy as np
for i in range({start}, {start} + {n}):
    jax.jit(lambda x, i=i: jnp.sin(x) * (i + 1))(np.ones({size}, np.float32)).block_until_ready()
"""


def fill_jax_cache(folder: Path, n: int = 4, size: int = 64, max_size: int | None = None,
                   start: int = 0) -> list:
    """Compile ``n`` distinct real programs into a JAX cache folder; return its entries."""
    before = len(jax_cache.scan(folder))
    env = jax_job_env(folder, shared_fs=True)
    if max_size is not None:
        env["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(max_size)
    subprocess.run([sys.executable, "-c", FILL.format(n=n, size=size, start=start)], env=env, check=True)
    entries = jax_cache.scan(folder)
    assert len(entries) == before + n, "each program must make exactly one entry"
    return entries


def age_entries(entries, start_days_ago: float, order: tuple[int, ...] = ()) -> dict[str, float]:
    """Give each entry a distinct last use, oldest first in key order, or in ``order`` (the
    rank by age of each entry in key order); returns key -> last use."""
    now = time.time()
    uses = {}
    for i, entry in enumerate(sorted(entries, key=lambda e: e.key)):
        when = now - (start_days_ago - (order[i] if order else i)) * 86400
        os.utime(entry.cache_path, (when, when))
        uses[entry.key] = when
    return uses


@pytest.fixture(scope="module")
def template_cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("template") / "jax"
    fill_jax_cache(folder, n=4)
    return folder


@pytest.fixture
def root(tmp_path, template_cache):
    import shutil

    shutil.copytree(template_cache, tmp_path / "root" / "jax")
    return tmp_path / "root"


def test_least_recently_used_go_first_until_under_the_cap(root):
    entries = jax_cache.scan(root / "jax")
    uses = age_entries(entries, start_days_ago=10)
    sizes = {e.key: e.size for e in entries}
    by_use = sorted(uses, key=uses.get)
    cap = sum(sizes.values()) - sizes[by_use[0]] - 1  # forces out the two oldest
    report = prune(settings_from({}, cache_root=str(root)), max_size=cap, max_age=1e9, dry_run=False)
    removed = [r["key"] for r in report.kinds["jax"].removed]
    assert removed == by_use[:2]
    left = {e.key for e in jax_cache.scan(root / "jax")}
    assert left == set(by_use[2:])
    assert report.kinds["jax"].bytes_after == sum(sizes[k] for k in left) <= cap


def test_least_recently_used_go_first_when_ages_are_not_in_key_order(root):
    # (#19) Ranks by age against key order: by key, the first two would go.
    entries = jax_cache.scan(root / "jax")
    uses = age_entries(entries, start_days_ago=10, order=(3, 0, 2, 1))
    sizes = {e.key: e.size for e in entries}
    by_use = sorted(uses, key=uses.get)
    assert by_use[:2] != sorted(uses)[:2]
    cap = sum(sizes.values()) - sizes[by_use[0]] - 1  # forces out the two oldest
    report = prune(settings_from({}, cache_root=str(root)), max_size=cap, max_age=1e9, dry_run=False)
    assert [r["key"] for r in report.kinds["jax"].removed] == by_use[:2]
    assert {e.key for e in jax_cache.scan(root / "jax")} == set(by_use[2:])


def test_entries_unused_longer_than_max_age_go(root):
    entries = jax_cache.scan(root / "jax")
    age_entries(entries, start_days_ago=40)  # 40, 39, 38, 37 days ago
    report = prune(settings_from({}, cache_root=str(root)), max_size=1 << 40, max_age=38.5 * 86400,
                   dry_run=False)
    assert report.kinds["jax"].entries_removed == 2
    assert all(r["reason"] == "unused longer than max_age" for r in report.kinds["jax"].removed)
    assert len(jax_cache.scan(root / "jax")) == 2


def test_dry_run_deletes_nothing_and_reports_the_same(root):
    before = sorted(p.name for p in (root / "jax").iterdir())
    settings = settings_from({}, cache_root=str(root))
    dry = prune(settings, max_size=0, max_age=1e9, dry_run=True)
    # A dry run may add the record of what it verified (no cache reads it), nothing else.
    assert sorted(p.name for p in (root / "jax").iterdir() if p.name != verified.NAME) == before
    assert dry.kinds["jax"].dry_run is True and dry.kinds["jax"].entries_removed == 4
    real = prune(settings, max_size=0, max_age=1e9, dry_run=False)
    assert real.kinds["jax"].entries_removed == dry.kinds["jax"].entries_removed
    assert real.kinds["jax"].bytes_removed == dry.kinds["jax"].bytes_removed


@pytest.mark.slow
def test_capped_cache_loses_whole_pairs_and_keeps_working(tmp_path):
    folder = tmp_path / "jax"
    entries = fill_jax_cache(folder, n=4, max_size=1 << 30)
    assert all(e.atime_path is not None for e in entries), "a capped cache has -atime sidecars"
    age_entries(entries, start_days_ago=5)
    prune(settings_from({}, cache_root=str(tmp_path)), max_size=0, max_age=1e9, dry_run=False)
    assert not any(folder.glob("*-cache")) and not any(folder.glob("*-atime"))
    # JAX reads every -atime when it evicts: a half-deleted pair would make this write fail.
    again = fill_jax_cache(folder, n=2, max_size=1 << 30, start=10)
    assert len(again) == 2 and all(e.problem is None for e in again)


@pytest.mark.slow
def test_atime_sidecar_counts_as_last_use(tmp_path):
    folder = tmp_path / "jax"
    entries = fill_jax_cache(folder, n=2, max_size=1 << 30)
    old = time.time() - 100 * 86400
    for entry in entries:
        entry.atime_path.write_bytes(int(old * 1e9).to_bytes(8, "little"))
        for path in (entry.cache_path, entry.atime_path):
            os.utime(path, (old, old))
    fresh = sorted(entries, key=lambda e: e.key)[0]
    fresh.atime_path.write_bytes(time.time_ns().to_bytes(8, "little"))
    os.utime(fresh.atime_path, (old, old))  # only the recorded time says "used now"
    report = prune(settings_from({}, cache_root=str(tmp_path)), max_size=1 << 40, max_age=30 * 86400,
                   dry_run=False)
    assert [r["key"] for r in report.kinds["jax"].removed] == [sorted(e.key for e in entries)[1]]


def test_broken_entries_are_repaired(root):
    folder = root / "jax"
    victim = jax_cache.scan(folder)[0]
    victim.cache_path.write_bytes(b"")  # what a full disk leaves behind
    orphan = folder / ("jit_gone-" + "0" * 64 + "-atime")
    orphan.write_bytes(time.time_ns().to_bytes(8, "little"))
    report = prune(settings_from({}, cache_root=str(root)), max_size=1 << 40, max_age=1e9, dry_run=False)
    reasons = {r["key"]: r["reason"] for r in report.kinds["jax"].removed}
    assert "empty -cache" in reasons[victim.key]
    assert "without -cache" in reasons[orphan.name.removesuffix("-atime")]
    assert len(jax_cache.scan(folder)) == 3


def test_prune_cli_writes_the_report(root, tmp_path):
    out = tmp_path / "prune.json"
    result = run_cli("prune", "--cache-root", str(root), "--max-size", "0", "--dry-run", "--output", str(out))
    assert result.returncode == 0, result.stderr
    report = read_json(out)
    for kind in ("jax", "triton"):
        for field in ("entries_before", "bytes_before", "entries_removed", "bytes_removed",
                      "bytes_after", "dry_run"):
            assert field in report[kind]
    assert report["jax"]["entries_before"] == 4 and report["jax"]["dry_run"] is True
    assert len(list((root / "jax").glob("*-cache"))) == 4


def test_prune_of_a_missing_root_touches_nothing(tmp_path):
    result = run_cli("prune", "--cache-root", str(tmp_path / "absent"), "--json")
    assert result.returncode == 0
    assert not (tmp_path / "absent").exists()


@pytest.mark.slow
def test_a_lone_cache_file_in_a_capped_cache_gets_its_atime_back(tmp_path):
    folder = tmp_path / "jax"
    entries = fill_jax_cache(folder, n=2, max_size=1 << 30)
    lone = entries[0]
    lone.atime_path.unlink()  # what a pruner that deletes -atime alone leaves behind
    report = prune(settings_from({}, cache_root=str(tmp_path)), max_size=1 << 40, max_age=1e9, dry_run=False)
    assert report.kinds["jax"].repaired == 1 and report.kinds["jax"].entries_removed == 0
    assert (folder / f"{lone.key}-atime").exists()
    # A capped JAX evicts again, reading every -atime: this write must work.
    more = fill_jax_cache(folder, n=3, max_size=1 << 30, start=10)
    assert all(e.atime_path is not None for e in more)


# --- damage that keeps the size: entries verified before are read again in turn (#21) -------


def test_rechecks_go_in_digest_order_from_where_the_last_scan_stopped(tmp_path, monkeypatch):
    """With no time to spare, each verifying scan reads RECHECK_AT_LEAST entries again, the
    next ones in digest order after the last scan's (kept in the record), round and round:
    every entry within ceil(n / RECHECK_AT_LEAST) scans; a scan that does not verify reads none."""
    monkeypatch.setattr(verified, "RECHECK_SHARE", 0.0)
    n, step = 150, verified.RECHECK_AT_LEAST
    digests = [verified.digest(7, i) for i in range(n)]
    passes = []
    for _ in range(4):
        record = verified.Record.load(tmp_path)
        for key in digests:
            record.put(key, 1)
            record.candidate(key, key)
        passes.append(list(record.rechecks(spent=10.0)))
        record.save()
    in_order = sorted(digests)
    assert passes[0] == in_order[:step] and passes[1] == in_order[step:2 * step]
    assert passes[2] == in_order[2 * step:] + in_order[:3 * step - n]  # round again
    assert set(passes[0] + passes[1] + passes[2]) == set(digests)
    assert passes[3] == in_order[3 * step - n:4 * step - n]
    stats = verified.Record.load(tmp_path, complete=False)
    stats.candidate(digests[0], digests[0])
    assert list(stats.rechecks(spent=10.0)) == []


def test_damage_in_a_large_cache_is_found_in_turn_and_remembered(tmp_path, template_cache, monkeypatch):
    """200 entries, one damaged in place with its size and mtime kept after it was verified:
    dry runs that read 64 entries again each find it within 4 of them, and every later one
    still reports it (the record remembers), whatever it reads again; no whole entry is ever
    called broken."""
    monkeypatch.setattr(verified, "RECHECK_SHARE", 0.0)
    folder = tmp_path / "root" / "jax"
    folder.mkdir(parents=True)
    body = min((p.read_bytes() for p in template_cache.glob("*-cache")), key=len)
    old = time.time() - 3600
    for i in range(200):
        path = folder / f"jit_copy-{i:064x}-cache"
        path.write_bytes(body)
        os.utime(path, (old, old))
    settings = settings_from({}, cache_root=str(tmp_path / "root"))
    first = prune(settings, max_size=1 << 40, max_age=1e9, dry_run=True).kinds["jax"]
    assert first.entries_removed == 0 and first.entries_before == 200
    victim = folder / f"jit_copy-{123:064x}-cache"
    info = victim.stat()
    with victim.open("r+b") as file:
        file.seek(info.st_size // 2)
        byte = file.read(1)
        file.seek(info.st_size // 2)
        file.write(bytes([byte[0] ^ 0x01]))  # one bit, as bit rot does
    os.utime(victim, ns=(info.st_atime_ns, info.st_mtime_ns))
    found = []
    for _ in range(6):
        report = prune(settings, max_size=1 << 40, max_age=1e9, dry_run=True).kinds["jax"]
        found.append([(r["key"], r["reason"]) for r in report.removed])
    first_seen = next(i for i, removed in enumerate(found) if removed)
    assert first_seen < 4, found
    assert all(removed == [(victim.name[:-6], "broken: " + jax_cache.CHANGED)]
               for removed in found[first_seen:]), found
