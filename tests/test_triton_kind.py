"""Triton as a cache kind end to end: warm and validate ahead of time on the CPU, stats, prune."""

import json
import os
import time
from pathlib import Path

import pytest

from helpers import read_json, run_cli

pytestmark = pytest.mark.slow  # every test here runs JAX or Snakemake for seconds

TRITON = json.dumps({"default_workloads": ["triton-kernels"],
                     "workloads": {"triton-kernels": {"shapes": [1000]}},
                     "validate": {"measure_cold": False}})


def warm(cache_root: Path, tmp_path: Path) -> None:
    result = run_cli("warm", "--config-json", TRITON, "--cache-root", str(cache_root),
                     "--output", str(tmp_path / "w.json"), "--log", str(tmp_path / "log"))
    assert result.returncode == 0, result.stderr


def test_aot_warm_then_fresh_process_hits_every_kernel(cache_root, tmp_path):
    warm(cache_root, tmp_path)
    assert read_json(tmp_path / "w.json")["new_entries"]["triton"] == 5
    result = run_cli("validate", "--config-json", TRITON, "--cache-root", str(cache_root),
                     "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    assert result.returncode == 0, result.stderr
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["triton"] == {"hits": 5, "misses": 0, "new_entries": 0, "processes_observed": 1}


def test_stats_name_the_kernels(cache_root, tmp_path):
    warm(cache_root, tmp_path)
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(cache_root)).stdout)
    names = {row["name"] for row in stats["kinds"]["triton"]["by_function"]}
    assert names == {"vector_add_kernel", "row_softmax_kernel", "tiled_matmul_kernel"}
    assert stats["kinds"]["triton"]["entries"] == 5


def test_prune_removes_whole_groups_least_recently_used_first(cache_root, tmp_path):
    warm(cache_root, tmp_path)
    folder = cache_root / "triton"
    keys = sorted(p.name for p in folder.iterdir())
    old = time.time() - 3 * 86400
    for key in keys[:2]:  # the two least recently used
        for path in [folder / key, *(folder / key).iterdir()]:
            os.utime(path, (old, old))
    result = run_cli("prune", "--cache-root", str(cache_root), "--max-age", "2d", "--kind", "triton",
                     "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert sorted(r["key"] for r in report["triton"]["removed"]) == keys[:2]
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == keys[2:]
    # The next fresh process recompiles exactly the two removed kernels and hits the rest.
    result = run_cli("validate", "--config-json", TRITON, "--cache-root", str(cache_root),
                     "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    verdict = read_json(tmp_path / "v.json")
    assert verdict["triton"]["hits"] == 3 and verdict["triton"]["misses"] == 2


def test_prune_repairs_incomplete_groups_and_stale_temp_folders(cache_root, tmp_path):
    warm(cache_root, tmp_path)
    folder = cache_root / "triton"
    broken, stale_home = sorted(p for p in folder.iterdir())[:2]
    next(p for p in broken.iterdir() if p.suffix == ".cubin").unlink()  # a half-written group
    stale = stale_home / "tmp.pid_999999_0123456789ab-cdef-0123-4567-89abcdef0123"
    stale.mkdir()
    (stale / "x.cubin").write_bytes(b"partial")
    old = time.time() - 7200
    for path in (broken, stale, stale / "x.cubin", *broken.iterdir()):
        os.utime(path, (old, old))
    report = json.loads(run_cli("prune", "--cache-root", str(cache_root), "--json").stdout)
    reasons = {r["key"]: r["reason"] for r in report["triton"]["removed"]}
    assert reasons[broken.name].startswith("broken")
    assert reasons[f"{stale_home.name}/{stale.name}"].startswith("broken: stale temporary")
    assert not broken.exists() and not stale.exists() and stale_home.exists()


def test_stats_flag_incomplete_stale_and_copied_groups(cache_root, tmp_path):
    warm(cache_root, tmp_path)
    folder = cache_root / "triton"
    incomplete, stale_home = sorted(folder.iterdir())[:2]
    next(p for p in incomplete.iterdir() if p.suffix == ".cubin").unlink()
    stale = stale_home / "tmp.pid_999999_0123456789ab-cdef-0123-4567-89abcdef0123"
    stale.mkdir()
    old = time.time() - 7200
    for path in (incomplete, stale, *incomplete.iterdir()):
        os.utime(path, (old, old))
    report = json.loads(run_cli("stats", "--json", "--cache-root", str(cache_root)).stdout)["kinds"]["triton"]
    problems = {row["key"]: row["problem"] for row in report["broken_entries"]}
    assert report["broken"] == 2
    assert incomplete.name in problems and f"{stale_home.name}/{stale.name}" in problems
    text = run_cli("stats", "--cache-root", str(cache_root)).stdout
    assert f"broken: {incomplete.name}" in text

    # A cache copied to another path: its manifests still name the old files.
    copy_root = tmp_path / "copied"
    import shutil

    shutil.copytree(cache_root / "triton", copy_root / "triton")
    for path in (copy_root / "triton").rglob("*"):
        os.utime(path, (old, old))
    copied = json.loads(run_cli("stats", "--json", "--cache-root", str(copy_root)).stdout)["kinds"]["triton"]
    outside = [row for row in copied["broken_entries"] if "outside" in row["problem"]]
    assert len(outside) >= 3, copied["broken_entries"]
