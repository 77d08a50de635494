"""The verdict proves that the warm cache computes what a fresh compile computes (issue 40):
a well-formed but wrong entry in a trusted root fails validation, is named and set aside,
and the next warm and validate pass; a program that is not deterministic run to run passes
"within run-to-run noise". Real JAX compiles on the CPU, real processes."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from helpers import clean_environ, read_json, run_cli, write_config
from wrong_entries import (
    HUNDRED,
    PLUS_ONE,
    TWO_GRAPHS,
    entries_of,
    plant_jax,
    swap_inductor_graph,
    swap_jax_triton_ptx,
    tear_triton,
    triton_groups,
)


def plus_one_config(tmp_path: Path, **extra: object) -> Path:
    program = tmp_path / "plus_one.py"
    program.write_text(PLUS_ONE)
    out = tmp_path / "out"
    out.mkdir()
    return write_config(tmp_path / "c.yaml", {
        "workloads": {"plus": {"command": f"{{python}} {program} {out}/{{shape}}.npy", "shapes": [3],
                               "outputs": f"{out}/{{shape}}.npy"}},
        "default_workloads": ["plus"], **extra})


def next_warm_and_validation_pass(common: tuple[str, ...], tmp_path: Path,
                                  env: dict[str, str] | None = None) -> None:
    """The next warm compiles what was set aside, and the validation after it passes: every
    shape's outputs identical to the cold pass's."""
    assert run_cli("warm", *common, "--output", str(tmp_path / "w-next.json"), env=env).returncode == 0
    done = run_cli("validate", *common, "--output", str(tmp_path / "v-next.json"), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = read_json(tmp_path / "v-next.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert {s["outcome"] for s in verdict["outputs"]["shapes"]} == {"identical"}


@pytest.mark.slow
def test_another_functions_executable_under_the_key_fails_is_named_and_set_aside(cache_root, tmp_path):
    config = plus_one_config(tmp_path)
    common = ("--config", str(config), "--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    first = run_cli("validate", *common, "--output", str(tmp_path / "v1.json"))
    assert first.returncode == 0, first.stderr[-3000:]
    verdict = read_json(tmp_path / "v1.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["outputs"]["shapes"][0]["outcome"] == "identical", verdict["outputs"]

    key = plant_jax(cache_root / "jax", "jit_plus_one", HUNDRED, "jit_hundred", tmp_path / "scratch",
                    clean_environ())
    planted = run_cli("validate", *common, "--output", str(tmp_path / "v2.json"))
    assert planted.returncode == 0, planted.stderr[-3000:]
    verdict = read_json(tmp_path / "v2.json")
    assert verdict["hits"] >= 1 and verdict["misses"] == 0  # what today's verdict saw, and passed
    assert verdict["passed"] is False
    (problem,) = [p for p in verdict["problems"] if "outputs differ" in p]
    assert "plus shape 3" in problem and f"jax {key}" in problem, problem
    assert key in verdict["outputs"]["set_aside"]["jax"]
    assert not list((cache_root / "jax").glob(f"{key}-*")), "the wrong entry is still served"
    assert "outputs differ" in planted.stderr

    next_warm_and_validation_pass(common, tmp_path)


@pytest.mark.slow
def test_a_wrong_entry_the_node_local_tier_fetched_is_dropped_there_when_it_is_set_aside(tmp_path):
    """With the node-local tier on, a wrong entry in the root is fetched into this node's tier
    and served from there. Validation (which in the workflow judges on the host, not on the
    node) sets it aside in the root; the next job on the node drops the tier's copy before it
    serves anything, compiles the key again (a miss), and the validation after it passes."""
    from gpu_cache.core.kinds import tier_name as digest

    root = tmp_path / "root"
    config = plus_one_config(tmp_path, local_tier={"mode": "on", "folder": str(tmp_path / "tier")})
    local = tmp_path / "tier" / digest(root) / "jax"
    common = ("--config", str(config), "--cache-root", str(root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    key = plant_jax(root / "jax", "jit_plus_one", HUNDRED, "jit_hundred", tmp_path / "scratch",
                    clean_environ())
    for copy in local.glob(f"{key}-*"):  # this node has not fetched it yet
        copy.unlink()

    planted = run_cli("validate", *common, "--output", str(tmp_path / "v1.json"))
    assert planted.returncode == 0, planted.stderr[-3000:]
    verdict = read_json(tmp_path / "v1.json")
    assert verdict["passed"] is False and verdict["misses"] == 0, verdict["problems"]
    assert key in verdict["outputs"]["set_aside"]["jax"]
    assert not list((root / "jax").glob(f"{key}-*"))
    wrong = (local / f"{key}-cache").read_bytes()  # fetched into the tier, and still there
    assert wrong == (tmp_path / "scratch").joinpath(
        next(p.name for p in (tmp_path / "scratch").glob("jit_hundred-*-cache"))).read_bytes()

    assert run_cli("warm", *common, "--output", str(tmp_path / "w-next.json")).returncode == 0
    warm = read_json(tmp_path / "w-next.json")
    assert warm["recorded"]["jax"]["misses"] >= 1, warm["recorded"]["jax"]  # compiled again
    assert (local / f"{key}-cache").read_bytes() != wrong
    assert (root / "jax" / f"{key}-cache").read_bytes() == (local / f"{key}-cache").read_bytes()
    done = run_cli("validate", *common, "--output", str(tmp_path / "v2.json"))
    verdict = read_json(tmp_path / "v2.json")
    assert done.returncode == 0 and verdict["passed"] is True, verdict["problems"]
    assert {s["outcome"] for s in verdict["outputs"]["shapes"]} == {"identical"}


def aged(folder: Path, days: float) -> None:
    """Make ``folder`` and its files last used ``days`` ago."""
    when = time.time() - days * 86400
    for path in (*folder.rglob("*"), folder):
        os.utime(path, (when, when))


@pytest.mark.slow
def test_prune_removes_the_references_no_validation_needs_and_keeps_the_current_one(cache_root, tmp_path):
    """The cold passes' outputs kept as references in ``state/`` are bounded by prune: one whose
    inputs no kept measurement has, one superseded by a later validation of the same GPU type,
    workloads and shapes with other software, and one unused longer than max_age go; the one
    the latest validation used stays whatever its age, and the next validation compares with it."""
    config = plus_one_config(tmp_path)
    common = ("--config", str(config), "--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    assert run_cli("validate", *common, "--output", str(tmp_path / "v1.json")).returncode == 0
    assert read_json(tmp_path / "v1.json")["passed"] is True
    state = cache_root / "state"
    (current,) = state.glob("outputs-*")
    fingerprint, environment = current.name.split("-")[1:]
    measured = read_json(state / f"cold-{fingerprint}.json")

    def earlier(name: str, days: float, **changed: object) -> Path:
        """A reference as an earlier validation left it (its measurement changed by ``changed``)."""
        folder = state / f"outputs-{name}-{environment}"
        shutil.copytree(current, folder)
        if changed:
            (state / f"cold-{name}.json").write_text(json.dumps({**measured, **changed}))
        aged(folder, days)
        return folder

    aged(current, 2)  # the latest validation of its GPU type used it
    orphan = earlier("0" * 24, 3)  # its cold pass failed: it kept no measurement
    superseded = earlier("1" * 24, 4, software={"jax": "0.4.30"})
    old = earlier("2" * 24, 40, runs=[{**measured["runs"][0], "shape": 4}])
    young = earlier("3" * 24, 10, runs=[{**measured["runs"][0], "shape": 5}])

    def prune(max_age: str) -> dict[str, str]:
        done = run_cli("prune", "--cache-root", str(cache_root), "--max-age", max_age, "--json",
                       "--output", str(tmp_path / "p.json"))
        assert done.returncode == 0, done.stderr[-3000:]
        return {entry["key"]: entry["reason"] for entry in json.loads(done.stdout)["references"]["removed"]}

    reasons = prune("30d")
    assert sorted(reasons) == sorted(p.name for p in (orphan, superseded, old)), reasons
    assert reasons[orphan.name].startswith("no kept cold measurement has its inputs")
    assert reasons[superseded.name].startswith("superseded: cpu's workloads and shapes were validated since")
    assert reasons[old.name] == "unused longer than max_age"
    assert sorted(p.name for p in state.glob("outputs-*")) == sorted([current.name, young.name])
    assert not list(state.glob(".outputs-*"))  # nothing left half removed
    summary = run_cli("summary", "--prune", str(tmp_path / "p.json")).stdout
    assert "outputs references: " in summary and " in 2 after pruning (removed 3, " in summary, summary

    # Older than any bound, the reference of the type's latest validation is still kept.
    assert prune("1d") == {young.name: "unused longer than max_age"}
    assert [p.name for p in state.glob("outputs-*")] == [current.name]

    done = run_cli("validate", *common, "--output", str(tmp_path / "v2.json"))
    verdict = read_json(tmp_path / "v2.json")
    assert done.returncode == 0 and verdict["passed"] is True, verdict["problems"]
    assert "kept for the same workloads" in verdict["outputs"]["reference"]  # no cold pass again
    assert verdict["outputs"]["shapes"][0]["outcome"] == "identical"
    assert time.time() - current.stat().st_mtime < 600  # that validation marked it used


#: A program that is not deterministic run to run, as a GPU reduction with atomics is not: each
#: process adds its own offset (from os.urandom) of at most 0.5e-6, and its second run of the
#: same compiled program lies 0.5e-6 from its first (the noise it shows in one process).
NOISY = ("import os, sys, jax, jax.numpy as jnp, numpy as np\n"
         "y = np.asarray(jax.jit(lambda x: jnp.tanh(x) * 3)(jnp.linspace(0, 1, 8)), np.float64)\n"
         "offset = int.from_bytes(os.urandom(4), 'little') / 2 ** 32\n"
         "np.save(sys.argv[1], y + 1e-6 * (0.25 + 0.5 * offset))\n"
         "np.save(sys.argv[1][:-len('.npy')] + '.again.npy', y + 1e-6 * (0.75 + 0.5 * offset))\n")


def validated_twice(tmp_path: Path, cache_root: Path, name: str, program: str,
                    validate: dict) -> list[dict]:
    """A workload of the user's, ``name``, running ``program`` (which writes its outputs file):
    warmed and validated with the default settings, then validated again with ``validate``;
    both verdicts."""
    (tmp_path / f"{name}.py").write_text(program)
    workload = {"command": f"{{python}} {tmp_path / name}.py {tmp_path}/out-{{shape}}.npy",
                "shapes": [8], "outputs": f"{tmp_path}/out-{{shape}}.npy"}

    def config(file: str, **extra: object) -> Path:
        settings = {"workloads": {name: workload}, "default_workloads": [name], **extra}
        return write_config(tmp_path / file, settings)

    common = ("--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    first = config("c.yaml")
    warm = run_cli("warm", "--config", str(first), *common, "--output", str(tmp_path / "w.json"))
    assert warm.returncode == 0, warm.stderr[-3000:]
    verdicts = []
    for path, out in ((first, "v.json"), (config("again.yaml", validate=validate), "v2.json")):
        done = run_cli("validate", "--config", str(path), *common, "--output", str(tmp_path / out))
        assert done.returncode == 0, done.stderr[-3000:]
        verdicts.append(read_json(tmp_path / out))
    return verdicts


@pytest.mark.slow
def test_a_program_that_varies_run_to_run_passes_within_its_noise_and_not_when_identical_is_asked(
        cache_root, tmp_path):
    verdict, strict = validated_twice(tmp_path, cache_root, "noisy", NOISY, {"outputs": "identical"})
    assert verdict["passed"] is True, verdict["problems"]
    (shape,) = verdict["outputs"]["shapes"]
    assert shape["outcome"] == "within run-to-run noise", shape
    assert 0 < shape["max_abs"] <= shape["noise"] < 1e-6, shape  # the figure, and its noise
    assert verdict["outputs"]["counts"]["within run-to-run noise"] == 1
    assert strict["passed"] is False
    assert any("outputs differ" in p and "validate.outputs is identical" in p for p in strict["problems"])


#: A program whose two runs in one process agree, while each process rounds a little otherwise,
#: as a GPU's fresh compile does when its autotuning chooses another algorithm (H200: up to 6.4e-4
#: of the outputs' magnitude, docs/outputs.md).
ROUNDING = ("import os, sys, jax, jax.numpy as jnp, numpy as np\n"
            "y = np.asarray(jax.jit(lambda x: jnp.tanh(x) * 3)(jnp.linspace(0, 1, 8)), np.float64)\n"
            "y = y + 1e-4 * (0.5 + int.from_bytes(os.urandom(4), 'little') / 2 ** 32)\n"
            "np.save(sys.argv[1], y)\n"
            "np.save(sys.argv[1][:-len('.npy')] + '.again.npy', y)\n")


@pytest.mark.slow
def test_a_program_that_rounds_otherwise_from_compile_to_compile_passes_within_the_tolerance(
        cache_root, tmp_path):
    verdict, tight = validated_twice(tmp_path, cache_root, "rounding", ROUNDING, {"outputs_tolerance": 1e-6})
    assert verdict["passed"] is True, verdict["problems"]
    (shape,) = verdict["outputs"]["shapes"]
    assert shape["outcome"] == "within tolerance" and shape["tolerance"] == 0.01, shape
    assert shape["noise"] == 0 and 0 < shape["max_rel"] < 1e-4, shape  # beyond its noise, within 0.01
    assert verdict["outputs"]["counts"]["within tolerance"] == 1
    assert tight["passed"] is False
    assert any(p.startswith("outputs differ: workload rounding shape 8") and "set aside" in p
               for p in tight["problems"]), tight["problems"]


@pytest.mark.slow
def test_a_torn_triton_group_fails_compared_by_the_binaries_a_gpu_would_run(cache_root, tmp_path):
    """Without a GPU the built-in triton-kernels workload compiles ahead of time and runs
    nothing: its outputs are the kernels' cubins as the cache serves them. A group torn with
    another specialisation's cubin (same kernel, same signature) fails, is set aside, and the
    next warm and validation pass. With measure_cold false, the cold pass runs once for the
    reference alone and is kept."""
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"triton-kernels": {"shapes": [1000]}}, "default_workloads": ["triton-kernels"],
        "validate": {"measure_cold": False}})
    common = ("--config", str(config), "--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    assert run_cli("validate", *common, "--output", str(tmp_path / "v1.json")).returncode == 0
    verdict = read_json(tmp_path / "v1.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["cold_seconds"] is None  # measure_cold false: no cold time, but a reference
    assert verdict["outputs"]["shapes"][0]["outcome"] == "identical"
    assert "cold pass of this validation" in verdict["outputs"]["reference"]

    first, second = triton_groups(cache_root, "tiled_matmul_kernel")[:2]
    tear_triton(first, second)
    assert run_cli("validate", *common, "--output", str(tmp_path / "v2.json")).returncode == 0
    verdict = read_json(tmp_path / "v2.json")
    assert verdict["passed"] is False and verdict["triton"]["misses"] == 0
    assert "kept for the same workloads" in verdict["outputs"]["reference"]  # not compiled again
    (problem,) = [p for p in verdict["problems"] if p.startswith("outputs differ")]
    assert "workload triton-kernels shape 1000" in problem and f"triton {first.name}" in problem
    assert first.name in verdict["outputs"]["set_aside"]["triton"]
    assert not first.exists()
    next_warm_and_validation_pass(common, tmp_path)


@pytest.mark.slow
def test_another_graphs_code_under_an_inductor_key_fails_and_is_set_aside(tmp_path):
    pytest.importorskip("torch")
    root = tmp_path / "root"  # no space: Inductor's C++ builds fail on such a path
    (tmp_path / "graphs.py").write_text(TWO_GRAPHS)
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"graphs": {"command": f"{{python}} {tmp_path / 'graphs.py'} {tmp_path}/out.npz",
                                 "outputs": f"{tmp_path}/out.npz"}},
        "default_workloads": ["graphs"]})
    common = ("--config", str(config), "--cache-root", str(root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    plus_key = swap_inductor_graph(root / "inductor")  # plus_one's key now holds hundred's code

    assert run_cli("validate", *common, "--output", str(tmp_path / "v.json")).returncode == 0
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is False and verdict["inductor"]["misses"] == 0, verdict["problems"]
    (problem,) = [p for p in verdict["problems"] if p.startswith("outputs differ")]
    assert "workload graphs computes other outputs" in problem and f"inductor {plus_key}" in problem, problem
    assert any(key.endswith(plus_key) for key in verdict["outputs"]["set_aside"]["inductor"])
    assert not list((root / "inductor" / "fxgraph").glob(f"*/{plus_key}"))
    next_warm_and_validation_pass(common, tmp_path)


@pytest.mark.slow
def test_another_kernels_ptx_in_a_jax_triton_entry_fails_and_is_set_aside(tmp_path):
    """Without a GPU the built-in jax-triton workload lowers for CUDA and runs nothing: its
    outputs are the lowered module, which holds each kernel's PTX as the cache served it. An
    entry holding another specialisation's PTX (the same kernel, the same signature) fails, is
    set aside, and the next warm and validation pass."""
    from test_jax_triton import needs_jax_triton, plugin_environ

    needs_jax_triton()
    root = tmp_path / "root"
    config = write_config(tmp_path / "c.yaml", {
        "workloads": {"jax-triton": {"shapes": [256]}}, "default_workloads": ["jax-triton"],
        "validate": {"measure_cold": False}})
    common = ("--config", str(config), "--cache-root", str(root), "--log", str(tmp_path / "log"))

    def cli(*args: str) -> dict:
        done = run_cli(*args, *common, "--output", str(tmp_path / "out.json"), env=plugin_environ())
        assert done.returncode == 0, done.stderr[-3000:]
        return read_json(tmp_path / "out.json")

    cli("warm")
    assert cli("validate")["passed"] is True
    matmuls = entries_of(root / "jax_triton", "matmul_kernel")
    swap_jax_triton_ptx(matmuls[0], matmuls[1])

    verdict = cli("validate")
    assert verdict["passed"] is False and verdict["jax_triton"]["misses"] == 0, verdict["problems"]
    (problem,) = [p for p in verdict["problems"] if p.startswith("outputs differ")]
    assert f"jax_triton {matmuls[0].name}" in problem, problem
    assert matmuls[0].name in verdict["outputs"]["set_aside"]["jax_triton"]
    assert not matmuls[0].exists()
    next_warm_and_validation_pass(common, tmp_path, plugin_environ())


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


def test_the_difference_names_the_largest_change_new_nans_and_what_cannot_be_compared(tmp_path):
    import numpy as np

    from gpu_cache.core import outputs

    def arrays(**values):
        for name, value in values.items():
            np.save(tmp_path / f"{name}.npy", value)
        return {name: outputs.load(str(tmp_path / f"{name}.npy"))[1][""] for name in values}

    reference = arrays(a=np.float32([1, 2, 4]), b=np.float32([0, 0]))
    found = outputs.difference(reference, arrays(a=np.float32([1, 2.5, 4]), b=np.float32([np.nan, 0])))
    assert found == {"max_abs": 0.5, "max_rel": 0.125, "new_nonfinite": 1, "mismatch": None}
    found = outputs.difference(reference, arrays(a=np.float64([1, 2, 4]), c=np.float32([0])))
    assert found["mismatch"] == "a is <f8[3], not <f4[3]; b is gone; c is new"
    assert outputs.spread(reference, reference) == 0.0 and outputs.spread(reference, None) is None


def proof_of(mode: str, served, tolerance: float = 0.0, **reference) -> dict:
    from gpu_cache.commands import outputs_proof
    from gpu_cache.core.reports import RunResult

    report = {"digest": "b", "spread": 1e-6, "served": served,
              "reference": {"digest": "a", "spread": 0.0, "max_abs": 5e-7, "max_rel": 1e-7,
                            "new_nonfinite": 0, "mismatch": None, **reference}}
    return outputs_proof.outcome(RunResult("w", 8, 1.0, 0, outputs=report), mode, tolerance)


def test_each_outcome_of_a_shape():
    served = {"jax": ["jit_f-" + "0" * 64]}
    assert proof_of("tolerant", served)["outcome"] == "within run-to-run noise"
    assert proof_of("identical", served)["outcome"] == "outputs differ"
    assert proof_of("tolerant", served, max_abs=2e-6)["outcome"] == "outputs differ"
    assert proof_of("tolerant", served, max_abs=2e-6, new_nonfinite=3)["outcome"] == \
        "NaN where the cold pass had none"
    assert proof_of("tolerant", served, digest="b")["outcome"] == "identical"
    # A NaN is never noise, and a process whose own two runs differ in kind tolerates nothing.
    assert proof_of("tolerant", served, new_nonfinite=1)["outcome"] == "NaN where the cold pass had none"
    assert proof_of("tolerant", served, spread="inf")["outcome"] == "outputs differ"
    assert proof_of("tolerant", {}, max_abs=1.0)["outcome"] == "not proven"  # nothing served
    from gpu_cache.commands import outputs_proof

    line = outputs_proof.problem_of(proof_of("tolerant", None, max_abs=1.0))
    assert "no record of the entries they were served" in line
    line = outputs_proof.problem_of(proof_of("tolerant", served, max_abs=1.0))
    assert line.startswith("outputs differ: workload w shape 8")
    assert f"jax {served['jax'][0]}: set aside" in line


def test_a_difference_within_the_tolerance_passes_only_when_tolerant():
    """The H200's figures (jax-transformer shape 128: max_abs 1.04e-4, max_rel 6.4e-4 of the
    outputs' magnitude, noise 1.5e-8) pass within 0.01; a wrong program's, a new NaN or other
    shapes never do, and identical asks for bit-identity."""
    served = {"jax": ["jit_f-" + "0" * 64]}
    h200 = {"max_abs": 1.04398e-4, "max_rel": 6.35715e-4}
    found = proof_of("tolerant", served, 0.01, spread=7.45058e-09, **h200)
    assert (found["outcome"], found["tolerance"]) == ("within tolerance", 0.01)
    assert proof_of("tolerant", served, 0.0, **h200)["outcome"] == "outputs differ"
    assert proof_of("identical", served, 0.01, **h200)["outcome"] == "outputs differ"
    assert proof_of("tolerant", served, 0.01, max_abs=98.0, max_rel=49.0)["outcome"] == "outputs differ"
    assert proof_of("tolerant", served, 0.01, new_nonfinite=1, **h200)["outcome"] == \
        "NaN where the cold pass had none"
    assert proof_of("tolerant", served, 0.01, mismatch="shape (3,) is (4,)", **h200)["outcome"] == \
        "outputs differ"
    assert proof_of("tolerant", served, 0.01, max_abs="inf", max_rel="inf")["outcome"] == "outputs differ"


def judged(tmp_path: Path, reference: dict, found: dict, tolerance: float) -> dict:
    """The proof of one shape whose cold pass kept ``reference`` and whose validate run wrote
    ``found`` (arrays by name), through the files and the comparison the runner makes, judged
    ``tolerant`` with ``tolerance``."""
    import numpy as np

    from gpu_cache.commands import outputs_proof
    from gpu_cache.core import outputs
    from gpu_cache.core.reports import RunResult

    root = tmp_path / "root"
    folder = root / "state" / "outputs-f-e"
    folder.mkdir(parents=True)
    np.savez(folder / "shape.npz", **reference)
    np.savez(tmp_path / "run.npz", **found)
    run = outputs.Run({}, str(tmp_path / "run.npz"), None, "validate", folder, "shape")
    report = {**run.report(True), "served": {"jax": ["jit_f-" + "0" * 64]}}
    return outputs_proof.outcome(RunResult("w", 8, 1.0, 0, outputs=report), "tolerant", tolerance)


def test_outputs_of_another_shape_differ_however_close_their_values(tmp_path):
    import numpy as np

    found = judged(tmp_path, {"y": np.float32([1, 2, 3])}, {"y": np.float32([1, 2, 3, 4])}, 0.01)
    assert found["outcome"] == "outputs differ" and "y is <f4[4], not <f4[3]" in found["mismatch"], found


def test_the_tolerance_is_relative_to_the_outputs_magnitude(tmp_path):
    """Large outputs 1 apart at 1e4 are within 1%; small ones 5e-4 apart at 1e-3 are not, though
    5e-4 is less than 0.01."""
    import numpy as np

    large = judged(tmp_path / "large", {"y": np.float32([1e4, -2e4])}, {"y": np.float32([1e4 + 1, -2e4])},
                   0.01)
    assert large["outcome"] == "within tolerance" and large["max_rel"] == 5e-05, large
    small = judged(tmp_path / "small", {"y": np.float32([1e-3, 0])}, {"y": np.float32([5e-4, 0])}, 0.01)
    assert small["outcome"] == "outputs differ" and small["max_rel"] == 0.5, small


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
