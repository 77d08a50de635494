"""Warm and validate torch.compile jobs (issue 31) with the built-in ``torch-compile``
workload, real Inductor compiles on the CPU: a warmed cache validates with zero graph misses,
and a job whose Inductor config differs fails validation, named with the key part that
changed and its values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import clean_environ, read_json, run_cli, write_config

pytest.importorskip("torch")

#: The built-in workload, small: one block, one sequence length (a forward and a backward graph).
SMALL_TORCH = {
    "workloads": {"torch-compile": {"shapes": [16], "args": ["--blocks", "1", "--d-model", "32",
                                                             "--heads", "2"]}},
    "default_workloads": ["torch-compile"], "validate": {"measure_cold": False},
}


@pytest.mark.slow
def test_warm_then_validate_counts_inductor_graphs_and_names_a_changed_config_value(tmp_path):
    root = tmp_path / "root"  # no space: Inductor's C++ builds fail on such a path
    config = write_config(tmp_path / "c.yaml", SMALL_TORCH)
    common = ("--config", str(config), "--cache-root", str(root), "--log", str(tmp_path / "log"))
    warm = run_cli("warm", *common, "--output", str(tmp_path / "warm.json"))
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert read_json(tmp_path / "warm.json")["new_entries"]["inductor"] > 0

    validate = run_cli("validate", *common, "--output", str(tmp_path / "v.json"))
    assert validate.returncode == 0, validate.stderr[-3000:]
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["inductor"]["hits"] == 2 and verdict["inductor"]["misses"] == 0
    assert verdict["inductor"]["new_entries"] == 0

    # A job whose Inductor config differs (size asserts off) misses both graphs.
    changed = run_cli("validate", *common, "--output", str(tmp_path / "v2.json"),
                      env=clean_environ(TORCHINDUCTOR_SIZE_ASSERTS="0"))
    assert changed.returncode == 0, changed.stderr[-3000:]
    verdict = read_json(tmp_path / "v2.json")
    assert verdict["passed"] is False
    assert verdict["inductor"]["misses"] == 2
    assert {m["name"] for m in verdict["missed"] if m["kind"] == "inductor"} == {
        "forward graph 0/0", "backward graph 0/0"}
    explained = [e for e in verdict["explain"] if e["kind"] == "inductor"]
    assert len(explained) == 2
    assert all(e["changed"] == ["inductor_config[size_asserts]"] for e in explained), explained
    assert any("inductor: forward graph 0/0 missed: inductor_config[size_asserts] changed from "
               "True to False" in p for p in verdict["problems"]), verdict["problems"]


@pytest.mark.slow
def test_inductors_graphs_carried_in_a_pack_hit_at_another_path(tmp_path):
    """Pack Inductor's entries of a warmed root, unpack them into a root at another path: a
    fresh process there loads both graphs and compiles nothing."""
    import json

    from inductor_jobs import WORKLOAD, job_env

    source, target = tmp_path / "warmed", tmp_path / "elsewhere" / "root"
    command = [sys.executable, "-m", "gpu_cache.workloads.torch_compile", *WORKLOAD]
    first = subprocess.run(command, env=job_env(source), capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    archive = str(tmp_path / "torch.tar.gz")
    packed = run_cli("pack", archive, "--cache-root", str(source), "--kind", "inductor")
    assert packed.returncode == 0, packed.stderr
    unpacked = run_cli("unpack", archive, "--cache-root", str(target), "--json")
    assert unpacked.returncode == 0, unpacked.stderr
    assert json.loads(unpacked.stdout)["written"]["inductor"] > 0
    again = subprocess.run(command, env=job_env(target), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    (record,) = [json.loads(p.read_text())["inductor"] for p in (target / "records").glob("*.json")]
    assert (record["fxgraph"]["hits"], record["fxgraph"]["misses"]) == (2, 0)
    assert record["aotautograd"]["hits"] == 1
