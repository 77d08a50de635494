"""Archives that unpack refuses or checks before it writes (issues 19 and 21): hostile members
and names, damage in transit, entries packed broken, FIFOs, odd manifests and odd records, each
built from the carried archive (tests/conftest.py's ``carry_archive``) member by member."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from archives import rebuild, special
from carried import (
    HEX,
    TRITON_KEY,
    age,
    contents,
    entry_of,
    files_under,
    manifest_of,
    of_entry,
    one_line,
    per_kind,
    regular,
    scan,
    sha256,
    unpack,
)
from gpu_cache import carry
from gpu_cache.core import kinds, software
from helpers import run_cli

pytest.importorskip("triton")

# --- hostile archives -------------------------------------------------------------------------


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
def test_hostile_archive_is_refused_and_writes_nothing(carry_archive: Path, tmp_path: Path,
                                                      case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    edit, members = hostile_cases(outside)[case]
    hostile = rebuild(carry_archive, tmp_path / "hostile.tar.gz", edit, members, keep=False)
    root = tmp_path / "area" / "root"
    result = unpack(hostile, root)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "refused" in one_line(result)
    assert not root.exists()
    assert files_under(tmp_path) == sorted(["hostile.tar.gz", "outside"])
@pytest.mark.parametrize("file_name", [f"../../jax/jit_x-{HEX}-cache", "sub/k.json", "..", ".k.json"])
def test_a_triton_file_name_with_a_path_is_refused_by_the_manifest_check(
        carry_archive: Path, tmp_path: Path, file_name: str) -> None:
    """A Triton entry whose file is ``../../jax/<key>-cache`` stays inside the root, so the tar
    filter passes it; carry's own check of the manifest's names must refuse it (#19)."""
    data = b"\x78\x9c" + b"planted" * 10

    def edit(manifest: dict[str, Any]) -> None:
        manifest["kinds"] = {"triton": {"entries": [entry_of(TRITON_KEY, {file_name: data})]}}

    hostile = rebuild(carry_archive, tmp_path / "hostile.tar", edit,
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
# --- damage, hangs and odd input (#21) ------------------------------------------------------


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


def test_damage_in_transit_never_replaces_a_good_entry(carry_root: Path, tmp_path: Path) -> None:
    tar_path = tmp_path / "carry.tar"  # not compressed: nothing but the digests sees the damage
    assert run_cli("pack", str(tar_path), "--cache-root", str(carry_root)).returncode == 0
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
        assert sorted(d["key"] for d in report["damaged"]) ==\
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
                assert all(data == (carry_root / name).read_bytes() for name, (data, _) in mine.items()
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


def test_what_is_written_is_checked_as_the_kind_reads_it(carry_archive: Path, tmp_path: Path) -> None:
    """A JAX executable that does not decompress, or a Triton kernel whose metadata is not
    JSON, is not written even where its digest matches (packed broken): the entry here stays."""
    manifest = manifest_of(carry_archive)
    jax_entry = manifest["kinds"]["jax"]["entries"][0]
    jax_member = f"jax/{jax_entry['key']}-cache"
    kernel = next(e for e in manifest["kinds"]["triton"]["entries"] if e["kind"] == "kernel")
    metadata = f"triton/{kernel['key']}/{kernel['name']}.json"
    with tarfile.open(carry_archive) as tar:
        sizes = {n: tar.getmember(n).size for n in (jax_member, metadata)}
    zeros = b"\x28\xb5\x2f\xfd" + b"\0" * (sizes[jax_member] - 4)  # a zstd frame of nothing
    broken = replace_member(carry_archive, tmp_path / "b1.tar.gz", jax_member, zeros)
    broken = replace_member(broken, tmp_path / "b2.tar.gz", metadata, b"{" * sizes[metadata])
    root = tmp_path / "root"
    assert unpack(carry_archive, root).returncode == 0
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
def test_a_fifo_never_hangs_pack_or_unpack(carry_archive: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    root = tmp_path / "root"
    for args in (["unpack", str(fifo)], ["unpack", str(fifo), "--dry-run"],
                 ["unpack", str(carry_archive), "--config", str(fifo)],
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
def test_an_odd_manifest_is_one_line_and_exit_2(carry_archive: Path, tmp_path: Path, case: str) -> None:
    odd = rebuild(carry_archive, tmp_path / "odd.tar.gz", odd_manifests()[case])
    root = tmp_path / "root"
    result = unpack(odd, root, "--gpu-type", "cpu")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "manifest" in one_line(result)
    assert not root.exists()
def test_records_of_odd_shape_never_stop_pack(carry_root: Path, tmp_path: Path) -> None:
    """Records are written by jobs: a list or mapping where a text or number belongs, or a time
    of 400 digits, is passed over; the good records still say what warmed the entries."""
    source = tmp_path / "source"
    shutil.copytree(carry_root, source)
    key = next(iter(scan(carry_root, "jax")))
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
