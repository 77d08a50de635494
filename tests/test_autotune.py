"""Autotuning results kept per GPU type (issue 24): the ``autotune`` kind.

Real tokamax 0.0.12 and real JAX on CPU. tokamax's GPU kernels cannot be timed on CPU, so the
warm process tunes through tokamax's own API (``BoundArguments.autotune``) with an autotuner
whose timings are fixed (the one part that stands in for the GPU); everything else (saving,
tokamax's ``AutotuningResult`` dump and load, its per-op cache, its miss log) is tokamax's own.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpu_cache.commands.stats import cache_stats
from gpu_cache.commands.validate import kind_problems as autotuning_problems
from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds
from gpu_cache.core.kinds import autotune_format as autotune_cache
from gpu_cache.core.kinds import triton_format as triton_cache
from gpu_cache.core.reports import PhaseResult
from gpu_cache.jobenv import env
from hook_jobs import JOB_PROGRAM, WARM_PROGRAM, gpu_cache_env, real_tokamax, records_of, run, tuning_of


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A root whose autotune folder holds what a warm process tuned, and the fastest config:
    tuned once for the module (do not change it)."""
    real_tokamax()
    root = tmp_path_factory.mktemp("tuned") / "root"
    best, _ = run(WARM_PROGRAM, gpu_cache_env(root, GPU_CACHE_AUTOTUNE_SAVE="1"))
    return root, best


@pytest.fixture
def warmed(tuned: tuple[Path, str], tmp_path: Path) -> tuple[Path, str]:
    """A copy of the tuned root for the test to change (its files' modes and times kept), and
    the fastest config."""
    root = tmp_path / "root"
    shutil.copytree(tuned[0], root, symlinks=True)
    return root, tuned[1]


@pytest.mark.slow
def test_a_result_saved_by_warm_serves_every_thread_of_a_job_with_one_compile(warmed):
    root, best = warmed
    saved = root / "autotune" / "tokamax-0.0.12_jax-0.10.2" / "cpu.json"
    wrapper = json.loads(saved.read_text())
    assert (wrapper["format"], wrapper["tokamax"], wrapper["jax"], wrapper["device_kind"]) == \
        (1, "0.0.12", "0.10.2", "cpu")
    assert tuning_of(root)["save"] == "saved 1 config set(s) for cpu"

    out, stderr = run(JOB_PROGRAM, gpu_cache_env(root))
    assert json.loads(out) == {"traces": 1, "compiled": 1, "main": best, "other": best}
    assert "Autotuning cache miss" not in stderr
    tuning = tuning_of(root)
    assert (tuning["loaded"], tuning["entries"], tuning["misses"], tuning["refused"]) == \
        (["cpu.json"], 1, 0, [])
    (entry,) = kinds.named("autotune").scan(root / "autotune")
    assert (entry.key, entry.name, entry.problem) == ("tokamax-0.0.12_jax-0.10.2/cpu.json", "cpu", None)


@pytest.mark.slow
def test_a_second_warm_process_merges_into_the_result(warmed):
    root, _ = warmed
    other = WARM_PROGRAM.replace("jnp.ones((8, 16))", "jnp.ones((4, 16))")
    run(other, gpu_cache_env(root, GPU_CACHE_AUTOTUNE_SAVE="1"))
    assert tuning_of(root)["save"] == "saved 2 config set(s) for cpu"
    run(JOB_PROGRAM, gpu_cache_env(root))
    assert tuning_of(root)["entries"] == 2


@pytest.mark.slow
def test_a_job_on_a_cold_root_counts_its_misses_and_validation_fails(tmp_path):
    real_tokamax()
    root = tmp_path / "root"
    out, stderr = run(JOB_PROGRAM, gpu_cache_env(root))
    assert json.loads(out) == {"traces": 1, "compiled": 1, "main": None, "other": None}
    assert stderr.count("Autotuning cache miss") == 2  # tokamax's log is left as it was
    tuning = tuning_of(root)
    assert tuning["misses"] == 2 and tuning["missed"][0]["name"] == "PallasTritonGatedLinearUnit"
    phase = PhaseResult("validate", "cpu", "run", recorded=kinds.record_totals(records_of(root)))
    (problem,) = autotuning_problems(phase)
    assert problem.startswith("autotune: 2 tokamax autotuning lookup(s) missed in a fresh process")
    assert "PallasTritonGatedLinearUnit" in problem
    # Stored and read back, as the workflow passes a pass on.
    again = PhaseResult.from_dict(json.loads(json.dumps(phase.as_dict())))
    assert autotuning_problems(again) == [problem]


@pytest.mark.slow
def test_the_warm_root_passes_the_autotuning_check(warmed):
    root, _ = warmed
    for record in (root / "records").glob("*.json"):
        record.unlink()
    run(JOB_PROGRAM, gpu_cache_env(root))
    phase = PhaseResult("validate", "cpu", "run", recorded=kinds.record_totals(records_of(root)))
    assert phase.recorded["autotune"].hits == 1 and autotuning_problems(phase) == []


@pytest.mark.slow
@pytest.mark.parametrize("made_with", ["another tokamax", "another tokamax, parsable", "another folder",
                                       "unparsable"])
def test_a_result_of_other_versions_is_refused_by_gpu_caches_own_key(warmed, made_with):
    root, _ = warmed
    saved = root / "autotune" / "tokamax-0.0.12_jax-0.10.2" / "cpu.json"
    wrapper = json.loads(saved.read_text())
    if made_with == "another tokamax":
        # A 0.0.11 result (its fields differ: tokamax's own parser would fail in pydantic).
        wrapper["tokamax"], wrapper["result"] = "0.0.11", '{"device_kind": "cpu", "data": [[{}, {}]]}'
        saved.write_text(json.dumps(wrapper))
        expected = ["cpu.json: made with tokamax 0.0.11 and jax 0.10.2, not 0.0.12 and 0.10.2"]
    elif made_with == "another tokamax, parsable":
        # One that this tokamax's parser takes: only gpu-cache's own key tells it apart.
        wrapper["tokamax"] = "0.0.11"
        saved.write_text(json.dumps(wrapper))
        expected = ["cpu.json: made with tokamax 0.0.11 and jax 0.10.2, not 0.0.12 and 0.10.2"]
    elif made_with == "another folder":
        saved.parent.rename(saved.parent.with_name("tokamax-0.0.17_jax-0.11.2"))
        expected = ["no result for tokamax 0.0.12 with jax 0.10.2; results for: "
                    "tokamax-0.0.17_jax-0.11.2"]
    else:
        wrapper["result"] = '{"device_kind": "cpu", "data": [[{"op": 1}, {}]]}'
        saved.write_text(json.dumps(wrapper))
        expected = None
    out, stderr = run(JOB_PROGRAM, gpu_cache_env(root))
    assert json.loads(out)["main"] is None and "Traceback" not in stderr
    tuning = tuning_of(root)
    assert tuning["loaded"] == [] and tuning["misses"] == 2
    if expected is None:  # tokamax's own parser refused it: the job runs as without it
        (refused,) = tuning["refused"]
        assert refused == "cpu.json: ValidationError: 4 validation errors for AutotuningResult"
    else:
        assert tuning["refused"] == expected


@pytest.mark.slow
def test_under_umask_000_a_warm_saves_results_nobody_else_can_rewrite(tmp_path):
    real_tokamax()
    base = Path(tempfile.mkdtemp(prefix="gpu-cache-autotune-"))  # pytest's folders are root's alone
    base.chmod(0o755)
    root = base / "root"
    best, _ = run(WARM_PROGRAM, gpu_cache_env(root, GPU_CACHE_AUTOTUNE_SAVE="1"), umask=0)
    for folder in (root, root / "autotune"):
        folder.chmod(0o755)  # what a user may well have: others may look, not write
    version = root / "autotune" / "tokamax-0.0.12_jax-0.10.2"
    saved = version / "cpu.json"
    assert stat.S_IMODE(version.stat().st_mode) == 0o700 and stat.S_IMODE(saved.stat().st_mode) == 0o644
    rewrite = f"open({str(saved)!r}, 'a').write(' ')"
    refused = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", rewrite],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    out, _ = run(JOB_PROGRAM, gpu_cache_env(root))
    assert json.loads(out)["main"] == best
    shutil.rmtree(base)


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["a folder others may write", "a result of another user's"])
def test_a_result_another_user_could_have_written_is_never_loaded(warmed, planted):
    root, _ = warmed
    version = root / "autotune" / "tokamax-0.0.12_jax-0.10.2"
    if planted == "a folder others may write":  # as the hook made it under umask 000 before
        version.chmod(0o777)
        expected = f"{version} is writable by everyone"
    else:
        os.chown(version / "cpu.json", pwd.getpwnam("nobody").pw_uid, -1)
        expected = "cpu.json: ValueError: owned by uid"
    out, _ = run(JOB_PROGRAM, gpu_cache_env(root))
    assert json.loads(out)["main"] is None
    tuning = tuning_of(root)
    assert tuning["loaded"] == [] and len(tuning["refused"]) == 1
    assert tuning["refused"][0].startswith(expected), tuning["refused"]


def test_the_inventory_prune_and_stats_cover_results(tmp_path):
    folder = tmp_path / "root" / "autotune"
    pair = folder / autotune_cache.version_folder("0.0.12", "0.10.2")
    pair.mkdir(parents=True)
    good = {"format": 1, "tokamax": "0.0.12", "jax": "0.10.2", "device_kind": "NVIDIA H200",
            "result": "{}"}
    (pair / "NVIDIA_H200.json").write_text(json.dumps(good))
    (pair / "NVIDIA_A100.json").write_text(json.dumps(good))  # named for another device
    (pair / "junk.json").write_text("[1, 2")
    os.symlink("/etc/passwd", pair / "link.json")
    (pair / ".NVIDIA_H200.json.9.tmp").write_text("{")
    os.utime(pair / ".NVIDIA_H200.json.9.tmp", (1, 1))
    found = {e.key.split("/")[1]: (e.name, e.problem) for e in kinds.named("autotune").scan(folder)}
    assert found == {
        "NVIDIA_H200.json": ("NVIDIA H200", None),
        "NVIDIA_A100.json": ("?", "its device kind does not match its file name"),
        "junk.json": ("?", "unreadable result (JSONDecodeError)"),
        "link.json": ("?", "a symbolic link where an entry should be (never followed nor opened)"),
        ".NVIDIA_H200.json.9.tmp": ("?", "half-written result of a killed warm process"),
    }
    stats = cache_stats(settings_from({}, cache_root=str(tmp_path / "root")))
    assert stats["kinds"]["autotune"]["entries"] == 5
    for entry in kinds.named("autotune").scan(folder):
        kinds.named("autotune").remove(folder, entry)
    assert not pair.exists() and Path("/etc/passwd").exists()


def test_env_exports_the_folder_and_triton_autotuning(tmp_path):
    root = tmp_path / "root"
    exports = env.resolve(settings_from({}, cache_root=str(root)), {})
    assert exports.values["GPU_CACHE_AUTOTUNE"] == str(root / "autotune")
    assert exports.values["TRITON_CACHE_AUTOTUNING"] == "1"


def test_an_autotune_folder_others_may_write_is_not_used(tmp_path):
    root = tmp_path / "root"
    (root / "autotune").mkdir(parents=True)
    (root / "autotune").chmod(0o777)
    exports = env.resolve(settings_from({}, cache_root=str(root)), {})
    assert "autotune" in exports.problems or "autotune" in exports.adjusted
    assert exports.values.get("GPU_CACHE_AUTOTUNE") != str(root / "autotune")


def test_triton_autotuning_results_are_counted(tmp_path):
    folder = tmp_path / "triton"
    key = folder / ("A" * 52)
    key.mkdir(parents=True)
    (key / "matmul_kernel.autotune.json").write_text('{"key": [], "configs_timings": []}')
    inventory = triton_cache.scan(folder)
    assert inventory.autotune_results == 1
    stats = cache_stats(settings_from({}, cache_root=str(tmp_path)))
    assert stats["kinds"]["triton"]["autotune_results"] == 1


def test_only_the_warm_pass_saves_what_tokamax_tunes():
    from gpu_cache.config.workloads import plan_phase

    settings = settings_from({})
    assert plan_phase(settings, "cpu", "warm").environ["GPU_CACHE_AUTOTUNE_SAVE"] == "1"
    for phase in ("validate", "cold"):
        assert "GPU_CACHE_AUTOTUNE_SAVE" not in plan_phase(settings, "cpu", phase).environ
