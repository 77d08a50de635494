"""Carry a warmed cache: ``gpu-cache pack`` and ``unpack``, for real.

A root is warmed once on the CPU (the small JAX workload and the Triton kernels compiled ahead of
time for sm_90), packed, and unpacked into fresh roots at other paths; a validation pass there,
with the old root moved away, must hit everything. Mismatched targets, hostile archives, newer
entries already there and last-use times are checked on the same archive or on archives built
here member by member.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import hook_jobs
from archives import rebuild, special
from gpu_cache import carry
from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds, software
from gpu_cache.core.kinds import autotune_format as autotune_cache
from gpu_cache.core.kinds import jax_format as jax_cache
from helpers import SMALL, clean_environ, read_json, run_cli

pytest.importorskip("triton")

CONFIG = json.dumps({
    "workloads": {**SMALL["workloads"], "triton-kernels": {"shapes": [1000]}},
    "default_workloads": ["jax-transformer", "triton-kernels"],
    "triton_targets": ["sm_90"],
    "validate": {"measure_cold": False},
})
OTHER_PYTHON = "/root/.pyenv/versions/3.9.18/bin/python"  # a Python without jax or triton
HEX = "0" * 64
TRITON_KEY = "A" * 52


def per_kind(**counts: int) -> dict[str, int]:
    """A report's count for every carried kind: ``counts``, and 0 for the others."""
    return {kind: counts.get(kind, 0) for kind in kinds.names_of(carry.CARRIED)}


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache root warmed on the CPU: JAX entries and sm_90 Triton kernels (do not change it)."""
    root = tmp_path_factory.mktemp("carry") / "warm root"
    work = root.parent
    result = run_cli("warm", "--config-json", CONFIG, "--cache-root", str(root),
                     "--output", str(work / "warm.json"), "--log", str(work / "warm.log"))
    assert result.returncode == 0, result.stderr
    return root


@pytest.fixture(scope="module")
def archive(warmed: Path) -> Path:
    path = warmed.parent / "carry.tar.gz"
    result = run_cli("pack", str(path), "--cache-root", str(warmed))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("packed ")
    return path


def manifest_of(path: Path) -> dict[str, Any]:
    with tarfile.open(path) as tar:
        first = tar.next()
        assert first is not None and first.name == carry.MANIFEST_NAME
        reader = tar.extractfile(first)
        assert reader is not None
        return json.loads(reader.read())


def scan(root: Path, kind: str) -> dict[str, Any]:
    return {e.key: e for e in kinds.named(kind).scan(root / kind, grace_seconds=0.0)}


def unpack(archive: Path, root: Path, *args: str) -> Any:
    return run_cli("unpack", str(archive), "--cache-root", str(root), *args)


def need_other_python() -> None:
    """Skip without OTHER_PYTHON here; in CI, which provides it, fail."""
    if not os.access(OTHER_PYTHON, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{OTHER_PYTHON} is missing")
        pytest.skip(f"{OTHER_PYTHON} is missing")


def one_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


# --- the round trip -----------------------------------------------------------------------


def test_manifest_says_what_warmed_it(warmed: Path, archive: Path) -> None:
    manifest = manifest_of(archive)
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
        assert set(packed) == set(scan(warmed, kind)), kind
        for key, entry in scan(warmed, kind).items():
            assert packed[key]["last_use"] == entry.last_use
            assert set(packed[key]["sha256"]) == set(packed[key]["files"])
    assert len(manifest["kinds"]["triton"]["entries"]) == 5
    assert manifest["skipped"] == []


def test_unpacked_elsewhere_validation_hits_everything(warmed: Path, archive: Path, tmp_path: Path) -> None:
    root = tmp_path / "elsewhere" / "new root"
    started = time.perf_counter()
    result = unpack(archive, root)
    assert result.returncode == 0, result.stderr
    unpack_seconds = time.perf_counter() - started
    assert "jax: 6 new, 0 replaced, 0 kept" in result.stdout and "triton: 5 new" in result.stdout
    for kind in kinds.names_of(carry.CARRIED):
        old, new = scan(warmed, kind), scan(root, kind)
        assert set(new) == set(old)
        for key, entry in new.items():
            assert entry.problem is None, (key, entry.problem)
            assert entry.last_use == old[key].last_use, key  # last use survives the trip
    for group in (root / "triton").glob("*/__grp__*.json"):
        for child in json.loads(group.read_text())["child_paths"].values():
            assert Path(child).parent == group.parent and Path(child).is_file()
    # The old root is gone while the new one is validated: nothing may read it.
    away = warmed.with_name("moved away")
    warmed.rename(away)
    try:
        result = run_cli("validate", "--config-json", CONFIG, "--cache-root", str(root),
                         "--output", str(tmp_path / "v.json"), "--log", str(tmp_path / "v.log"))
    finally:
        away.rename(warmed)
    assert result.returncode == 0, result.stderr
    verdict = read_json(tmp_path / "v.json")
    assert verdict["passed"] is True, verdict["problems"]
    assert verdict["misses"] == 0 and verdict["new_entries"] == 0
    assert verdict["jax"]["hits"] == len(scan(warmed, "jax")) and verdict["jax"]["misses"] == 0
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
        archive: Path, tmp_path: Path) -> None:
    """Each entry whose bytes the packed root's references name (a warm process compiled them)
    says so in the manifest; unpack keeps that proof, so the first warm at the new root keeps
    its references from the carried entries and compiles none again. Without it, every carried
    entry is one no warm of that root compiled, which its warm re-makes (docs/outputs.md)."""
    marked = {kind: sum(1 for e in part["entries"] if e.get("warm"))
              for kind, part in manifest_of(archive)["kinds"].items() if part["entries"]}
    assert marked == {"jax": 6, "triton": 5}, marked
    root = tmp_path / "new root"
    result = unpack(archive, root)
    assert result.returncode == 0, result.stderr
    assert "jax: 6 new, 0 replaced, 0 kept (newer here), 6 a warm's compile" in result.stdout, result.stdout
    warm = warm_at(root, tmp_path)
    assert warm["remade"] == {}, warm["remade"]
    kept = [run["outputs"]["reference"] for run in warm["runs"] if run["outputs"]]
    assert len(kept) == 2 and all(r["kept"] for r in kept), kept
    assert sum(warm["new_entries"].values()) == 0 and warm["recorded"]["jax"]["misses"] == 0


def test_an_entry_no_warm_compiled_goes_unproven_and_the_warm_there_makes_it_again(
        warmed: Path, tmp_path: Path) -> None:
    """An entry whose bytes the references do not name (changed since its warm, or compiled by
    jobs) is packed without the mark: the first warm at the new root compiles it again."""
    copy = tmp_path / "copy"
    shutil.copytree(warmed, copy, symlinks=True)
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


def test_last_use_and_atime_survive(warmed: Path, tmp_path: Path) -> None:
    """A size-capped cache's -atime records and every file time come back as they were."""
    source = tmp_path / "capped"
    shutil.copytree(warmed, source)
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


def test_a_capped_target_gets_an_atime_for_each_entry(archive: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    (root / "jax" / jax_cache.LOCK_NAME).touch()  # JAX keeps one only with a size cap
    assert unpack(archive, root, "--kind", "jax").returncode == 0
    for key, entry in scan(root, "jax").items():
        assert entry.source.atime_path is not None, key
        assert int.from_bytes(entry.source.atime_path.read_bytes(), "little") / 1e9 == \
            pytest.approx(entry.last_use, abs=1e-6)
    assert not (root / "triton").exists()


def test_existing_newer_entry_is_kept_and_older_one_replaced(archive: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert unpack(archive, root).returncode == 0
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
    result = unpack(archive, root, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["replaced"] == per_kind(jax=1, triton=1)
    assert report["written"] == per_kind()
    assert newer.read_bytes() == b"compiled here later"
    assert older.read_bytes() == original
    assert (kept / "marker").exists() and not (replaced / "marker").exists()
    assert scan(root, "triton")[replaced.name].problem is None


# --- the target it is told --------------------------------------------------------------------


def test_other_python_is_refused_with_one_line_then_forced(archive: Path, tmp_path: Path) -> None:
    need_other_python()
    root = tmp_path / "root"
    result = unpack(archive, root, "--python", OTHER_PYTHON)
    assert result.returncode == 1
    line = one_line(result)
    assert "has no jax (Python 3.9" in line and "has no triton" in line and "--force" in line
    assert not root.exists()
    result = unpack(archive, root, "--python", OTHER_PYTHON, "--force")
    assert result.returncode == 0, result.stderr
    assert "forced past" in result.stdout
    assert len(scan(root, "jax")) == 6 and len(scan(root, "triton")) == 5


def test_a_manifest_from_other_software_is_refused(archive: Path, tmp_path: Path) -> None:
    def older_jax(manifest: dict[str, Any]) -> None:
        for identity in manifest["software_by_kind"]["jax"]:
            identity["jax"] = identity["jaxlib"] = "0.4.30"

    edited = rebuild(archive, tmp_path / "edited.tar.gz", older_jax)
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
def test_gpu_type_is_checked(archive: Path, tmp_path: Path, gpu_type: str, kinds_: list[str],
                             fits: bool) -> None:
    args = ["--gpu-type", gpu_type, "--dry-run"] + [f"--kind={k}" for k in kinds_]
    result = unpack(archive, tmp_path / "root", *args)
    assert result.returncode == (0 if fits else 1), result.stderr
    if not fits:
        assert gpu_type in one_line(result)
    else:
        assert result.stdout.startswith("would unpack")
    assert not (tmp_path / "root").exists()


def test_image_is_run_to_learn_its_software(archive: Path, tmp_path: Path, container_root: Any) -> None:
    root = tmp_path / "root"
    result = run_cli("unpack", str(archive), "--cache-root", str(root), "--image", container_root.image,
                     env=container_root.environ(), cwd=tmp_path)
    assert result.returncode == 1
    assert f"jax {container_root.jax_version}" in one_line(result)
    assert not root.exists()
    # Without apptainer the image's name is all there is to compare: it is not the host's.
    result = run_cli("unpack", str(archive), "--cache-root", str(root), "--image", container_root.image)
    assert result.returncode == 1
    assert "no apptainer" in one_line(result)


# --- hostile archives -------------------------------------------------------------------------


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_of(key: str, files: dict[str, bytes], **more: Any) -> dict[str, Any]:
    """A manifest's entry of these files, with their sizes and digests."""
    return {"key": key, "files": {n: len(d) for n, d in files.items()},
            "sha256": {n: sha256(d) for n, d in files.items()}, "last_use": time.time() - 60, **more}


def one_entry(size: int = 100) -> Callable[[dict[str, Any]], None]:
    """A manifest edit: its only entry is one JAX file ``jit_x-000...-cache`` of ``size`` bytes
    (``x`` each)."""
    def edit(manifest: dict[str, Any]) -> None:
        key = f"jit_x-{HEX}"
        entry = entry_of(key, {f"{key}-cache": b""}, name="jit_x")
        entry["files"][f"{key}-cache"] = size
        entry["sha256"][f"{key}-cache"] = sha256(b"x" * size) if size < 1 << 20 else HEX
        manifest["kinds"] = {"jax": {"entries": [entry]}}
    return edit


JAX_FILE = f"jax/jit_x-{HEX}-cache"


def hostile_cases(outside: Path) -> dict[str, tuple[Callable[[dict[str, Any]], None], list[Any]]]:
    good = regular(JAX_FILE, b"x" * 100)
    evil_group = json.dumps({"child_paths": {"../../x": "/etc/passwd", "k.json": "k.json"}}).encode()
    return {
        "absolute path": (one_entry(), [good, regular(str(outside / "evil"), b"evil")]),
        "dot-dot": (one_entry(), [good, regular("jax/../../outside/evil", b"evil")]),
        "leading dot-dot": (one_entry(), [good, regular("../outside/evil", b"evil")]),
        "symbolic link": (one_entry(), [special(JAX_FILE, tarfile.SYMTYPE, link=str(outside / "evil"))]),
        "hard link": (one_entry(), [special(JAX_FILE, tarfile.LNKTYPE, link="/etc/passwd")]),
        "device": (one_entry(), [special(JAX_FILE, tarfile.CHRTYPE)]),
        "fifo": (one_entry(), [special(JAX_FILE, tarfile.FIFOTYPE)]),
        "folder": (one_entry(), [special("jax", tarfile.DIRTYPE), good]),
        "huge member, manifest agrees": (one_entry(1 << 50), [special(JAX_FILE, tarfile.REGTYPE, 1 << 50)]),
        "huge member, manifest lies": (one_entry(), [special(JAX_FILE, tarfile.REGTYPE, 1 << 40)]),
        "PAX header bomb": (one_entry(), [special(JAX_FILE, tarfile.XHDTYPE, 100 << 20), good]),
        "a file twice": (one_entry(), [good, good]),
        "a file missing": (one_entry(), []),
        "unsafe key in the manifest": (
            lambda m: m.update(kinds={"jax": {"entries": [entry_of(f"../../outside/x-{HEX}",
                                                                   {"evil": b"evil"})]}}),
            [regular("jax/evil", b"evil")]),
        "group file naming another path": (
            lambda m: m.update(kinds={"triton": {"entries": [entry_of(TRITON_KEY, {
                "__grp__k.json": evil_group, "k.json": b"{}"})]}}),
            [regular(f"triton/{TRITON_KEY}/__grp__k.json", evil_group),
             regular(f"triton/{TRITON_KEY}/k.json", b"{}")]),
    }


@pytest.mark.parametrize("case", list(hostile_cases(Path("/x"))))
def test_hostile_archive_is_refused_and_writes_nothing(archive: Path, tmp_path: Path, case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    edit, members = hostile_cases(outside)[case]
    hostile = rebuild(archive, tmp_path / "hostile.tar.gz", edit, members, keep=False)
    root = tmp_path / "area" / "root"
    result = unpack(hostile, root)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "refused" in one_line(result)
    assert not root.exists()
    assert files_under(tmp_path) == sorted(["hostile.tar.gz", "outside"])


@pytest.mark.parametrize("file_name", [f"../../jax/jit_x-{HEX}-cache", "sub/k.json", "..", ".k.json"])
def test_a_triton_file_name_with_a_path_is_refused_by_the_manifest_check(
        archive: Path, tmp_path: Path, file_name: str) -> None:
    """A Triton entry whose file is ``../../jax/<key>-cache`` stays inside the root, so the tar
    filter passes it; carry's own check of the manifest's names must refuse it (#19)."""
    data = b"\x78\x9c" + b"planted" * 10

    def edit(manifest: dict[str, Any]) -> None:
        manifest["kinds"] = {"triton": {"entries": [entry_of(TRITON_KEY, {file_name: data})]}}

    hostile = rebuild(archive, tmp_path / "hostile.tar", edit,
                      [regular(f"triton/{TRITON_KEY}/{file_name}", data)], keep=False)
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    (root / "jax" / f"jit_y-{HEX}-cache").write_bytes(b"an entry of this cache")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    result = unpack(hostile, root)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "unsafe triton entry" in one_line(result) and "nothing written" in one_line(result)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert files_under(root) == ["jax", f"jax/jit_y-{HEX}-cache"]


@pytest.mark.slow
def test_not_a_gpu_cache_archive_is_a_usage_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tar:
        info, data = regular("hello.txt", b"hi")
        tar.addfile(info, io.BytesIO(data))
    for path in (plain, tmp_path / "missing.tar"):
        result = unpack(path, tmp_path / "root")
        assert result.returncode == 2 and "error" in one_line(result)
    (tmp_path / "text.tar").write_text("not a tar file at all\n" * 100)
    result = unpack(tmp_path / "text.tar", tmp_path / "root")
    assert result.returncode == 2 and "not a gpu-cache archive" in one_line(result)
    assert not (tmp_path / "root").exists()


# --- what pack takes -------------------------------------------------------------------------


def test_pack_selects_by_gpu_type_and_workload(warmed: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.tar.xz"
    result = run_cli("pack", str(path), "--cache-root", str(warmed), "--workload", "triton-kernels", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entries"] == per_kind(triton=5)
    manifest = manifest_of(path)
    assert manifest["selection"]["workload"] == "triton-kernels"
    result = run_cli("pack", str(path), "--cache-root", str(warmed), "--gpu-type", "cpu",
                     "--kind", "jax", "--json")
    assert json.loads(result.stdout)["entries"] == {"jax": 6}
    for args, needle in ((["--gpu-type", "h100"], "GPU type h100"), (["--workload", "nope"], "nope"),
                         (["--kind", "bytecode"], "bytecode")):
        result = run_cli("pack", str(tmp_path / "x.tar"), "--cache-root", str(warmed), *args)
        assert result.returncode == 2 and needle in one_line(result)
    result = run_cli("pack", str(tmp_path / "x.zip"), "--cache-root", str(warmed))
    assert result.returncode == 2 and ".tar.gz" in one_line(result)
    assert not (tmp_path / "x.tar").exists() and not (tmp_path / "x.zip").exists()


def test_pack_leaves_broken_entries_out(warmed: Path, tmp_path: Path) -> None:
    source = tmp_path / "broken"
    shutil.copytree(warmed, source)
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


def test_pack_leaves_out_entries_another_user_could_have_written(warmed: Path, tmp_path: Path) -> None:
    """Of JAX and of Triton, an entry owned by nobody and one open to everyone (#37): gpu-cache
    would not read them, so they are left out and counted, whatever kind they are."""
    source = tmp_path / "others"
    shutil.copytree(warmed, source)
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
    assert report["entries"]["jax"] == len(scan(warmed, "jax")) - 2
    assert report["entries"]["triton"] == len(scan(warmed, "triton")) - 2
    packed = {(k, e["key"]) for k, section in manifest_of(path)["kinds"].items() for e in section["entries"]}
    assert not packed & set(left_out)
    result = run_cli("pack", str(path), "--cache-root", str(source))
    assert "left out 4 entries another user could have written" in result.stdout


def test_dry_run_writes_nothing(archive: Path, tmp_path: Path) -> None:
    result = unpack(archive, tmp_path / "root", "--dry-run")
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


# --- damage, hangs and odd input (#21) ------------------------------------------------------


def contents(root: Path) -> dict[str, tuple[bytes, float]]:
    """Every file of the cache under ``root`` (not gpu-cache's own state, where unpack keeps the
    proof of the entries it wrote): its bytes and modification time."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime)
            for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != "state"}


def age(root: Path, seconds: float) -> None:
    """Make every file and folder under ``root`` that much older (its entries then lose to an
    archive's: unpack replaces them)."""
    when = time.time() - seconds
    for path in root.rglob("*"):
        os.utime(path, (when, when))


def of_entry(files: dict[str, tuple[bytes, float]], kind: str, key: str) -> dict[str, tuple[bytes, float]]:
    """The files of one entry among ``files`` (from :func:`contents`)."""
    return {name: value for name, value in files.items() if name.startswith(f"{kind}/{key}")}


def flip_in_place(archive: Path, members: set[str]) -> None:
    """Flip a byte in the middle of each of these members' data, as a bad link or disk does:
    every size and header stays as it was."""
    with tarfile.open(archive) as tar:
        offsets = [m.offset_data + m.size // 2 for m in tar.getmembers() if m.name in members]
    assert len(offsets) == len(members)
    data = bytearray(archive.read_bytes())
    for offset in offsets:
        data[offset] ^= 0xFF
    archive.write_bytes(bytes(data))


def test_damage_in_transit_never_replaces_a_good_entry(warmed: Path, tmp_path: Path) -> None:
    tar_path = tmp_path / "carry.tar"  # not compressed: nothing but the digests sees the damage
    assert run_cli("pack", str(tar_path), "--cache-root", str(warmed)).returncode == 0
    root = tmp_path / "root"
    assert unpack(tar_path, root).returncode == 0
    age(root, 30 * 86400)  # the archive's entries are newer: unpack would replace every one
    entries = manifest_of(tar_path)["kinds"]
    damaged = {kind: entries[kind]["entries"][::2] for kind in kinds.names_of(carry.CARRIED)}
    flip_in_place(tar_path, {f"jax/{name}" for e in damaged["jax"] for name in e["files"]}
                  | {f"triton/{e['key']}/{name}" for e in damaged["triton"] for name in e["files"]
                     if not name.startswith("__grp__")})  # (a group file is checked on its own)
    before = contents(root)
    for dry in (["--dry-run"], []):
        result = unpack(tar_path, root, "--json", *dry)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == sum(len(v) for v in damaged.values()), result.stderr
        assert all("is damaged in the archive" in line and "SHA-256" in line for line in lines)
        report = json.loads(result.stdout)
        assert sorted(d["key"] for d in report["damaged"]) == \
            sorted(e["key"] for items in damaged.values() for e in items)
        assert report["replaced"] == {k: len(entries[k]["entries"]) - len(damaged[k]) for k in damaged}
    after = contents(root)
    for kind in kinds.names_of(carry.CARRIED):
        for entry in entries[kind]["entries"]:
            mine = of_entry(after, kind, entry["key"])
            if entry in damaged[kind]:  # the good entry here stays, byte for byte and time for time
                assert mine == of_entry(before, kind, entry["key"])
            else:  # the archive's, whole
                assert mine != of_entry(before, kind, entry["key"])
                assert all(data == (warmed / name).read_bytes() for name, (data, _) in mine.items()
                           if "__grp__" not in name)
        assert all(e.problem is None for e in scan(root, kind).values() if e.name != "(trash)")
    assert not [name for name in after if name not in before]  # nor a temporary file left


def replace_member(source: Path, target: Path, name: str, data: bytes) -> Path:
    """A copy of the archive whose member ``name`` holds ``data`` (of the same size), with the
    manifest's digest made to match: as packed from a broken file."""
    with tarfile.open(source) as tar:
        size = tar.getmember(name).size
    assert len(data) == size

    def edit(manifest: dict[str, Any]) -> None:
        for kind in manifest["kinds"].values():
            for entry in kind["entries"]:
                for file_name in entry["files"]:
                    if name in (f"jax/{file_name}", f"triton/{entry['key']}/{file_name}"):
                        entry["sha256"][file_name] = sha256(data)

    rebuilt = rebuild(source, target, edit)
    with tarfile.open(rebuilt) as tar:
        own = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(target, "w:gz", format=tarfile.PAX_FORMAT) as out:
        for member, content in own:
            out.addfile(member, io.BytesIO(data if member.name == name else content))
    return target


def test_what_is_written_is_checked_as_the_kind_reads_it(archive: Path, tmp_path: Path) -> None:
    """A JAX executable that does not decompress, or a Triton kernel whose metadata is not
    JSON, is not written even where its digest matches (packed broken): the entry here stays."""
    manifest = manifest_of(archive)
    jax_entry = manifest["kinds"]["jax"]["entries"][0]
    jax_member = f"jax/{jax_entry['key']}-cache"
    kernel = next(e for e in manifest["kinds"]["triton"]["entries"] if e["kind"] == "kernel")
    metadata = f"triton/{kernel['key']}/{kernel['name']}.json"
    with tarfile.open(archive) as tar:
        sizes = {n: tar.getmember(n).size for n in (jax_member, metadata)}
    zeros = b"\x28\xb5\x2f\xfd" + b"\0" * (sizes[jax_member] - 4)  # a zstd frame of nothing
    broken = replace_member(archive, tmp_path / "b1.tar.gz", jax_member, zeros)
    broken = replace_member(broken, tmp_path / "b2.tar.gz", metadata, b"{" * sizes[metadata])
    root = tmp_path / "root"
    assert unpack(archive, root).returncode == 0
    age(root, 30 * 86400)
    before = contents(root)
    result = unpack(broken, root, "--json")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "-cache file" in lines[0] and "is not JSON" in lines[1], lines
    after = contents(root)
    assert of_entry(after, "jax", jax_entry["key"]) == of_entry(before, "jax", jax_entry["key"])
    assert of_entry(after, "triton", kernel["key"]) == of_entry(before, "triton", kernel["key"])
    assert json.loads(result.stdout)["replaced"] == per_kind(jax=5, triton=4)
    assert set(after) == set(before)  # no temporary file left


def test_a_fifo_never_hangs_pack_or_unpack(archive: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    root = tmp_path / "root"
    for args in (["unpack", str(fifo)], ["unpack", str(fifo), "--dry-run"],
                 ["unpack", str(archive), "--config", str(fifo)],
                 ["pack", str(tmp_path / "x.tar"), "--config", str(fifo)]):
        result = run_cli(*args, "--cache-root", str(root), timeout=60)
        assert result.returncode == 2, args
        assert "is a FIFO" in one_line(result), args
    assert not root.exists() and not (tmp_path / "x.tar").exists()


def odd_manifests() -> dict[str, Callable[[dict[str, Any]], None]]:
    def first(manifest: dict[str, Any], kind: str = "jax") -> dict[str, Any]:
        return manifest["kinds"][kind]["entries"][0]

    def size(value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(manifest: dict[str, Any]) -> None:
            files = first(manifest)["files"]
            files[next(iter(files))] = value
        return edit

    def triton_file(manifest: dict[str, Any]) -> None:
        entry = first(manifest, "triton")
        name = next(iter(entry["files"]))
        entry["files"]["k\ud800.json"] = entry["files"].pop(name)
        entry["sha256"]["k\ud800.json"] = entry["sha256"].pop(name)

    return {
        "last use of 400 digits": lambda m: first(m).update(last_use=10 ** 400),
        "last use NaN": lambda m: first(m).update(last_use=float("nan")),
        "last use a list": lambda m: first(m).update(last_use=[1]),
        "a lone surrogate in a key": lambda m: first(m).update(key="jit_\ud800-" + HEX),
        "a lone surrogate in a Triton file name": triton_file,
        "a size that is a list": size([1]),
        "a size that is a mapping": size({}),
        "a size of 400 digits": size(10 ** 400),
        "entries a mapping": lambda m: m["kinds"]["jax"].update(entries={"a": 1}),
        "no digests (format 1)": lambda m: m.update(format_version=1),
        "device types a mapping": lambda m: m["device"]["jax"].update(gpu_types={"h200": 1}),
        "software a list": lambda m: m.update(software_by_kind={"jax": [[1]]}),
    }


@pytest.mark.parametrize("case", list(odd_manifests()))
def test_an_odd_manifest_is_one_line_and_exit_2(archive: Path, tmp_path: Path, case: str) -> None:
    odd = rebuild(archive, tmp_path / "odd.tar.gz", odd_manifests()[case])
    root = tmp_path / "root"
    result = unpack(odd, root, "--gpu-type", "cpu")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "manifest" in one_line(result)
    assert not root.exists()


def test_records_of_odd_shape_never_stop_pack(warmed: Path, tmp_path: Path) -> None:
    """Records are written by jobs: a list or mapping where a text or number belongs, or a time
    of 400 digits, is passed over; the good records still say what warmed the entries."""
    source = tmp_path / "source"
    shutil.copytree(warmed, source)
    key = next(iter(scan(warmed, "jax")))
    odd = {"version": 1, "time": 10 ** 400, "rule": "warm_cache", "gpu_type": ["cpu"], "argv": {"a": 1},
           "device": {"platform": ["cpu"], "count": [1], "kinds": [[1], {"a": 1}]},
           "env": {"JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": ["all"]},
           "jax": {"hit_keys": [[1], {"a": 1}, key], "missed": [{"key": [1]}, 5],
                   "dropped": {"hit_keys": [1], "missed": {}}},
           "triton": {"hit_keys": 5, "missed": {"key": "x"}},
           "software": {"jax": ["0.10.2"], "python": {"a": 1}}}
    (source / "records" / "1-odd-1.json").write_text(json.dumps(odd))
    odd.update(time=time.time() - 3600, device=[1], env="x", software=[1])
    (source / "records" / "2-odd-2.json").write_text(json.dumps(odd))
    for args in ([], ["--gpu-type", "cpu"]):
        path = tmp_path / "odd.tar"
        result = run_cli("pack", str(path), "--cache-root", str(source), "--json", *args)
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        manifest = manifest_of(path)
        assert manifest["device"]["jax"]["platforms"] == ["cpu"]
        assert manifest["software_by_kind"]["jax"][0]["jax"] == software.identity()["jax"]
    assert unpack(path, tmp_path / "root").returncode == 0


# --- tokamax's autotuning results (issue 24) ---------------------------------------------------


def wrapper(device: str = "cpu", tokamax: str = "0.0.12", jax: str | None = None,
            result: str = "{}") -> bytes:
    """gpu-cache's wrapper of a result, as the startup hook writes it (what unpack checks)."""
    return json.dumps({"format": 1, "tokamax": tokamax, "jax": jax or software.identity()["jax"],
                       "device_kind": device, "result": result}).encode()


def result_key(tokamax: str = "0.0.12", device: str = "cpu") -> str:
    folder = autotune_cache.version_folder(tokamax, software.identity()["jax"])
    return f"{folder}/{autotune_cache.file_name(device)}"


@pytest.mark.slow
def test_autotuning_results_are_carried_and_a_job_elsewhere_uses_them(tmp_path: Path) -> None:
    """A result tokamax tuned in a warm process, packed with one of another tokamax and a
    broken one, unpacked at another path: a job there gets the tuned config with no miss."""
    hook_jobs.real_tokamax()
    source = tmp_path / "root"
    best, _ = hook_jobs.run(hook_jobs.WARM_PROGRAM, hook_jobs.gpu_cache_env(
        source, GPU_CACHE_AUTOTUNE_SAVE="1", GPU_CACHE_RULE="warm_cache", GPU_CACHE_GPU_TYPE="cpu"))
    other = source / "autotune" / result_key("0.0.11", "NVIDIA H200")
    other.parent.mkdir()
    other.write_bytes(wrapper("NVIDIA H200", "0.0.11"))
    (source / "autotune" / result_key("0.0.11", "junk")).write_bytes(b"{")
    path = tmp_path / "tuned.tar.gz"
    result = run_cli("pack", str(path), "--cache-root", str(source), "--kind", "autotune", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["entries"] == {"autotune": 2}
    manifest = manifest_of(path)
    jsonschema.validate(manifest, carry.SCHEMA)
    packed = {e["key"]: e for e in manifest["kinds"]["autotune"]["entries"]}
    assert set(packed) == {result_key(), result_key("0.0.11", "NVIDIA H200")}
    assert (packed[result_key()]["tokamax"], packed[result_key()]["name"]) == ("0.0.12", "cpu")
    saved = (source / "autotune" / result_key()).read_bytes()
    assert packed[result_key()]["sha256"] == {"cpu.json": sha256(saved)}
    assert {v["tokamax"] for v in manifest["software_by_kind"]["autotune"]} == {"0.0.12", "0.0.11"}
    assert [s["key"] for s in manifest["skipped"]] == [result_key("0.0.11", "junk")]
    # The warm pass of GPU type cpu saved only the result of its own versions and device kind.
    result = run_cli("pack", str(tmp_path / "cpu.tar"), "--cache-root", str(source), "--kind", "autotune",
                     "--gpu-type", "cpu", "--json")
    assert result.returncode == 0, result.stderr
    assert (json.loads(result.stdout)["entries"], json.loads(result.stdout)["missing_from_cache"]) == \
        ({"autotune": 1}, {"autotune": 0})
    selected = manifest_of(tmp_path / "cpu.tar")["kinds"]["autotune"]["entries"]
    assert [e["key"] for e in selected] == [result_key()]

    root = tmp_path / "elsewhere"
    result = unpack(path, root)
    assert result.returncode == 0, result.stderr
    assert "autotune: 2 new, 0 replaced, 0 kept" in result.stdout
    for key in packed:
        copy, original = root / "autotune" / key, source / "autotune" / key
        assert copy.read_bytes() == original.read_bytes()
        assert copy.stat().st_mtime == original.stat().st_mtime  # its last use survives the trip
    assert all(e.problem is None for e in kinds.named("autotune").scan(root / "autotune"))
    out, stderr = hook_jobs.run(hook_jobs.JOB_PROGRAM, hook_jobs.gpu_cache_env(root))
    assert json.loads(out) == {"traces": 1, "compiled": 1, "main": best, "other": best}
    assert "Autotuning cache miss" not in stderr
    tuning = hook_jobs.tuning_of(root)
    assert (tuning["loaded"], tuning["misses"], tuning["refused"]) == (["cpu.json"], 0, [])

    # A result as new here is kept, a newer one too; an older or broken one is replaced.
    again = unpack(path, root, "--json")
    assert json.loads(again.stdout)["kept_newer"]["autotune"] == 2
    here, there = root / "autotune" / result_key(), root / "autotune" / result_key("0.0.11", "NVIDIA H200")
    here.write_bytes(wrapper(result='{"tuned": "here, later"}'))
    there.write_bytes(b"not JSON")
    report = json.loads(unpack(path, root, "--json").stdout)
    assert (report["kept_newer"]["autotune"], report["replaced"]["autotune"]) == (1, 1)
    assert b"here, later" in here.read_bytes()
    assert there.read_bytes() == other.read_bytes()
    assert not list((root / "autotune").rglob(".*"))  # no temporary file left


def autotune_archive(archive: Path, target: Path, key: str, files: dict[str, bytes],
                     tokamax: str = "0.0.12", sent: dict[str, bytes] | None = None) -> Path:
    """An archive of one autotuning entry of these files, as ``gpu-cache pack`` would write it
    (``sent``: the files as they arrive, where they differ)."""
    def edit(manifest: dict[str, Any]) -> None:
        entry = entry_of(key, files, name="cpu", tokamax=tokamax, jax=software.identity()["jax"])
        manifest["kinds"] = {"autotune": {"entries": [entry]}}
        manifest["software_by_kind"] = {"autotune": [{"tokamax": tokamax, "jax": software.identity()["jax"]}]}

    folder = key.rpartition("/")[0]
    arrived = {**files, **(sent or {})}
    return rebuild(archive, target, edit, [regular(f"autotune/{folder}/{n}", d) for n, d in arrived.items()],
                   keep=False)


@pytest.mark.parametrize("case", ["not JSON", "another device's", "other versions", "flipped in transit"])
def test_a_damaged_autotuning_result_never_replaces_a_good_one(archive: Path, tmp_path: Path,
                                                               case: str) -> None:
    if software.identity()["tokamax"] != "0.0.12":
        pytest.skip("tokamax 0.0.12 is not installed here (the target's software)")
    key = result_key()
    data = {"not JSON": b'{"format": 1, "result": ', "another device's": wrapper("NVIDIA H200"),
            "other versions": wrapper(tokamax="0.0.11"), "flipped in transit": wrapper()}[case]
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # as a bad link or disk does: the size kept
    damaged = autotune_archive(archive, tmp_path / "damaged.tar", key, {"cpu.json": data},
                               sent={"cpu.json": bytes(flipped)} if case == "flipped in transit" else None)
    root = tmp_path / "root"
    good = root / "autotune" / key
    good.parent.mkdir(parents=True)
    good.write_bytes(wrapper(result='{"good": 1}'))
    age(root, 30 * 86400)  # the archive's is newer: unpack would replace it
    before = contents(root)
    for dry in (["--dry-run"], []):
        result = unpack(damaged, root, "--json", *dry)
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert f"autotune entry {key!r} is damaged in the archive" in one_line(result)
        assert json.loads(result.stdout)["replaced"] == {"autotune": 0}
    assert contents(root) == before  # the good one stays, and no temporary file is left


@pytest.mark.parametrize("key,file_name", [
    ("../../jax/cpu.json", "cpu.json"),
    ("tokamax-0.0.12_jax-0.10.2/../../jax/cpu.json", "cpu.json"),
    ("/tmp/tokamax-0.0.12_jax-0.10.2/cpu.json", "cpu.json"),
    ("tokamax-0.0.12_jax-0.10.2/.cpu.json", ".cpu.json"),
    ("tokamax-0.0.12_jax-0.10.2/cpu.json", "../cpu.json"),
    ("tokamax-0.0.12_jax-0.10.2/cpu.json", "other.json"),
    ("tokamax-0.0.12_jax-0.10.2", "cpu.json"),
])
def test_an_autotuning_result_with_an_odd_name_is_refused(archive: Path, tmp_path: Path, key: str,
                                                         file_name: str) -> None:
    data = wrapper()
    hostile = rebuild(archive, tmp_path / "hostile.tar", lambda m: m.update(
        kinds={"autotune": {"entries": [entry_of(key, {file_name: data})]}}),
        [regular(f"autotune/{key.rpartition('/')[0]}/{file_name}", data)], keep=False)
    root = tmp_path / "root"
    result = unpack(hostile, root)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "unsafe autotune entry" in one_line(result) and "nothing written" in one_line(result)
    assert not root.exists() and files_under(tmp_path) == ["hostile.tar"]


def test_a_refusal_shows_a_hostile_archive_name_escaped_on_one_line(archive: Path, tmp_path: Path) -> None:
    """An archive's own name (a download's) with ESC sequences and a newline: the refusal
    drives no terminal and forges no line."""
    need_other_python()
    hostile = tmp_path / "carry\x1b]0;owned\x07\nforged: PASSED.tar.gz"
    shutil.copyfile(archive, hostile)
    result = unpack(hostile, tmp_path / "root", "--python", OTHER_PYTHON)
    assert result.returncode == 1
    line = one_line(result)
    assert "carry\\x1b]0;owned\\x07\\x0aforged: PASSED.tar.gz does not fit" in line, line


def test_autotuning_results_of_other_versions_are_refused_unless_forced(archive: Path,
                                                                        tmp_path: Path) -> None:
    if software.identity()["tokamax"] != "0.0.12":
        pytest.skip("tokamax 0.0.12 is not installed here (the target's software)")
    key = result_key("0.0.11")
    old = autotune_archive(archive, tmp_path / "old.tar", key, {"cpu.json": wrapper(tokamax="0.0.11")},
                           tokamax="0.0.11")
    root = tmp_path / "root"
    result = unpack(old, root)
    assert result.returncode == 1
    assert "its autotune entries were made with tokamax 0.0.11 with jax" in one_line(result)
    assert "has tokamax 0.0.12" in one_line(result) and not root.exists()
    assert unpack(old, root, "--gpu-type", "h200", "--force").returncode == 0
    assert (root / "autotune" / key).read_bytes() == wrapper(tokamax="0.0.11")
