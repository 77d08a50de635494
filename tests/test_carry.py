"""Carry a warmed cache: ``gpu-cache pack`` and ``unpack``, for real.

A root is warmed once on the CPU (the small JAX workload and the Triton kernels compiled ahead of
time for sm_90: tests/conftest.py's ``carry_root``), packed (``carry_archive``), and unpacked into
fresh roots at other paths; a validation pass there, with the old root moved away, must hit
everything. Mismatched targets, newer entries already there, last-use times and what pack takes
are checked here; hostile, damaged and odd archives in test_carry_refused.py, tokamax's
autotuning results in test_carry_autotune.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from archives import rebuild
from carried import (
    CONFIG,
    HEX,
    OTHER_PYTHON,
    manifest_of,
    need_other_python,
    one_line,
    per_kind,
    scan,
    unpack,
)
from gpu_cache import carry
from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds, software
from gpu_cache.core.kinds import jax_format as jax_cache
from helpers import clean_environ, read_json, run_cli

pytest.importorskip("triton")

# --- the round trip -----------------------------------------------------------------------


def test_manifest_says_what_warmed_it(carry_root: Path, carry_archive: Path) -> None:
    manifest = manifest_of(carry_archive)
    jsonschema.validate(manifest, carry.SCHEMA)  # what unpack reads of it
    here = software.identity()
    assert manifest["format"] == carry.FORMAT and manifest["gpu_cache_version"]
    assert manifest["software"]["jax"] == here["jax"] and manifest["software"]["triton"] == here["triton"]
    assert manifest["software_source"] == {"jax": "records of warm and validate passes",
                                           "triton": "records of warm and validate passes"}
    assert manifest["device"]["gpu_type"] == "cpu"
    assert manifest["device"]["jax"]["platforms"] == ["cpu"]
    assert manifest["device"]["triton"]["targets"] == ["sm_90"]
    for kind in kinds.names_of(carry.CARRIED):
        packed = {e["key"]: e for e in manifest["kinds"][kind]["entries"]}
        assert set(packed) == set(scan(carry_root, kind)), kind
        for key, entry in scan(carry_root, kind).items():
            assert packed[key]["last_use"] == entry.last_use
            assert set(packed[key]["sha256"]) == set(packed[key]["files"])
    assert len(manifest["kinds"]["triton"]["entries"]) == 5
    assert manifest["skipped"] == []
def test_unpacked_elsewhere_validation_hits_everything(carry_root: Path, carry_archive: Path,
                                                       tmp_path: Path) -> None:
    root = tmp_path / "elsewhere" / "new root"
    started = time.perf_counter()
    result = unpack(carry_archive, root)
    assert result.returncode == 0, result.stderr
    unpack_seconds = time.perf_counter() - started
    assert "jax: 6 new, 0 replaced, 0 kept" in result.stdout and "triton: 5 new" in result.stdout
    for kind in kinds.names_of(carry.CARRIED):
        old, new = scan(carry_root, kind), scan(root, kind)
        assert set(new) == set(old)
        for key, entry in new.items():
            assert entry.problem is None, (key, entry.problem)
            assert entry.last_use == old[key].last_use, key  # last use survives the trip
    for group in (root / "triton").glob("*/__grp__*.json"):
        for child in json.loads(group.read_text())["child_paths"].values():
            assert Path(child).parent == group.parent and Path(child).is_file()
    # The old root is gone while the new one is validated: nothing may read it.
    away = carry_root.with_name("moved away")
    carry_root.rename(away)
    try:
        result = run_cli("validate", "--config-json", CONFIG, "--cache-root", str(root),
                         "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "v.log"))
    finally:
        away.rename(carry_root)
    assert result.returncode == 0, result.stderr
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["misses"] == 0 and verdict["new_entries"] == 0
    assert verdict["jax"]["hits"] == len(scan(carry_root, "jax")) and verdict["jax"]["misses"] == 0
    assert verdict["triton"] == {"hits": 5, "misses": 0, "new_entries": 0, "processes_observed": 1}
    # Triton's own listener, through the hook's records: cache_hit=True for every kernel.
    triton_records = [r for r in map(read_json, (root / "records").glob("*.json"))
                      if r.get("rule") == "validate_cache" and "triton" in r]
    assert [(r["triton"]["hits"], r["triton"]["missed"]) for r in triton_records] == [(5, [])]
    assert unpack_seconds < 30
def warm_at(root: Path, work: Path) -> dict[str, Any]:
    """The report of a warm pass of CONFIG at ``root``."""
    result = run_cli("warm", "--config-json", CONFIG, "--cache-root", str(root),
                     "--output", str(work / "w.json"), "--log", str(work / "w.log"))
    assert result.returncode == 0, result.stderr
    return read_json(work / "w.json")


def test_the_warms_proof_goes_with_the_entries_and_a_warm_there_compiles_none_again(
        carry_archive: Path, tmp_path: Path) -> None:
    """Each entry whose bytes the packed root's references name (a warm process compiled them)
    says so in the manifest; unpack keeps that proof, so the first warm at the new root keeps
    its references from the carried entries and compiles none again. Without it, every carried
    entry is one no warm of that root compiled, which its warm re-makes (docs/outputs.md)."""
    marked = {kind: sum(1 for e in part["entries"] if e.get("warm"))
              for kind, part in manifest_of(carry_archive)["kinds"].items() if part["entries"]}
    assert marked == {"jax": 6, "triton": 5}, marked
    root = tmp_path / "new root"
    result = unpack(carry_archive, root)
    assert result.returncode == 0, result.stderr
    assert "jax: 6 new, 0 replaced, 0 kept (newer here), 6 a warm's compile" in result.stdout, result.stdout
    warm = warm_at(root, tmp_path)
    assert warm["remade"] == {}, warm["remade"]
    kept = [run["outputs"]["reference"] for run in warm["runs"] if run["outputs"]]
    assert len(kept) == 2 and all(r["kept"] for r in kept), kept
    assert sum(warm["new_entries"].values()) == 0 and warm["recorded"]["jax"]["misses"] == 0
def test_an_entry_no_warm_compiled_goes_unproven_and_the_warm_there_makes_it_again(
        carry_root: Path, tmp_path: Path) -> None:
    """An entry whose bytes the references do not name (changed since its warm, or compiled by
    jobs) is packed without the mark: the first warm at the new root compiles it again."""
    copy = tmp_path / "copy"
    shutil.copytree(carry_root, copy, symlinks=True)
    key = sorted(scan(copy, "jax"))[0]
    for manifest in (copy / "state").glob("outputs-*/*.json"):
        found = json.loads(manifest.read_text())
        if key in found.get("entries", {}).get("jax", {}):
            found["entries"]["jax"][key] = "0" * 32
            manifest.write_text(json.dumps(found))
    path = tmp_path / "jax.tar.gz"
    result = run_cli("pack", str(path), "--cache-root", str(copy), "--kind", "jax")
    assert result.returncode == 0, result.stderr
    unmarked = [e["key"] for e in manifest_of(path)["kinds"]["jax"]["entries"] if not e.get("warm")]
    assert unmarked == [key], unmarked
    root = tmp_path / "new root"
    assert unpack(path, root).returncode == 0
    assert warm_at(root, tmp_path)["remade"] == {"jax": [key]}
def test_last_use_and_atime_survive(carry_root: Path, tmp_path: Path) -> None:
    """A size-capped cache's -atime records and every file time come back as they were."""
    source = tmp_path / "capped"
    shutil.copytree(carry_root, source)
    for number, entry in enumerate(scan(source, "jax").values()):
        when = time.time() - 86400 * (number + 2) + 0.123456
        os.utime(entry.source.cache_path, (when, when))
        entry.source.last_use = when + 3600.5  # a use after the write, as JAX's -atime says
        jax_cache.write_atime(source / "jax", entry.source)
    for number, folder in enumerate(sorted((source / "triton").iterdir())):
        when = time.time() - 3600 * (number + 2) + 0.25
        for path in [*folder.iterdir(), folder]:
            os.utime(path, (when, when))
    path = tmp_path / "capped.tar"
    assert run_cli("pack", str(path), "--cache-root", str(source)).returncode == 0
    root = tmp_path / "new"
    result = unpack(path, root)
    assert result.returncode == 0, result.stderr
    for kind in kinds.names_of(carry.CARRIED):
        old, new = scan(source, kind), scan(root, kind)
        assert {k: e.last_use for k, e in new.items()} == {k: e.last_use for k, e in old.items()}
    for key, entry in scan(source, "jax").items():
        copy = root / "jax" / f"{key}-atime"
        assert copy.read_bytes() == entry.source.atime_path.read_bytes()
        assert os.stat(root / "jax" / f"{key}-cache").st_mtime == os.stat(entry.source.cache_path).st_mtime
def test_a_capped_target_gets_an_atime_for_each_entry(carry_archive: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    (root / "jax" / jax_cache.LOCK_NAME).touch()  # JAX keeps one only with a size cap
    assert unpack(carry_archive, root, "--kind", "jax").returncode == 0
    for key, entry in scan(root, "jax").items():
        assert entry.source.atime_path is not None, key
        assert int.from_bytes(entry.source.atime_path.read_bytes(), "little") / 1e9 ==\
            pytest.approx(entry.last_use, abs=1e-6)
    assert not (root / "triton").exists()
def test_existing_newer_entry_is_kept_and_older_one_replaced(carry_archive: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert unpack(carry_archive, root).returncode == 0
    jax_keys = sorted(scan(root, "jax"))
    newer, older = root / "jax" / f"{jax_keys[0]}-cache", root / "jax" / f"{jax_keys[1]}-cache"
    original = older.read_bytes()
    newer.write_bytes(b"compiled here later")  # and so used now: newer than the archive's
    older.write_bytes(b"compiled here long ago")
    long_ago = time.time() - 30 * 86400
    os.utime(older, (long_ago, long_ago))
    kept, replaced = sorted((root / "triton").iterdir())[:2]
    (kept / "marker").write_text("used here later")
    (replaced / "marker").write_text("old")
    for path in [*replaced.iterdir(), replaced]:
        os.utime(path, (long_ago, long_ago))
    result = unpack(carry_archive, root, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["replaced"] == per_kind(jax=1, triton=1)
    assert report["written"] == per_kind()
    assert newer.read_bytes() == b"compiled here later"
    assert older.read_bytes() == original
    assert (kept / "marker").exists() and not (replaced / "marker").exists()
    assert scan(root, "triton")[replaced.name].problem is None
# --- the target it is told --------------------------------------------------------------------


def test_other_python_is_refused_with_one_line_then_forced(carry_archive: Path, tmp_path: Path) -> None:
    need_other_python()
    root = tmp_path / "root"
    result = unpack(carry_archive, root, "--python", OTHER_PYTHON)
    assert result.returncode == 1
    line = one_line(result)
    assert "has no jax (Python 3.9" in line and "has no triton" in line and "--force" in line
    assert not root.exists()
    result = unpack(carry_archive, root, "--python", OTHER_PYTHON, "--force")
    assert result.returncode == 0, result.stderr
    assert "forced past" in result.stdout
    assert len(scan(root, "jax")) == 6 and len(scan(root, "triton")) == 5
def test_a_manifest_from_other_software_is_refused(carry_archive: Path, tmp_path: Path) -> None:
    def older_jax(manifest: dict[str, Any]) -> None:
        for identity in manifest["software_by_kind"]["jax"]:
            identity["jax"] = identity["jaxlib"] = "0.4.30"

    edited = rebuild(carry_archive, tmp_path / "edited.tar.gz", older_jax)
    result = unpack(edited, tmp_path / "root")
    assert result.returncode == 1
    assert "jax entries were made with jax 0.4.30" in one_line(result)
    assert not (tmp_path / "root").exists()
    result = unpack(edited, tmp_path / "root", "--kind", "triton")  # the Triton half fits
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "root" / "jax").exists()
@pytest.mark.parametrize("gpu_type,kinds_,fits", [
    ("h200", [], False),  # the JAX entries were compiled on the CPU
    ("h200", ["triton"], True),  # the CPU-to-H200 story: sm_90 kernels
    ("sm_90", ["triton"], True),
    ("a100", ["triton"], False),  # sm_80
    ("cpu", [], True),
])
def test_gpu_type_is_checked(carry_archive: Path, tmp_path: Path, gpu_type: str, kinds_: list[str],
                             fits: bool) -> None:
    args = ["--gpu-type", gpu_type, "--dry-run"] + [f"--kind={k}" for k in kinds_]
    result = unpack(carry_archive, tmp_path / "root", *args)
    assert result.returncode == (0 if fits else 1), result.stderr
    if not fits:
        assert gpu_type in one_line(result)
    else:
        assert result.stdout.startswith("would unpack")
    assert not (tmp_path / "root").exists()
def test_image_is_run_to_learn_its_software(carry_archive: Path, tmp_path: Path, container_root: Any) -> None:
    root = tmp_path / "root"
    result = run_cli("unpack", str(carry_archive), "--cache-root", str(root), "--image", container_root.image,
                     env=container_root.environ(), cwd=tmp_path)
    assert result.returncode == 1
    assert f"jax {container_root.jax_version}" in one_line(result)
    assert not root.exists()
    # Without apptainer the image's name is all there is to compare: it is not the host's.
    result = run_cli("unpack", str(carry_archive), "--cache-root", str(root), "--image", container_root.image)
    assert result.returncode == 1
    assert "no apptainer" in one_line(result)
# --- what pack takes -------------------------------------------------------------------------


def test_pack_selects_by_gpu_type_and_workload(carry_root: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.tar.xz"
    result = run_cli("pack", str(path), "--cache-root", str(carry_root), "--workload", "triton-kernels",
                     "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entries"] == per_kind(triton=5)
    manifest = manifest_of(path)
    assert manifest["selection"]["workload"] == "triton-kernels"
    result = run_cli("pack", str(path), "--cache-root", str(carry_root), "--gpu-type", "cpu",
                     "--kind", "jax", "--json")
    assert json.loads(result.stdout)["entries"] == {"jax": 6}
    for args, needle in ((["--gpu-type", "h100"], "GPU type h100"), (["--workload", "nope"], "nope"),
                         (["--kind", "bytecode"], "bytecode")):
        result = run_cli("pack", str(tmp_path / "x.tar"), "--cache-root", str(carry_root), *args)
        assert result.returncode == 2 and needle in one_line(result)
    result = run_cli("pack", str(tmp_path / "x.zip"), "--cache-root", str(carry_root))
    assert result.returncode == 2 and ".tar.gz" in one_line(result)
    assert not (tmp_path / "x.tar").exists() and not (tmp_path / "x.zip").exists()
def test_pack_leaves_broken_entries_out(carry_root: Path, tmp_path: Path) -> None:
    source = tmp_path / "broken"
    shutil.copytree(carry_root, source)
    (source / "jax" / f"jit_empty-{HEX}-cache").write_bytes(b"")
    whole = next((source / "jax").glob("jit_loss-*-cache"))
    (source / "jax" / f"jit_cut-{'1' * 64}-cache").write_bytes(whole.read_bytes()[:1000])
    half = sorted((source / "triton").iterdir())[0]
    next(half.glob("*.cubin")).unlink()
    long_ago = time.time() - 7200
    for path in (*half.iterdir(), half):
        os.utime(path, (long_ago, long_ago))
    path = tmp_path / "b.tar"
    result = run_cli("pack", str(path), "--cache-root", str(source), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["entries"] == per_kind(jax=6, triton=4)
    reasons = {s["key"]: s["reason"] for s in report["skipped"]}
    assert "empty" in reasons[f"jit_empty-{HEX}"] and "truncated" in reasons[f"jit_cut-{'1' * 64}"]
    assert "cubin" in reasons[half.name]
    assert manifest_of(path)["skipped"] == report["skipped"]
def test_pack_leaves_out_entries_another_user_could_have_written(carry_root: Path, tmp_path: Path) -> None:
    """Of JAX and of Triton, an entry owned by nobody and one open to everyone (#37): gpu-cache
    would not read them, so they are left out and counted, whatever kind they are."""
    source = tmp_path / "others"
    shutil.copytree(carry_root, source)
    jax_files = sorted((source / "jax").glob("*-cache"))
    kernels = sorted(scan(source, "triton"))
    os.chown(jax_files[0], 65534, -1)  # nobody
    os.chmod(jax_files[1], 0o666)
    os.chown(next(p for p in (source / "triton" / kernels[0]).iterdir() if p.is_file()), 65534, -1)
    os.chmod(source / "triton" / kernels[1], 0o777)  # the kernel's folder: anyone may swap its files
    path = tmp_path / "o.tar"
    result = run_cli("pack", str(path), "--cache-root", str(source), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    left_out = {(u["kind"], u["key"]): u["reason"] for u in report["untrusted"]}
    assert set(left_out) == {("jax", jax_files[0].name.removesuffix("-cache")),
                             ("jax", jax_files[1].name.removesuffix("-cache")),
                             ("triton", kernels[0]), ("triton", kernels[1])}
    assert sorted(r.split(" is ")[1] for r in left_out.values()) == [
        "owned by uid 65534", "owned by uid 65534", "writable by everyone", "writable by everyone"]
    assert report["entries"]["jax"] == len(scan(carry_root, "jax")) - 2
    assert report["entries"]["triton"] == len(scan(carry_root, "triton")) - 2
    packed = {(k, e["key"]) for k, section in manifest_of(path)["kinds"].items() for e in section["entries"]}
    assert not packed & set(left_out)
    result = run_cli("pack", str(path), "--cache-root", str(source))
    assert "left out 4 entries another user could have written" in result.stdout
def test_dry_run_writes_nothing(carry_archive: Path, tmp_path: Path) -> None:
    result = unpack(carry_archive, tmp_path / "root", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("would unpack") and "jax: 6 new" in result.stdout
    assert not (tmp_path / "root").exists()
def test_help_lists_both_commands() -> None:
    result = run_cli("--help", env=clean_environ())
    assert "pack" in result.stdout and "unpack" in result.stdout
def test_a_workload_of_your_own_is_told_by_its_script() -> None:
    settings = settings_from({"workloads": {
        "predict": {"command": "{python} tools/predict.py --tokens {shape}", "shapes": [8]},
        "module": {"command": "{python} -m my_pkg.run --n {shape}", "shapes": [8]},
        "inline": {"command": "{python} -c 'import jax'", "shapes": [8]}}}, cache_root="/tmp/x")
    predict = carry.workload_matcher(settings, "predict")
    assert predict(["tools/predict.py", "--tokens", "8"]) and predict(["/abs/tools/predict.py"])
    assert not predict(["/abs/train.py"]) and not predict(["-c"]) and not predict({"x": 1})
    module = carry.workload_matcher(settings, "module")
    assert module(["/site-packages/my_pkg/run.py", "--n", "8"]) and module(["/src/my_pkg/run/__main__.py"])
    assert not module(["/site-packages/other/run.py"])
    assert not carry.workload_matcher(settings, "inline")(["-c"])
    builtin = carry.workload_matcher(settings, "jax-transformer")
    assert builtin(["/x/gpu_cache/workloads/jax_transformer.py", "--shape", "16"])
    assert not builtin(["/x/gpu_cache/workloads/triton_kernels.py"])
