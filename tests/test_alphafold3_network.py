"""The real AlphaFold 3 network under gpu-cache (issue 39), on this CPU: ColabFold's wheel of
AlphaFold 3's model code (.ci/install-af3.sh), driven through the ``alphafold3`` workload with no
weights given: the image's AlphaFold 3 writes random parameters of the shapes it expects, runs on
them, and they are deleted. Warm compiles and keeps its coordinates and confidences as the
outputs proof's reference; validate, a fresh process on the same random weights, hits every
program and reproduces them bit for bit. The fork's ``preinit_tokamax_context()`` is left out
in both (tokamax 0.0.17 makes its JAX user context at import: one trace, one executable in two
calls without it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from af3_env import CUDA_PLUGIN, REDUCED, RUN_ALPHAFOLD, needs_af3
from gpu_cache.config.settings import settings_from
from gpu_cache.jobenv import env
from helpers import SCRIPTS, clean_environ, read_json, records, run_cli, write_config


def lines_of(log: Path, key: str) -> list[dict]:
    """The JSON lines of the workload's log that have ``key``."""
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("{") and f'"{key}"' in line:
            found.append(json.loads(line))
    return found


@pytest.mark.slow
def test_a_cache_warmed_without_weights_is_hit_by_every_program_of_a_run_on_other_weights(tmp_path):
    python = needs_af3()
    config = {"python": str(python), "default_workloads": ["alphafold3"],
              "workloads": {"alphafold3": {"script": str(RUN_ALPHAFOLD), "shapes": [16],
                                           "args": [*REDUCED, "--no_preinit", "--calls=2"]}},
              "validate": {"measure_cold": False}}
    path = write_config(tmp_path / "c.yaml", config)
    root, scratch = tmp_path / "root", tmp_path / "tmp"
    scratch.mkdir()
    environ = clean_environ(TMPDIR=str(scratch))
    warm = run_cli("warm", "--config", str(path), "--cache-root", str(root), "--output",
                   str(tmp_path / "warm.json"), "--log", str(tmp_path / "warm.log"), env=environ, timeout=900)
    assert warm.returncode == 0, warm.stderr + (tmp_path / "warm.log").read_text()[-3000:]
    assert read_json(tmp_path / "warm.json")["new_entries"]["jax"] > 0
    validate = run_cli("validate", "--config", str(path), "--cache-root", str(root), "--output",
                       str(tmp_path / "v.json"), "--log", str(tmp_path / "v.log"), env=environ, timeout=900)
    verdict = read_json(tmp_path / "v.json")
    assert validate.returncode == 0 and verdict["passed"], verdict["problems"]
    assert verdict["misses"] == 0 and verdict["jax"]["hits"] > 0 and verdict["new_entries"] == 0
    assert any(note.startswith("alphafold3: no weights were used") for note in verdict["notes"])
    # each run wrote random parameters of the real shapes (368M values), and they are gone; the
    # runs whose outputs the proof compares (the warm writer's, validate's) share one seed
    (written_warm,), (written_check,) = (lines_of(tmp_path / log, "seed") for log in ("warm.log", "v.log"))
    assert written_warm["arrays"] == written_check["arrays"] > 300
    assert written_warm["seed"] == written_check["seed"]
    assert list(scratch.iterdir()) == []
    # the outputs proof (issue 47): the coordinates and confidences of the warm process that
    # compiled every program, reproduced bit for bit by validate's, served those programs
    (run,) = read_json(tmp_path / "warm.json")["runs"]
    assert run["outputs"]["reference"]["kept"] is True and run["outputs"]["reference"]["entries"] > 100
    (shape,) = verdict["outputs"]["shapes"]
    assert (shape["outcome"], shape["entries"]) == ("identical", "same"), verdict["outputs"]
    kept = (root / "state").glob("outputs-*/*.npz")
    arrays = np.load(next(p for p in kept if not p.name.endswith((".again.npz", ".cold.npz"))))
    assert {"coordinates", "confidences/atom_plddts", "confidences/pae"} <= set(arrays.files), arrays.files
    assert arrays["coordinates"].shape[1] == 3 and arrays["confidences/pae"].ndim == 2
    # the network ran: one trace and one executable in two calls, the second a hit
    (cold,), (hot,) = (lines_of(tmp_path / log, "traces") for log in ("warm.log", "v.log"))
    assert (cold["traces"], cold["executables"], hot["traces"], hot["executables"]) == (1, 1, 1, 1)
    assert cold["digest"] == hot["digest"]
    jax_records = records(root, "jax")
    assert len(jax_records) == 2 and jax_records[-1]["misses"] == 0
    assert all(r["autotune"]["fix"].startswith("not needed") for r in _whole_records(root))


def _whole_records(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((root / "records").glob("*.json"))]


# --- jax-triton 0.4.x: the network's GLU kernels lowered for CUDA on this CPU ---------------------

GLU_LOWER = Path(__file__).parent / "fixtures" / "af3_glu_lower.py"


def lower_glu(python: Path, environ: dict[str, str]) -> tuple[dict, str]:
    done = subprocess.run([str(python), str(GLU_LOWER)], env=environ, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.slow
def test_a_second_process_lowers_the_networks_glu_kernels_from_the_kept_ones(tmp_path):
    """tokamax 0.0.17's Triton GLU through jax-triton 0.4.1: the first process compiles its two
    kernels, the second lowers the same modules from the kept ones without compiling."""
    python = needs_af3(plugin=True)
    root = tmp_path / "root"
    base = clean_environ(PYTHONPATH=f"{SCRIPTS}{os.pathsep}{CUDA_PLUGIN}")
    environ = env.job_environ(env.resolve(settings_from({}, cache_root=str(root)), base), base)
    first, _ = lower_glu(python, environ)
    second, stderr = lower_glu(python, environ)
    assert first["kernels"] == 2 and second["digest"] == first["digest"]
    sections = records(root, "jax_triton")
    assert [s["version"] for s in sections] == ["0.4.1", "0.4.1"] and sections[1]["state"] == "on"
    assert [(s["misses"], s["hits"]) for s in sections] == [(2, 0), (0, 2)]
    assert sections[1]["compile_seconds"] == 0.0 and sections[1]["triton_cache_dir"] is not None
    assert [line for line in stderr.splitlines() if line.startswith("gpu-cache: warning")] == []
    plain, _ = lower_glu(python, base)  # no hook, no cache: jax-triton's own lowering
    assert plain["digest"] == first["digest"]
