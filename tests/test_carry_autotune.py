"""tokamax's autotuning results carried by ``gpu-cache pack`` and ``unpack`` (issue 24): a result
a warm process tuned reaches a job elsewhere; damaged ones, odd names and other versions are
refused. Archives of one entry are built from the carried archive (tests/conftest.py's
``carry_archive``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import hook_jobs
from archives import rebuild
from carried import (
    OTHER_PYTHON,
    age,
    contents,
    entry_of,
    files_under,
    manifest_of,
    need_other_python,
    one_line,
    regular,
    sha256,
    unpack,
)
from gpu_cache import carry
from gpu_cache.core import kinds, software
from gpu_cache.core.kinds import autotune_format as autotune_cache
from helpers import run_cli

pytest.importorskip("triton")

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
    assert (json.loads(result.stdout)["entries"], json.loads(result.stdout)["missing_from_cache"]) ==\
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
def test_a_damaged_autotuning_result_never_replaces_a_good_one(carry_archive: Path, tmp_path: Path,
                                                               case: str) -> None:
    if software.identity()["tokamax"] != "0.0.12":
        pytest.skip("tokamax 0.0.12 is not installed here (the target's software)")
    key = result_key()
    data = {"not JSON": b'{"format": 1, "result": ', "another device's": wrapper("NVIDIA H200"),
            "other versions": wrapper(tokamax="0.0.11"), "flipped in transit": wrapper()}[case]
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # as a bad link or disk does: the size kept
    damaged = autotune_archive(carry_archive, tmp_path / "damaged.tar", key, {"cpu.json": data},
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
def test_an_autotuning_result_with_an_odd_name_is_refused(carry_archive: Path, tmp_path: Path, key: str,
                                                         file_name: str) -> None:
    data = wrapper()
    hostile = rebuild(carry_archive, tmp_path / "hostile.tar", lambda m: m.update(
        kinds={"autotune": {"entries": [entry_of(key, {file_name: data})]}}),
        [regular(f"autotune/{key.rpartition('/')[0]}/{file_name}", data)], keep=False)
    root = tmp_path / "root"
    result = unpack(hostile, root)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "unsafe autotune entry" in one_line(result) and "nothing written" in one_line(result)
    assert not root.exists() and files_under(tmp_path) == ["hostile.tar"]
def test_a_refusal_shows_a_hostile_archive_name_escaped_on_one_line(carry_archive: Path,
                                                                    tmp_path: Path) -> None:
    """An archive's own name (a download's) with ESC sequences and a newline: the refusal
    drives no terminal and forges no line."""
    need_other_python()
    hostile = tmp_path / "carry\x1b]0;owned\x07\nforged: PASSED.tar.gz"
    shutil.copyfile(carry_archive, hostile)
    result = unpack(hostile, tmp_path / "root", "--python", OTHER_PYTHON)
    assert result.returncode == 1
    line = one_line(result)
    assert "carry\\x1b]0;owned\\x07\\x0aforged: PASSED.tar.gz does not fit" in line, line
def test_autotuning_results_of_other_versions_are_refused_unless_forced(carry_archive: Path,
                                                                        tmp_path: Path) -> None:
    if software.identity()["tokamax"] != "0.0.12":
        pytest.skip("tokamax 0.0.12 is not installed here (the target's software)")
    key = result_key("0.0.11")
    old = autotune_archive(carry_archive, tmp_path / "old.tar", key, {"cpu.json": wrapper(tokamax="0.0.11")},
                           tokamax="0.0.11")
    root = tmp_path / "root"
    result = unpack(old, root)
    assert result.returncode == 1
    assert "its autotune entries were made with tokamax 0.0.11 with jax" in one_line(result)
    assert "has tokamax 0.0.12" in one_line(result) and not root.exists()
    assert unpack(old, root, "--gpu-type", "h200", "--force").returncode == 0
    assert (root / "autotune" / key).read_bytes() == wrapper(tokamax="0.0.11")
