"""The CLI with real JAX: warm, validate (pass and fail), bad input, unusable roots."""

import json
import os
from pathlib import Path

import pytest

from helpers import SMALL, clean_environ, read_json, run_cli, write_config

# A program that bakes a fresh random constant into what it compiles: its key changes every run.
RANDOM_CONSTANT = (
    "{python} -c \"import jax, jax.numpy as jnp, numpy as np; "
    "c = float(np.random.default_rng().random()); "
    "f = jax.jit(lambda x: jnp.tanh(x) * c, ); print(f(jnp.arange(4.0)))\""
)


@pytest.mark.slow
def test_warm_then_validate_passes_with_zero_misses(cache_root, tmp_path):
    config = write_config(tmp_path / "c.yaml", SMALL)
    warm = run_cli("warm", "--config", str(config), "--cache-root", str(cache_root),
                   "--output", str(tmp_path / "warm.json"), "--log", str(tmp_path / "log"))
    assert warm.returncode == 0, warm.stderr
    assert read_json(tmp_path / "warm.json")["new_entries"]["jax"] > 0
    validate = run_cli("validate", "--config", str(config), "--cache-root", str(cache_root),
                       "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    assert validate.returncode == 0, validate.stderr
    verdict = read_json(tmp_path / "v.json")
    for field in ("gpu_type", "device", "passed", "hits", "misses", "new_entries", "cold_seconds",
                  "warm_seconds", "problems", "jax", "triton"):
        assert field in verdict
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["misses"] == 0 and verdict["new_entries"] == 0 and verdict["jax"]["hits"] > 0
    assert verdict["gpu_type"] == "cpu" and verdict["device"]["name"] == "cpu"
    assert verdict["cold_seconds"] > 0 and verdict["warm_seconds"] > 0  # measured (compared in benchmarks)
    assert "1/1: jax-transformer shape=16" in validate.stderr  # progress is shown


@pytest.mark.slow
def test_a_key_that_changes_every_run_fails_validation_and_is_named(cache_root, tmp_path):
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"random": {"command": RANDOM_CONSTANT}},
        "default_workloads": ["random"], "validate": {"measure_cold": False},
    })
    common = ("--config", str(config), "--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    result = run_cli("validate", *common, "--output", str(tmp_path / "v.json"))
    assert result.returncode == 0  # not strict: the pipeline goes on
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is False
    assert verdict["jax"]["misses"] >= 1 and verdict["new_entries"] >= 1
    assert any(m["name"] == "jit__lambda" for m in verdict["missed"])
    assert any("jit__lambda" in p for p in verdict["problems"])
    # ... and explained: the program's IR (the baked-in constant) is the key part that changed.
    assert any(e["name"] == "jit__lambda" and e["changed"] == ["computation"] for e in verdict["explain"])
    assert any("jit__lambda missed: computation: the program itself" in p for p in verdict["problems"])
    assert "validation of cpu failed" in result.stderr


@pytest.mark.slow
def test_strict_validation_fails_the_command(cache_root, tmp_path):
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"random": {"command": RANDOM_CONSTANT}}, "default_workloads": ["random"],
        "validate": {"measure_cold": False, "strict": True},
    })
    result = run_cli("validate", "--config", str(config), "--cache-root", str(cache_root),
                     "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    assert result.returncode == 1
    assert read_json(tmp_path / "v.json")["passed"] is False


@pytest.mark.slow
def test_a_process_without_the_hook_that_compiles_fails_validation(cache_root, tmp_path):
    """(#19) One workload runs with the stats hook and hits; the other runs without it
    (``GPU_CACHE_RECORDS`` unset: the hook records nothing, as in a process that dropped
    PYTHONPATH) and compiles a new entry in every run. The hook counts no miss, so only the
    new entry shows it: the verdict must fail and name it."""
    steady = "{python} -c \"import jax, jax.numpy as jnp; print(jax.jit(jnp.sin)(jnp.arange(4.0)))\""
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"hooked": {"command": steady},
                      "bare": {"command": "env -u GPU_CACHE_RECORDS " + RANDOM_CONSTANT}},
        "default_workloads": ["hooked", "bare"], "validate": {"measure_cold": False},
    })
    common = ("--config", str(config), "--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    result = run_cli("validate", *common, "--output", str(tmp_path / "v.json"))
    assert result.returncode == 0, result.stderr
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is False, verdict
    assert verdict["jax"]["hits"] >= 1, "the hooked process was observed, and hit"
    assert verdict["jax"]["new_entries"] == 1 and verdict["jax"]["misses"] == 1
    assert any(p.startswith("jax: 1 compilation(s) missed") and "jit__lambda" in p
               for p in verdict["problems"]), verdict["problems"]


@pytest.mark.slow
def test_a_user_workload_runs_once_per_shape_with_the_cache_environment(cache_root, tmp_path):
    seen = tmp_path / "seen"
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"mine": {"command": f"echo {{shape}} $JAX_COMPILATION_CACHE_DIR >> '{seen}'",
                               "shapes": [256, "a b"]}},
        "default_workloads": ["mine"],
    })
    result = run_cli("warm", "--config", str(config), "--cache-root", str(cache_root),
                     "--output", str(tmp_path / "w.json"))
    assert result.returncode == 0, result.stderr
    # Each shape once (warm runs them side by side: in any order).
    assert sorted(seen.read_text().splitlines()) == [f"256 {cache_root}/jax", f"a b {cache_root}/jax"]


@pytest.mark.slow
def test_an_unusable_root_degrades_to_no_cache_and_says_why(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = write_config(tmp_path / "c.yaml", SMALL | {"validate": {"measure_cold": False}})
    result = run_cli("validate", "--config", str(config), "--cache-root", str(blocker / "cache"),
                     "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    assert result.returncode == 0, result.stderr
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is False
    assert any("cannot create" in p and "without its persistent cache" in p for p in verdict["problems"])
    assert verdict["runs"][0]["returncode"] == 0  # the workload itself ran fine
    assert result.stderr.count("gpu-cache: warning: jax:") == 1


@pytest.mark.parametrize("args,message", [
    (["prune", "--max-size", "10X"], "--max-size"),
    ([], "no command given"),
    (["frobnicate"], "invalid choice"),
    (["warm", "--gpu-type", "cpu", "--config-json", '{"colour": 1}'], "colour"),
    (["warm", "--gpu-type", "cpu", "--config-json", '{"default_workloads": ["nope"]}'],
     "unknown workload 'nope'"),
    (["warm", "--config", "/does/not/exist.yaml"], "cannot read config file"),
    (["prune", "--max-age", "forever"], "--max-age"),
    (["warm", "--gpu-type", "h100"], "unknown GPU type 'h100'"),
])
def test_bad_input_gets_one_line_and_exit_2(args, message, cache_root):
    result = run_cli(*args, "--cache-root", str(cache_root)) if args else run_cli()
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-cache: error:"), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_bad_template_placeholder_is_a_usage_error(cache_root, tmp_path):
    config = json.dumps({"workloads": {"mine": {"command": "run {tokens}", "shapes": [1]}},
                         "default_workloads": ["mine"]})
    result = run_cli("warm", "--config-json", config, "--cache-root", str(cache_root))
    assert result.returncode == 2 and "{shape}" in result.stderr


@pytest.mark.slow
def test_stats_and_doctor_report_the_cache(cache_root, tmp_path):
    config = write_config(tmp_path / "c.yaml", SMALL)
    assert run_cli("warm", "--config", str(config), "--cache-root", str(cache_root),
                   "--output", str(tmp_path / "w.json"), "--log", str(tmp_path / "log")).returncode == 0
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(cache_root)).stdout)
    assert stats["kinds"]["jax"]["entries"] > 0 and stats["kinds"]["jax"]["bytes"] > 0
    assert stats["usage"]["by_rule"]["warm_cache"]["processes"] >= 1
    text = run_cli("stats", "--cache-root", str(cache_root)).stdout
    assert "jax:" in text and "entries" in text
    doctor = run_cli("doctor", "--cache-root", str(cache_root))
    assert doctor.returncode == 0 and "result: ok" in doctor.stdout


def test_doctor_fails_on_an_unusable_root(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("doctor", "--cache-root", str(blocker))
    assert result.returncode == 1 and "PROBLEM" in result.stdout
    assert run_cli("doctor", "--cache-root", str(blocker), "--no-fail").returncode == 0


def test_doctor_fails_on_a_root_no_folder_can_be_made_in_and_creates_nothing():
    """A root under /proc (a filesystem of no size): doctor, which creates nothing, says that it
    cannot be made, not that it is merely missing."""
    result = run_cli("doctor", "--cache-root", "/proc/nope/gpu-cache")
    assert result.returncode == 1, result.stdout
    assert ("jax: PROBLEM: cannot create /proc/nope/gpu-cache: /proc is on proc, a filesystem "
            "that holds no files; choose another cache root") in result.stdout
    assert result.stdout.rstrip().endswith("result: some caches cannot be used (jobs still run)")


def disk_state(top: Path) -> dict[str, tuple[int, int]]:
    """Every name under ``top`` (links not followed) with its mtime and ctime: making and
    removing a probe file in a folder moves both of the folder's."""
    return {str(p): (p.lstat().st_mtime_ns, p.lstat().st_ctime_ns) for p in [top, *top.rglob("*")]}


def test_doctor_without_fix_changes_nothing_on_disk(tmp_path):
    missing = tmp_path / "new root"
    doctor = run_cli("doctor", "--cache-root", str(missing))
    assert doctor.returncode == 0 and not missing.exists()
    assert "jax: missing (`gpu-cache env` or `doctor --fix` would create it) " in doctor.stdout
    root, outside = tmp_path / "root", tmp_path / "outside"
    assert run_cli("env", "--cache-root", str(root)).returncode == 0
    outside.mkdir()
    os.rmdir(root / "records")
    (root / "records").symlink_to(outside, target_is_directory=True)
    (root / "jax").rmdir()  # one kind's folder missing: named, not made
    before = disk_state(tmp_path)
    doctor = run_cli("doctor", "--cache-root", str(root))
    assert doctor.returncode == 0 and "result: ok" in doctor.stdout
    assert disk_state(tmp_path) == before
    assert "jax: missing" in doctor.stdout and "triton: ok" in doctor.stdout
    # With --fix (it makes what is missing) and in env, nothing behind the link is written.
    for command in (("doctor", "--fix"), ("env",)):
        assert run_cli(*command, "--cache-root", str(root)).returncode == 0
        assert disk_state(outside) == {k: v for k, v in before.items() if k == str(outside)}
    assert (root / "jax").is_dir()


def test_doctor_shows_the_gpus_compute_capability_and_driver_each_as_itself(tmp_path):
    """nvidia-smi answers the columns gpu-cache asks for in that order (index, uuid, compute_cap,
    driver_version, name): the compute capability and the driver, which make a verdict's device
    (core.device.identity), are each read from its own column."""
    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "0, GPU-0123, 9.0, 550.54.15, NVIDIA H200"\n')
    smi.chmod(0o755)
    environ = clean_environ(PATH=f"{folder}{os.pathsep}{os.environ['PATH']}")
    environ.pop("CUDA_VISIBLE_DEVICES", None)
    args = ("doctor", "--no-fail", "--cache-root", str(tmp_path / "c"))
    device = json.loads(run_cli(*args, "--json", env=environ).stdout)["device"]
    assert device == {"name": "NVIDIA H200", "gpu_type": "h200", "count": 1, "visible_devices": None,
                      "compute_capability": "9.0", "driver": "550.54.15"}
    text = run_cli(*args, env=environ).stdout.splitlines()
    assert "   device: 1 x NVIDIA H200 (gpu_type h200, compute capability 9.0, driver 550.54.15)" in text


def test_warm_asks_nvidia_smi_once_before_its_workload_starts(cache_root, tmp_path):
    """With no ``gpu_types`` configured, the GPU type is this machine's: ``warm`` looks the GPU
    up once, not at each use of the table (the type's name, the plan, the runner's device; an
    ``nvidia-smi`` start costs about 50 ms, more on a busy node). A fake ``nvidia-smi`` first on
    PATH logs its calls; the workload copies the log when it starts. Guard: device.detect's one
    look per process and visible set (without it: 6 calls)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    log, seen = tmp_path / "smi.log", tmp_path / "seen.log"
    smi = folder / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$*" >> {log}\necho "0, GPU-0123, 9.0, 550.54.15, NVIDIA H200"\n')
    smi.chmod(0o755)
    config = write_config(tmp_path / "c.yaml", {"workloads": {"probe": {"command": f"cp {log} {seen}"}},
                                                "default_workloads": ["probe"]})
    done = run_cli("warm", "--config", str(config), "--cache-root", str(cache_root),
                   "--output", str(tmp_path / "w.json"), "--log", str(tmp_path / "log"),
                   env=clean_environ(PATH=f"{folder}{os.pathsep}{os.environ['PATH']}"))
    assert done.returncode == 0, done.stderr
    assert read_json(tmp_path / "w.json")["gpu_type"] == "h200"
    assert seen.read_text().splitlines() == ["--query-gpu=index,uuid,compute_cap,driver_version,name "
                                             "--format=csv,noheader"]
