"""The built-in ``alphafold3`` warm workload (issue 24), with a stand-in ``run_alphafold.py``
(tests/fixtures) that checks its command line and input as AlphaFold 3 reads them and compiles a
small real JAX program per bucket: warm, then validate with zero misses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.config.settings import settings_from
from gpu_cache.config.workloads import resolve_workload
from gpu_cache.workloads import alphafold3
from helpers import REPO, clean_environ, read_json, run_cli, write_config

STAND_IN = REPO / "tests" / "fixtures" / "run_alphafold.py"


def config(tmp_path: Path, **entry: object) -> dict:
    weights = tmp_path / "weights"
    weights.mkdir(exist_ok=True)
    workload = {"model_dir": str(weights), "script": str(STAND_IN), "shapes": [16, 32]} | entry
    return {"default_workloads": ["alphafold3"], "workloads": {"alphafold3": workload},
            "validate": {"measure_cold": False}}


def seen(tmp_path: Path) -> list[dict]:
    lines = (tmp_path / "weights" / "seen.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda s: s["tokens"])


@pytest.mark.slow
def test_warm_compiles_each_bucket_as_inference_and_validate_passes(tmp_path):
    path = write_config(tmp_path / "c.yaml", config(
        tmp_path, args=["--num_diffusion_samples=5", "--flash_attention_implementation=xla"]))
    root = tmp_path / "root"
    warm = run_cli("warm", "--config", str(path), "--cache-root", str(root),
                   "--output", str(tmp_path / "warm.json"), "--log", str(tmp_path / "log"))
    assert warm.returncode == 0, warm.stderr + (tmp_path / "log").read_text()
    assert read_json(tmp_path / "warm.json")["new_entries"]["jax"] > 0
    extra = {"num_diffusion_samples": "5", "flash_attention_implementation": "xla"}
    assert seen(tmp_path) == [{"tokens": 16, "bucket": 16, "buckets": [16, 32], "extra": extra},
                              {"tokens": 32, "bucket": 32, "buckets": [16, 32], "extra": extra}]
    validate = run_cli("validate", "--config", str(path), "--cache-root", str(root),
                       "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "log"))
    verdict = read_json(tmp_path / "v.json")
    assert validate.returncode == 0 and verdict["passed"], verdict["problems"]
    assert verdict["misses"] == 0 and verdict["jax"]["hits"] > 0


def test_the_input_is_one_poly_glycine_chain_without_msa(tmp_path):
    fold = alphafold3.fold_input(5)
    assert fold["sequences"] == [{"protein": {"id": "A", "sequence": "GGGGG", "unpairedMsa": "",
                                              "pairedMsa": "", "templates": []}}]
    assert (fold["dialect"], fold["version"], fold["modelSeeds"]) == ("alphafold3", 1, [1])


def test_the_command_is_built_from_the_config(tmp_path):
    settings = settings_from(config(tmp_path, args=["--num_seeds=1"]))
    workload = resolve_workload(settings, "alphafold3")
    assert workload.builtin and workload.expects == ("jax",) and workload.shapes == (16, 32)
    ((shape, line), _) = workload.commands("python3", "cpu")
    assert shape == 16 and line == (
        f"python3 -m gpu_cache.workloads.alphafold3 --shape 16 --buckets 16,32 --model-dir "
        f"{tmp_path / 'weights'} --script {STAND_IN} -- --num_seeds=1")


def test_without_a_weights_folder_no_weights_are_passed_and_the_verdict_will_say_so(tmp_path):
    settings = settings_from({"default_workloads": ["alphafold3"]})
    workload = resolve_workload(settings, "alphafold3")
    ((_shape, line), *_rest) = workload.commands("python3", "cpu")
    assert line == "python3 -m gpu_cache.workloads.alphafold3 --shape 256 --buckets 256,512,768,1024"
    assert workload.note.startswith("alphafold3: no weights were used")
    assert resolve_workload(settings_from(config(tmp_path)), "alphafold3").note is None


def test_an_image_whose_alphafold3_cannot_make_weights_exits_2_with_one_line(tmp_path):
    """Here (Python 3.11) there is no AlphaFold 3 and no haiku: the workload says so in one line,
    names the way out, and leaves no folder behind."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-m", "gpu_cache.workloads.alphafold3", "--shape", "16",
                           "--buckets", "16", "--script", str(STAND_IN)], capture_output=True, text=True,
                          env=clean_environ(TMPDIR=str(scratch)), timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("alphafold3:")]
    assert "cannot import" in line and "set the workload's model_dir:" in line
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("args, needle", [
    (["--shape", "64", "--buckets", "16,32"], "--shape 64 is not one of --buckets"),
    (["--shape", "16", "--buckets", "32,16"], "strictly increasing"),
    (["--shape", "16", "--buckets", "16", "--script", "/nonexistent"], "no run_alphafold.py"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, needle):
    (tmp_path / "weights").mkdir()
    with pytest.raises(SystemExit) as stop:
        alphafold3.main([*args, "--model-dir", str(tmp_path / "weights"),
                         *([] if "--script" in args else ["--script", str(STAND_IN)])])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert needle in line
