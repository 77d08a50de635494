"""No wait: the warm step runs a type's shapes side by side, and a re-run on a warm root only
validates (the cold time is measured once per set of inputs, the warm pass is skipped while
the last verdict of the same inputs holds)."""

from __future__ import annotations

import json
import os
from importlib import metadata

import pytest

from helpers import (
    PROFILE,
    SCRIPTS,
    SMALL,
    SNAKEFILE,
    clean_environ,
    read_json,
    run_cli,
    run_snakemake,
    workdir_with_config,
)

pytestmark = pytest.mark.slow  # every test here runs JAX or Snakemake for seconds


def run_workflow(tmp_path, name, env):
    work = workdir_with_config(tmp_path / name, SMALL)
    result = run_snakemake(work, "-s", SNAKEFILE, "--profile", PROFILE, "--cores", "2", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    results = work / "results" / "gpu-cache"
    return (read_json(results / "warm" / "cpu.json"), read_json(results / "check" / "cpu.json"),
            read_json(results / "validate" / "cpu.json"))


def test_a_rerun_on_a_warm_root_only_validates_until_the_cache_changes(tmp_path):
    env = clean_environ(GPU_CACHE_ROOT=str(tmp_path / "cache"))
    warm, check, verdict = run_workflow(tmp_path, "first", env)
    assert warm["skipped"] is None and warm["runs"] and verdict["passed"] is True
    assert check["cold"]["reused"] is None  # measured now
    # A new working directory on the same root: nothing to warm, the cold time is known.
    warm, check, verdict = run_workflow(tmp_path, "second", env)
    assert warm["skipped"] and warm["runs"] == []
    assert check["cold"]["reused"] and check["validate"]["runs"]
    assert verdict["passed"] is True and verdict["cold_seconds"] is not None
    assert any("measured earlier" in note for note in verdict["notes"])
    # Pruning what validation hit makes the next run warm again, and it still passes.
    pruned = run_cli("prune", "--kind", "jax", "--max-size", "0", "--cache-root", str(tmp_path / "cache"))
    assert pruned.returncode == 0, pruned.stderr
    warm, _check, verdict = run_workflow(tmp_path, "third", env)
    assert warm["skipped"] is None and warm["runs"] and verdict["passed"] is True


#: A workload run that notes when it started and ended, and takes a second.
NOTE_TIMES = """
import sys, time
started = time.time()
time.sleep(1)
with open(sys.argv[1], "a") as times:
    times.write(f"{started} {time.time()}\\n")
"""


def test_warm_runs_the_shapes_side_by_side(tmp_path):
    times, script = tmp_path / "times.txt", tmp_path / "sleepy.py"
    script.write_text(NOTE_TIMES)
    config = {"workloads": {"sleepy": {"command": f"{{python}} '{script}' '{times}'",
                                       "shapes": [1, 2, 3]}},
              "default_workloads": ["sleepy"], "warm": {"parallel": 3}}
    result = run_cli("warm", "--config-json", json.dumps(config), "--cache-root", str(tmp_path / "c"),
                     "--output", str(tmp_path / "w.json"))
    assert result.returncode == 0, result.stderr
    spans = sorted(tuple(map(float, line.split())) for line in times.read_text().splitlines())
    assert len(spans) == 3
    assert spans[-1][0] < spans[0][1]  # the last one started before the first one ended
    assert len(read_json(tmp_path / "w.json")["runs"]) == 3


def test_a_check_job_that_warms_first_says_so_in_the_summary_and_names_the_package(tmp_path):
    """Installing a package of the software's identity (zstandard: the test extra brings it,
    and JAX compresses its entries with it) changes what the last passed verdict holds for. The
    next run's warm job is planned to run nothing (the same plan passed), so its check job warms
    first: the summary says so, with the count and the package (it said "0 new entries", and
    the warm log "skipped"; only validate/cpu.json told)."""
    hidden = tmp_path / "no-zstandard"  # the first run's Python finds no zstandard version
    (hidden / "zstandard-0.dist-info").mkdir(parents=True)
    (hidden / "zstandard-0.dist-info" / "METADATA").write_text("")
    root = str(tmp_path / "cache")
    _warm, _check, verdict = run_workflow(tmp_path, "first", clean_environ(
        GPU_CACHE_ROOT=root, PYTHONPATH=f"{hidden}{os.pathsep}{SCRIPTS}"))
    assert verdict["passed"] is True and verdict["software"]["zstandard"] is None, verdict["software"]

    warm, check, verdict = run_workflow(tmp_path, "second", clean_environ(GPU_CACHE_ROOT=root))
    assert warm["skipped"] and check["warm"]["runs"], check["warm"]  # planned to skip; the check warmed
    installed = f"zstandard {metadata.version('zstandard')} installed"
    again = verdict["warmed_again"]
    assert again["why"].endswith(f"ran with other inputs: {installed}"), again
    summary = (tmp_path / "second" / "work" / "results" / "gpu-cache" / "summary.txt").read_text()
    new = verdict["warmed_again"]["new_entries"]
    assert (f"\n    the check job warmed again first ({new} new entries): the last passed validation of "
            f"the same plan ran with other inputs: {installed}\n") in summary, summary
