"""The outputs proof's comparison (issues 40 and 47): outputs the writer computed are identical,
other bits differ, a program that varies run to run passes within the writer's own noise, a
tolerance is an opt-in relative to each array, integers and NaN places are never tolerated;
numpy's files read without numpy. Real JAX compiles through the CLI for the noise, the runner's
own code (harness/settled_runs.py) for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import read_json, run_cli, write_config
from settled_runs import KEY, proof

#: A program that is not deterministic run to run, as a GPU reduction with atomics is not: each
#: process adds its own offset (from os.urandom) of at most 0.5e-6, and its second run of the
#: same compiled program lies 0.5e-6 from its first (the noise it shows in one process).
NOISY = ("import os, sys, jax, jax.numpy as jnp, numpy as np\n"
         "y = np.asarray(jax.jit(lambda x: jnp.tanh(x) * 3)(jnp.linspace(0, 1, 8)), np.float64)\n"
         "offset = int.from_bytes(os.urandom(4), 'little') / 2 ** 32\n"
         "np.save(sys.argv[1], y + 1e-6 * (0.25 + 0.5 * offset))\n"
         "np.save(sys.argv[1][:-len('.npy')] + '.again.npy', y + 1e-6 * (0.75 + 0.5 * offset))\n")


def validated(tmp_path: Path, cache_root: Path, name: str, program: str, *validations: dict,
              suffix: str = ".npy") -> list[dict]:
    """A workload of the user's, ``name``, running ``program`` (which writes its outputs file,
    ``suffix``): warmed, then validated with each of ``validations`` (a ``validate`` section) in
    turn; the verdicts."""
    (tmp_path / f"{name}.py").write_text(program)
    workload = {"command": f"{{python}} {tmp_path / name}.py {tmp_path}/out-{{shape}}{suffix}",
                "shapes": [8], "outputs": f"{tmp_path}/out-{{shape}}{suffix}"}

    def config(file: str, **extra: object) -> Path:
        settings = {"workloads": {name: workload}, "default_workloads": [name], **extra}
        return write_config(tmp_path / file, settings)

    common = ("--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    warm = run_cli("warm", "--config", str(config("c.yaml")), *common, "--output", str(tmp_path / "w.json"))
    assert warm.returncode == 0, warm.stderr[-3000:]
    verdicts = []
    for n, validate in enumerate(validations):
        path = config(f"v{n}.yaml", validate=validate)
        done = run_cli("validate", "--config", str(path), *common, "--output", str(tmp_path / f"v{n}.json"))
        assert done.returncode == 0, done.stderr[-3000:]
        verdicts.append(read_json(tmp_path / f"v{n}.json"))
    return verdicts


@pytest.mark.slow
def test_a_program_that_varies_run_to_run_passes_within_the_writers_noise_by_default(cache_root, tmp_path):
    (verdict,) = validated(tmp_path, cache_root, "noisy", NOISY, {})
    assert verdict["passed"] is True, verdict["problems"]
    (shape,) = verdict["outputs"]["shapes"]
    assert verdict["outputs"]["mode"] == "identical"
    assert shape["outcome"] == "within run-to-run noise", shape
    assert 0 < shape["max_abs"] <= shape["noise"] < 1e-6 and shape["spread"] > 0, shape  # figure, noise
    assert verdict["outputs"]["counts"]["within run-to-run noise"] == 1


#: A program whose two runs in one process agree, while each process rounds a little otherwise
#: (up to 1.5e-4 of its outputs' magnitude), as programs that are not reproducible from process
#: to process do. Its token ids are the same in every process.
ROUNDING = ("import os, sys, jax, jax.numpy as jnp, numpy as np\n"
            "y = np.asarray(jax.jit(lambda x: jnp.tanh(x) * 3)(jnp.linspace(0, 1, 8)), np.float64)\n"
            "y = y + 1e-4 * (0.5 + int.from_bytes(os.urandom(4), 'little') / 2 ** 32)\n"
            "ids = np.int64([31000, 5])\n"
            "np.savez(sys.argv[1], y=y, ids=ids)\n"
            "np.savez(sys.argv[1][:-len('.npz')] + '.again.npz', y=y, ids=ids)\n")


@pytest.mark.slow
def test_a_program_not_reproducible_from_process_to_process_fails_unless_the_tolerance_is_asked_for(
        cache_root, tmp_path):
    tolerant, exact = validated(tmp_path, cache_root, "rounding", ROUNDING, {"outputs": "tolerant"}, {},
                                suffix=".npz")
    assert tolerant["passed"] is True, tolerant["problems"]
    (shape,) = tolerant["outputs"]["shapes"]
    assert shape["outcome"] == "within tolerance" and shape["tolerance"] == 0.01, shape
    assert shape["noise"] == 0 and 0 < shape["max_rel"] < 1e-4, shape  # beyond its noise, within 0.01
    assert exact["passed"] is False
    assert any(p.startswith("outputs differ: workload rounding shape 8") and "set aside" in p
               for p in exact["problems"]), exact["problems"]

# --- the comparison itself: numpy's files read without numpy, figures a user reads ---------


def test_numpy_files_are_read_by_their_numbers_and_other_files_by_their_bytes(tmp_path):
    import numpy as np

    from gpu_cache.core import outputs

    values = {"f16": np.linspace(0, 1, 5, dtype=np.float16), "f64": np.arange(6.0).reshape(2, 3),
              "i8": np.arange(4, dtype=np.int64), "u8": np.frombuffer(b"cubin", np.uint8),
              "flag": np.array([True, False])}
    np.savez_compressed(tmp_path / "o.npz", **values)
    found = outputs.load(str(tmp_path / "o.npz"))[1]
    assert sorted(found) == sorted(values)
    for name, array in values.items():
        assert found[name].shape == array.shape and list(found[name].numbers()) == array.ravel().tolist()
    np.save(tmp_path / "one.npy", np.float32([1, np.nan, np.inf]))
    (one,) = outputs.load(str(tmp_path / "one.npy"))[1].values()
    assert outputs.nonfinite({"": one}) == 2
    (tmp_path / "model.cif").write_text("ATOM 1\n")
    assert outputs.load(str(tmp_path / "model.cif"))[1][""].dtype == "bytes"
    (tmp_path / "bad.npz").write_bytes(b"PK not a zip")
    with pytest.raises(outputs.OutputsError):
        outputs.load(str(tmp_path / "bad.npz"))


def test_outputs_the_writer_computed_are_identical_and_any_other_bits_differ(tmp_path):
    import numpy as np

    y = {"loss": np.float32(2.5), "grad": np.linspace(-1, 1, 7, dtype=np.float32)}
    assert proof(tmp_path / "same", y, y)["outcome"] == "identical"
    other = {**y, "grad": y["grad"] * np.float32(1 + 2e-7)}
    found = proof(tmp_path / "other", y, other)
    assert found["outcome"] == "outputs differ" and found["suspects"] == {"jax": [KEY]}, found
    assert 0 < found["max_rel"] < 1e-6 and found["noise"] == 0, found


def test_a_reader_within_the_writers_own_run_to_run_spread_passes_with_the_figure(tmp_path):
    import numpy as np

    y = np.linspace(0, 1, 8)
    found = proof(tmp_path / "a", {"y": y}, {"y": y + 3e-7}, writer_again={"y": y + 5e-7})
    assert found["outcome"] == "within run-to-run noise" and found["noise"] == 5e-07, found
    assert found["max_abs"] == 3e-07, found
    beyond = proof(tmp_path / "b", {"y": y}, {"y": y + 6e-7}, writer_again={"y": y + 5e-7})
    assert beyond["outcome"] == "outputs differ", beyond


def test_outputs_of_another_shape_differ_however_close_their_values(tmp_path):
    import numpy as np

    found = proof(tmp_path, {"y": np.float32([1, 2, 3])}, {"y": np.float32([1, 2, 3, 4])}, mode="tolerant")
    assert found["outcome"] == "outputs differ" and "y is <f4[4], not <f4[3]" in found["mismatch"], found


def test_the_tolerance_is_an_opt_in_relative_to_each_arrays_magnitude(tmp_path):
    """Large outputs 1 apart at 2e4 are within 1% with tolerant only; small ones 5e-4 apart at
    1e-3 are not, though 5e-4 is less than 0.01; the scale is each array's own (a small array
    beside a large one is not drowned)."""
    import numpy as np

    large = ({"y": np.float32([1e4, -2e4])}, {"y": np.float32([1e4 + 1, -2e4])})
    assert proof(tmp_path / "default", *large)["outcome"] == "outputs differ"
    found = proof(tmp_path / "large", *large, mode="tolerant")
    assert found["outcome"] == "within tolerance" and found["max_rel"] == 5e-05, found
    small = proof(tmp_path / "small", {"y": np.float32([1e-3, 0])}, {"y": np.float32([5e-4, 0])},
                  mode="tolerant")
    assert small["outcome"] == "outputs differ" and small["max_rel"] == 0.5, small
    beside = proof(tmp_path / "beside", {"big": np.float32([3e4]), "small": np.float32([1e-2])},
                   {"big": np.float32([3e4 + 1]), "small": np.float32([1.3e-2])}, mode="tolerant")
    assert beside["outcome"] == "outputs differ" and beside["max_rel"] == pytest.approx(0.3), beside


def test_integers_booleans_and_nan_places_are_never_tolerated(tmp_path):
    """Token ids 31000 -> 31290 and 5 -> 7 are within 1% of the largest id; a flag flips; a NaN
    moves: each differs whatever the tolerance. A NaN from the cache is its own outcome."""
    import numpy as np

    f = np.float32([1.0, 2.0])
    cases = {"ids": ({"ids": np.int64([31000, 5]), "f": f}, {"ids": np.int64([31290, 7]), "f": f}),
             "flag": ({"ok": np.array([True, False]), "f": f}, {"ok": np.array([True, True]), "f": f}),
             "moved": ({"f": np.float32([np.nan, 2.0])}, {"f": np.float32([1.0, 2.0])})}
    for name, (writer, reader) in cases.items():
        found = proof(tmp_path / name, writer, reader, mode="tolerant", tolerance=1.0)
        assert found["outcome"] == "outputs differ", (name, found)
    nan = proof(tmp_path / "nan", {"f": f}, {"f": np.float32([np.nan, 2.0])}, mode="tolerant", tolerance=1.0)
    assert nan["outcome"] == "NaN where the writer had none" and nan["new_nonfinite"] == 1, nan


def test_an_entry_whose_bytes_no_warm_compiled_is_compared_and_alone_set_aside(tmp_path):
    import numpy as np

    from gpu_cache.commands import outputs_proof

    y = {"y": np.float32([2, 2, 2])}
    same = proof(tmp_path / "same", y, y, entry_now=b"a recompile that computes the same")
    assert same["outcome"] == "identical" and same["entries"] == "changed", same
    wrong = proof(tmp_path / "wrong", y, {"y": np.float32([100, 100, 100])}, entry_now=b"another function")
    assert wrong["outcome"] == "outputs differ" and wrong["entries"] == "changed", wrong
    line = outputs_proof.problem_of(wrong)
    assert line.startswith("outputs differ: workload w shape 8 computes other outputs from the cache "
                           "than the warm process that compiled its entries"), line
    assert f"jax {KEY}: set aside" in line, line
    assert "not what any warm process compiled" in line


def test_each_array_is_allowed_its_own_noise_not_the_largest_of_any(tmp_path):
    """A noisy array beside an exact one: the exact one may not differ by the other's noise."""
    import numpy as np

    x, y = np.linspace(0, 1, 8), np.linspace(1, 2, 8)
    found = proof(tmp_path, {"noisy": x, "exact": y}, {"noisy": x, "exact": y + 1e-6},
                  writer_again={"noisy": x + 1e-3, "exact": y})
    assert found["outcome"] == "outputs differ" and found["noise"] == 0.001, found


def test_the_larger_of_the_writers_and_the_readers_own_noise_is_allowed(tmp_path):
    """The writer's two runs lie 5e-7 apart, the reader's 1e-7: a reader 3e-7 off is within the
    writer's noise (both are the same executable's), whichever of the two spreads comes last."""
    import numpy as np

    from gpu_cache.core import outputs

    assert outputs.noise_of({"y": 5e-7}, {"y": 1e-7}) == {"y": 5e-7}
    assert outputs.noise_of({"y": 1e-7}, {"y": 5e-7}) == {"y": 5e-7}
    y = np.linspace(0, 1, 8)
    found = proof(tmp_path, {"y": y}, {"y": y + 3e-7}, writer_again={"y": y + 5e-7},
                  reader_again={"y": y + 4e-7})
    assert found["outcome"] == "within run-to-run noise" and found["noise"] == 5e-07, found


def test_an_outputs_file_with_another_placeholder_is_one_line_and_exit_2(cache_root):
    import json

    from helpers import run_cli_here

    config = json.dumps({"workloads": {"mine": {"command": "true", "outputs": "out/{tokens}.npz"}},
                         "default_workloads": ["mine"]})
    result = run_cli_here("warm", "--config-json", config, "--cache-root", str(cache_root))
    assert result.returncode == 2, result.stderr
    assert "workload mine: outputs 'out/{tokens}.npz' is not valid" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


#: The head of AlphaFold 3's mmCIF output as it writes ``_atom_site`` (two atoms).
MODEL_CIF = """data_fold
loop_
_atom_site.group_PDB
_atom_site.Cartn_x
_atom_site.Cartn_y
_atom_site.Cartn_z
_atom_site.auth_atom_id
ATOM 1.5 -2.25 3.0 "O5'"
ATOM 4.0 5.0 -6.5 CA
"""


def test_alphafold3_reports_the_coordinates_and_the_confidences_of_its_prediction(tmp_path, monkeypatch):
    import numpy as np

    from gpu_cache.workloads import alphafold3

    fold = tmp_path / "out" / "gpu_cache_warm_2"
    fold.mkdir(parents=True)
    (fold / "gpu_cache_warm_2_model.cif").write_text(MODEL_CIF)
    (fold / "gpu_cache_warm_2_confidences.json").write_text(
        '{"atom_plddts": [90.5, 80.25], "pae": [[0.5, 1.0], [1.5, 0.25]], "atom_chain_ids": ["A", "A"]}')
    (fold / "gpu_cache_warm_2_summary_confidences.json").write_text('{"ptm": 0.75, "has_clash": 0.0}')
    monkeypatch.setenv("GPU_CACHE_OUTPUTS", str(tmp_path / "outputs.npz"))
    alphafold3.report_outputs(str(tmp_path / "out"))
    found = np.load(tmp_path / "outputs.npz")
    assert sorted(found.files) == ["confidences/atom_plddts", "confidences/pae", "coordinates",
                                   "summary_confidences/has_clash", "summary_confidences/ptm"]
    assert found["coordinates"].tolist() == [[1.5, -2.25, 3.0], [4.0, 5.0, -6.5]]
    assert found["confidences/pae"].shape == (2, 2) and float(found["summary_confidences/ptm"]) == 0.75
