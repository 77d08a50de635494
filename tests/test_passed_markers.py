"""The markers a passed validation leaves in the root's state folder (docs/outputs.md): the host
plans the next warm job of the same plan to run no workload (and ask for no GPU) from its plan's
marker alone, only while every entry that validation hit is still there and the plan is the
same (its workloads, shapes and image); prune bounds the markers by age. A real warm and
validation of a user's workload (``jit(plus_one)`` on the CPU), then ``gpu-cache doctor``'s
plan of the warm job (``placement``), as the workflow reads it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import clean_environ, read_json, run_cli, write_config
from wrong_entries import PLUS_ONE

DAY = 86400.0


def config(folder: Path, **extra: object) -> Path:
    program = folder / "plus_one.py"
    program.write_text(PLUS_ONE)
    return write_config(folder / f"c{len(extra)}.yaml", {
        "workloads": {"plus": {"command": f"{{python}} {program} {folder}/{{shape}}.npy", "shapes": [3],
                               "outputs": f"{folder}/{{shape}}.npy"}},
        "default_workloads": ["plus"], **extra})


@pytest.fixture(scope="module")
def validated(tmp_path_factory) -> tuple[Path, Path]:
    """A cache root warmed and validated (passed) for the plus workload, and its config."""
    folder = tmp_path_factory.mktemp("validated")
    plus = config(folder)
    common = ("--config", str(plus), "--cache-root", str(folder / "root"), "--log", str(folder / "log"))
    assert run_cli("warm", *common, "--output", str(folder / "w.json")).returncode == 0
    assert run_cli("validate", *common, "--output", str(folder / "v.json")).returncode == 0
    assert read_json(folder / "v.json")["passed"] is True
    return folder / "root", plus


@pytest.fixture
def root(validated, tmp_path) -> Path:
    """A copy of the validated root, for a test to change."""
    copy = tmp_path / "root"
    shutil.copytree(validated[0], copy, symlinks=True)
    return copy


def planned_skip(root: Path, plus: Path) -> str | None:
    """Why ``gpu-cache doctor`` plans the warm job to run no workload (None: it warms)."""
    done = run_cli("doctor", "--json", "--no-fail", "--config", str(plus), "--cache-root", str(root))
    assert done.returncode == 0, done.stderr[-3000:]
    (plan,) = json.loads(done.stdout)["placement"].values()
    return plan["skip"]


def plan_marker(root: Path) -> Path:
    (marker,) = (root / "state").glob("plan-*.json")
    return marker


def test_the_planned_skip_reads_its_plans_marker_alone_and_checks_its_entries(validated, root):
    """The plan's marker names the entries its validation hit: while they are there, the warm job
    is planned to run nothing; with one of them gone (pruned), it warms. doctor opens no other
    marker of the state folder (before, it read every ``passed-*.json``: 100,000 of them added
    15 s). Guards: runner.planned_skip's entries check (_all_present), and its one marker."""
    plus = validated[1]
    assert planned_skip(root, plus).startswith("the last validation of the same workloads and shapes")
    marker = json.loads(plan_marker(root).read_text())
    (passed,) = (root / "state").glob("passed-*.json")
    for number in range(20):  # other plans' markers, as a long-lived root holds
        other = passed.with_name(f"passed-{number:024x}.json")
        other.write_text(json.dumps({**marker, "plan": f"{number:024x}"}))
    if shutil.which("strace"):
        log = root.parent / "strace.log"
        doctor = ("doctor", "--json", "--no-fail", "--config", str(plus), "--cache-root", str(root))
        traced = subprocess.run(["strace", "-f", "-e", "trace=openat,open", "-o", str(log), sys.executable,
                                 "-m", "gpu_cache", *doctor], env=clean_environ(), capture_output=True,
                                text=True)
        assert traced.returncode == 0, traced.stderr[-3000:]
        opened = {Path(line.split('"')[1]).name for line in log.read_text().splitlines()
                  if f"{root}/state/" in line and ".json" in line}
        assert opened == {plan_marker(root).name}, opened
    kind, keys = next(iter(marker["keys"].items()))
    for path in [p for p in (root / kind).iterdir() if p.name.startswith(keys[0])]:
        path.unlink()  # the entry a prune took
    assert planned_skip(root, plus) is None


def test_another_image_is_another_plan(validated, root, tmp_path):
    """The same type, workloads and shapes in another container image: the warm job is planned
    to warm (the verdict was another image's). Guard: the image in runner.plan_key."""
    assert planned_skip(root, validated[1]) is not None
    other = config(validated[1].parent, gpu_types={"cpu": {"container": "docker://example.org/other:2"}})
    assert planned_skip(root, other) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_prune_bounds_the_markers_by_age(validated, root):
    """Markers of passed validations: one unused for 40 days, one dated a year ahead and one
    another account wrote go with ``prune --max-age 30d``; the plan's own, written now, and one
    of a week ago stay, and the warm job is still planned to run nothing. Before, none was ever
    pruned. Guard: prune.prune_markers."""
    state = root / "state"
    (passed,) = state.glob("passed-*.json")
    made = {}
    for name, days in (("old", -40), ("ahead", 365), ("theirs", 0), ("week", -7)):
        made[name] = state / f"passed-{name}.json"
        shutil.copy(passed, made[name])
        os.utime(made[name], (time.time() + days * DAY,) * 2)
    os.chown(made["theirs"], pwd.getpwnam("nobody").pw_uid, -1)
    done = run_cli("prune", "--json", "--max-age", "30d", "--cache-root", str(root))
    assert done.returncode == 0, done.stderr[-3000:]
    markers = json.loads(done.stdout)["markers"]
    reasons = {r["key"]: r["reason"] for r in markers["removed"]}
    assert sorted(reasons) == sorted(made[n].name for n in ("old", "ahead", "theirs")), reasons
    assert reasons[made["old"].name].startswith("unused longer than max_age")
    assert markers["entries_before"] == 6 and markers["entries_removed"] == 3
    assert sorted(p.name for p in state.glob("p*-*.json")) == sorted(
        [passed.name, plan_marker(root).name, made["week"].name])
    assert planned_skip(root, validated[1]) is not None
