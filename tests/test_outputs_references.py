"""The outputs proof's references (issue 47): what the warm keeps as a shape's reference, when it
keeps none, which one a validation compares with, and how prune bounds them (superseded, unused
longer than max_age, least recently used over max_size; the one the latest validation used
stays). Real warms and validations through the CLI for prune, the runner's own code
(harness/settled_runs.py) for the rest."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from helpers import read_json, run_cli
from settled_runs import KEY, a_root, settled
from test_outputs_proof import plus_one_config


def aged(folder: Path, days: float) -> None:
    """Make ``folder`` and its files last used ``days`` ago."""
    when = time.time() - days * 86400
    for path in (*folder.rglob("*"), folder):
        os.utime(path, (when, when))


@pytest.mark.slow
def test_prune_removes_the_references_no_validation_needs_and_keeps_the_current_one(cache_root, tmp_path):
    """The writers' references in ``state/`` are bounded by prune: one that holds no reference
    gpu-cache may read (an older gpu-cache's cold outputs alone), one superseded by a later warm
    of the same GPU type, workloads and shapes with other software, and one unused longer than
    max_age go; the one the latest validation used stays whatever its age, and the next
    validation compares with it."""
    config = plus_one_config(tmp_path)
    common = ("--config", str(config), "--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    assert run_cli("validate", *common, "--output", str(tmp_path / "v1.json")).returncode == 0
    assert read_json(tmp_path / "v1.json")["passed"] is True
    state = cache_root / "state"
    (current,) = state.glob("outputs-*")
    environment = current.name.split("-")[2]
    (manifest,) = current.glob("*.json")

    def earlier(name: str, days: float, **changed: object) -> Path:
        """A reference folder as an earlier warm left it (its manifest changed by ``changed``;
        None: it has none)."""
        folder = state / f"outputs-{name}-{environment}"
        shutil.copytree(current, folder)
        if changed.get("manifest", True) is None:
            (folder / manifest.name).unlink()
        elif changed:
            (folder / manifest.name).write_text(json.dumps({**json.loads(manifest.read_text()), **changed}))
        aged(folder, days)
        return folder

    aged(current, 2)  # the latest validation of its GPU type used it
    orphan = earlier("0" * 24, 3, manifest=None)  # an older gpu-cache's: its cold outputs alone
    superseded = earlier("1" * 24, 4)  # the same type, workloads and shapes, other inputs
    old = earlier("2" * 24, 40, shape="4")
    young = earlier("3" * 24, 10, shape="5")

    def prune(max_age: str) -> dict[str, str]:
        done = run_cli("prune", "--cache-root", str(cache_root), "--max-age", max_age, "--json",
                       "--output", str(tmp_path / "p.json"))
        assert done.returncode == 0, done.stderr[-3000:]
        return {entry["key"]: entry["reason"] for entry in json.loads(done.stdout)["references"]["removed"]}

    reasons = prune("30d")
    assert sorted(reasons) == sorted(p.name for p in (orphan, superseded, old)), reasons
    assert reasons[orphan.name].startswith("it holds no reference gpu-cache may read")
    assert reasons[superseded.name].startswith("superseded: cpu's workloads and shapes were warmed since")
    assert reasons[old.name] == "unused longer than max_age"
    assert sorted(p.name for p in state.glob("outputs-*")) == sorted([current.name, young.name])
    assert not list(state.glob(".outputs-*"))  # nothing left half removed
    summary = run_cli("summary", "--prune", str(tmp_path / "p.json")).stdout
    assert "outputs references: " in summary, summary
    assert " in 2 after pruning, within max_size 10.0 GiB as each kind (removed 3, " in summary, summary

    # Older than any bound, the reference of the type's latest validation is still kept.
    assert prune("1d") == {young.name: "unused longer than max_age"}
    assert [p.name for p in state.glob("outputs-*")] == [current.name]

    done = run_cli("validate", *common, "--output", str(tmp_path / "v2.json"))
    verdict = read_json(tmp_path / "v2.json")
    assert done.returncode == 0 and verdict["passed"] is True, verdict["problems"]
    assert verdict["outputs"]["shapes"][0]["outcome"] == "identical"
    assert time.time() - current.stat().st_mtime < 600  # that validation marked it used


@pytest.mark.slow
def test_the_references_count_toward_max_size_and_the_least_recently_used_go(cache_root, tmp_path):
    """References of two other shapes (1 MiB each, used 2 and 3 days ago: neither superseded nor
    old) beside the one the validation just used, under ``prune --max-size 1536K``: the one used
    3 days ago goes ("least recently used over max_size"), the others stay; prune.json gives the
    bound, and the summary says the references were held to it. Before, they were never counted
    (up to 3 x 256 MiB a shape). Guard: prune._references_doomed's max_size."""
    config = plus_one_config(tmp_path)
    common = ("--config", str(config), "--cache-root", str(cache_root), "--log", str(tmp_path / "log"))
    assert run_cli("warm", *common, "--output", str(tmp_path / "w.json")).returncode == 0
    assert run_cli("validate", *common, "--output", str(tmp_path / "v.json")).returncode == 0
    state = cache_root / "state"
    (current,) = state.glob("outputs-*")
    (manifest,) = current.glob("*.json")
    earlier = []
    for days, shape in ((2, "4"), (3, "5")):
        folder = state / f"outputs-{str(days) * 24}-{current.name.split('-')[2]}"
        shutil.copytree(current, folder)
        (folder / manifest.name).write_text(json.dumps({**json.loads(manifest.read_text()), "shape": shape}))
        (folder / "padding.npy").write_bytes(bytes(1 << 20))
        aged(folder, days)
        earlier.append(folder)
    done = run_cli("prune", "--cache-root", str(cache_root), "--max-size", "1536K", "--json",
                   "--output", str(tmp_path / "p.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    part = json.loads(done.stdout)["references"]
    assert [(r["key"], r["reason"]) for r in part["removed"]] == [
        (earlier[1].name, "least recently used over max_size")]
    assert part["max_size"] == 1536 << 10 and part["bytes_after"] <= 1536 << 10
    assert sorted(p.name for p in state.glob("outputs-*")) == sorted([current.name, earlier[0].name])
    summary = run_cli("summary", "--prune", str(tmp_path / "p.json")).stdout
    assert " in 2 after pruning, within max_size 1.5 MiB as each kind (removed 1, " in summary, summary



def test_an_entry_a_later_warm_compiled_again_is_no_suspect_and_proves_nothing(tmp_path):
    """A later warm of other inputs compiled KEY again (its reference names the new bytes):
    served the new bytes, a validation of the first inputs compares nothing ("not proven": the
    outputs of another compile are no evidence) and sets nothing aside."""
    import numpy as np

    from gpu_cache.commands import outputs_proof
    from gpu_cache.core import references

    root = a_root(tmp_path, KEY)
    first, later = (references.folder_of(root, f * 24, {}) for f in "ab")
    compiled, served = {"hit_keys": [], "missed": [{"key": KEY}]}, {"hit_keys": [KEY], "missed": []}
    two, three = {"y": np.float32([2])}, {"y": np.float32([3])}
    assert settled(tmp_path, "warm", root, first, two, compiled).outputs["reference"]["kept"]
    (root / "jax" / f"{KEY}-cache").write_bytes(b"the same program compiled again, other bytes")
    assert settled(tmp_path, "warm", root, later, three, compiled).outputs["reference"]["kept"]
    run = settled(tmp_path, "validate", root, first, three, served)
    found = outputs_proof.outcome(run, "identical")
    assert found["outcome"] == "not proven" and found["entries"] == "gone", found
    assert "were compiled again since" in found["why"] and "suspects" not in found, found


def test_the_digest_is_of_the_node_local_tiers_copy_the_run_was_served(tmp_path):
    """With the tier on, a process is served the tier's copy: where it holds another executable
    than the root's (fetched before the root's was replaced, or torn on the node), that copy is
    the suspect, set aside alone; the root's copy of the shape's other entry is the writer's."""
    import numpy as np

    from gpu_cache.commands import outputs_proof
    from gpu_cache.core import references

    other = "jit_g-" + "1" * 64
    root, tier = a_root(tmp_path, KEY, other), tmp_path / "tier"
    shutil.copytree(root / "jax", tier / "jax")
    folder = references.folder_of(root, "f" * 24, {})
    compiled = {"hit_keys": [], "missed": [{"key": KEY}, {"key": other}]}
    warm = settled(tmp_path, "warm", root, folder, {"y": np.float32([2])}, compiled, tier=tier)
    assert warm.outputs["reference"]["kept"] is True, warm.outputs
    (tier / "jax" / f"{KEY}-cache").write_bytes(b"another function's executable")
    served = {"hit_keys": [KEY, other], "missed": []}
    run = settled(tmp_path, "validate", root, folder, {"y": np.float32([100])}, served, tier=tier)
    found = outputs_proof.outcome(run, "identical")
    assert found["outcome"] == "outputs differ" and found["entries"] == "changed", found
    assert found["suspects"] == {"jax": [KEY]}, found


def test_a_record_that_dropped_keys_keeps_no_reference(tmp_path):
    """A record over the hook's bound names too few entries: a reference kept from it would
    vouch for entries it never named."""
    import numpy as np

    from gpu_cache.core import output_runs, references

    root = a_root(tmp_path, KEY)
    folder = references.folder_of(root, "f" * 24, {})
    for dropped in ("hit_keys", "missed"):
        section = {"hit_keys": [], "missed": [{"key": KEY}], "dropped": {dropped: 3}}
        warm = settled(tmp_path, "warm", root, folder, {"y": np.float32([2])}, section)
        assert warm.outputs["reference"]["kept"] is False, warm.outputs
        assert "more entries than a record keeps" in warm.outputs["reference"]["why"]
        assert not (folder / f"{output_runs.slug('w', 8)}.json").exists()


def test_a_reference_kept_again_without_a_second_run_keeps_no_stale_one(tmp_path):
    """The writer's second run (its noise) is its own: a later warm that ran once leaves none of
    an earlier warm's beside its reference."""
    import numpy as np

    from gpu_cache.core import output_runs, references

    root = a_root(tmp_path, KEY)
    folder = references.folder_of(root, "f" * 24, {})
    again = folder / f"{output_runs.slug('w', 8)}.again.npz"
    compiled = {"hit_keys": [], "missed": [{"key": KEY}]}
    settled(tmp_path, "warm", root, folder, {"y": np.float32([2])}, compiled, again={"y": np.float32([2.5])})
    assert again.is_file()
    (root / "jax" / f"{KEY}-cache").write_bytes(b"compiled again")
    warm = settled(tmp_path, "warm", root, folder, {"y": np.float32([2])}, compiled)
    assert warm.outputs["reference"]["kept"] is True and not again.exists(), warm.outputs


def test_a_users_outputs_and_their_second_run_are_removed_before_each_run(tmp_path):
    """A run that writes no second run this time is not credited with an earlier run's: its
    noise would be the stale file's distance."""
    import numpy as np

    from gpu_cache.core import output_runs

    np.save(tmp_path / "out-8.npy", np.float32([1]))
    np.save(tmp_path / "out-8.again.npy", np.float32([9]))
    with output_runs.collected("w", 8, False, str(tmp_path / "out-{shape}.npy"), {}, "warm",
                               tmp_path, "cpu") as run:
        assert not (tmp_path / "out-8.npy").exists() and not (tmp_path / "out-8.again.npy").exists()
        np.save(tmp_path / "out-8.npy", np.float32([1]))
        report = run.report(True)
    assert report["spread"] is None, report


def test_references_are_kept_apart_by_what_changes_the_program_not_by_the_gpu_index_or_folder(tmp_path):
    """A warm on GPU 0 and a validation on GPU 3 of one model share a reference (the fingerprint
    holds the model and the count), as do two cache folders; XLA_FLAGS computes otherwise."""
    from gpu_cache.core import references

    def folder(**environ: str) -> Path | None:
        return references.folder_of(tmp_path, "f" * 24, environ)

    one = folder(CUDA_VISIBLE_DEVICES="0", JAX_COMPILATION_CACHE_DIR="/a")
    assert one == folder(CUDA_VISIBLE_DEVICES="3", JAX_COMPILATION_CACHE_DIR="/b")
    assert one != folder(CUDA_VISIBLE_DEVICES="0", XLA_FLAGS="--xla_cpu_enable_fast_math=true")


def test_a_run_that_left_no_record_asks_no_warm_to_prove_it(tmp_path):
    """Without the startup hook in a workload's processes no warm can keep a reference either:
    such a "not proven" must not make every run warm again (it is not one the next warm settles),
    while a shape with no reference whose processes did record asks for the warm."""
    import numpy as np

    from gpu_cache.commands import outputs_proof
    from gpu_cache.core import references

    root = a_root(tmp_path, KEY)
    folder = references.folder_of(root, "f" * 24, {})
    two = {"y": np.float32([2])}
    unrecorded = outputs_proof.outcome(settled(tmp_path, "validate", root, folder, two, None), "identical")
    assert unrecorded["outcome"] == "not proven" and "left no record" in unrecorded["why"], unrecorded
    assert "next_warm_proves" not in unrecorded
    recorded = outputs_proof.outcome(settled(tmp_path, "validate", root, folder, two,
                                             {"hit_keys": [KEY], "missed": []}), "identical")
    assert recorded["outcome"] == "not proven" and recorded["next_warm_proves"] is True, recorded
