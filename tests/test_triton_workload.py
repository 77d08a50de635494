"""Tests for the triton-kernels workload and the Triton cache inventory.

Everything here compiles real Triton kernels ahead of time on the CPU (the wheel's own ptxas) into
temporary cache directories; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpu_cache.core import safe_io
from gpu_cache.core.kinds import triton_format as triton_cache
from helpers import REPO, clean_environ

SHAPE = "1000"  # not a multiple of 16: exercises the unaligned specialisation too
KERNELS_PER_TARGET = 5


def _env(cache: Path | None, **extra: str) -> dict[str, str]:
    mine = {"TRITON_CACHE_DIR": str(cache)} if cache is not None else {}
    return clean_environ(**(mine | extra))


def _workload(cache: Path | None, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_cache.workloads.triton_kernels", *args],
                          env=_env(cache, **extra), capture_output=True, text=True, cwd=REPO, check=False)


def _summary(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A cache filled by one cold AOT run for sm_90 (read-only for tests: copy before changing)."""
    cache = tmp_path_factory.mktemp("triton") / "cache"
    return cache, _summary(_workload(cache, "--shape", SHAPE, "--targets", "sm_90"))


@pytest.fixture()
def cache_copy(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    """A copy of the built cache at a new path, with its manifests rewritten to point at it."""
    src, _ = built
    dst = tmp_path / "cache"
    shutil.copytree(src, dst)
    for manifest in dst.glob("*/__grp__*.json"):
        manifest.write_text(manifest.read_text().replace(str(src), str(dst)))
    return dst


# ------------------------------------------------------------------------------------------
# workload
# ------------------------------------------------------------------------------------------


def test_cold_run_compiles_every_kernel(built: tuple[Path, dict[str, Any]]) -> None:
    cache, summary = built
    assert summary["workload"] == "triton-kernels"
    assert summary["shape"] == int(SHAPE)
    assert summary["mode"] == "aot"
    assert summary["targets"] == ["sm_90"]
    assert summary["kernels"] == KERNELS_PER_TARGET
    assert (summary["hits"], summary["misses"]) == (0, KERNELS_PER_TARGET)
    inv = triton_cache.scan(cache)
    assert len(inv.kernels) == KERNELS_PER_TARGET
    assert all(e.complete and not e.points_outside for e in inv.kernels)
    kernels = {"vector_add_kernel", "row_softmax_kernel", "tiled_matmul_kernel"}
    assert {e.kernel for e in inv.kernels} == kernels


LISTENER_PROBE = """
import json, sys
import triton
seen = []
triton.knobs.compilation.listener = lambda **kw: seen.append((kw["src"].name, kw["cache_hit"]))
from gpu_cache.workloads.triton_kernels import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "seen": seen}))
"""


def test_fresh_process_gets_only_hits(cache_copy: Path) -> None:
    before = sorted(p.name for p in cache_copy.iterdir())
    proc = subprocess.run([sys.executable, "-c", LISTENER_PROBE, "--shape", SHAPE, "--targets", "sm_90"],
                          env=_env(cache_copy), capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe["rc"] == 0
    assert len(probe["seen"]) == KERNELS_PER_TARGET
    assert all(hit is True for _name, hit in probe["seen"]), probe["seen"]
    assert sorted(p.name for p in cache_copy.iterdir()) == before


def test_keys_do_not_depend_on_other_targets(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """sm_90 keys from a two-target run equal those of an sm_90-only run; sm_80 adds its own."""
    cache, _ = built
    both = tmp_path / "both"
    summary = _summary(_workload(both, "--shape", SHAPE, "--targets", "sm_80,sm_90"))
    assert summary["targets"] == ["sm_80", "sm_90"] and summary["kernels"] == 2 * KERNELS_PER_TARGET
    only_90 = {e.key for e in triton_cache.scan(cache).kernels}
    all_keys = {e.key for e in triton_cache.scan(both).kernels}
    assert only_90 < all_keys and len(all_keys) == 2 * KERNELS_PER_TARGET


def test_targets_from_environment(cache_copy: Path) -> None:
    summary = _summary(_workload(cache_copy, "--shape", SHAPE, GPU_CACHE_TRITON_TARGETS="sm_90"))
    assert summary["targets"] == ["sm_90"] and summary["misses"] == 0


@pytest.mark.parametrize("args,cache,needle", [
    (["--shape", "64"], None, "TRITON_CACHE_DIR"),
    (["--shape", "0"], "set", "--shape"),
    (["--shape", "x"], "set", "--shape"),
    (["--shape", "64", "--targets", "hopper"], "set", "bad target"),
    (["--shape", "64", "--targets", ","], "set", "empty target list"),
    (["--shape", "64", "--mode", "jit"], "set", "GPU"),
    ([], "set", "--shape"),
])
@pytest.mark.slow
def test_bad_arguments_exit_2_with_one_line(args: list[str], cache: str | None, needle: str,
                                            tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = _workload(tmp_path / "c" if cache else None, *args, HOME=str(home))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (home / ".triton").exists()


# ------------------------------------------------------------------------------------------
# inventory
# ------------------------------------------------------------------------------------------


def _first_kernel(cache: Path) -> triton_cache.TritonEntry:
    return triton_cache.scan(cache).kernels[0]


def test_incomplete_group_when_a_child_is_missing(cache_copy: Path) -> None:
    entry = _first_kernel(cache_copy)
    (entry.path / f"{entry.kernel}.cubin").unlink()
    again = {e.key: e for e in triton_cache.scan(cache_copy).entries}[entry.key]
    assert again.kind == "kernel" and not again.complete
    assert any("missing child" in p and ".cubin" in p for p in again.problems)
    assert again.bytes < entry.bytes  # the cubin no longer counts


def test_group_without_manifest_is_an_incomplete_kernel(cache_copy: Path) -> None:
    entry = _first_kernel(cache_copy)
    (entry.path / f"__grp__{entry.kernel}.json").unlink()
    again = {e.key: e for e in triton_cache.scan(cache_copy).entries}[entry.key]
    assert again.kind == "kernel" and again.kernel == entry.kernel and not again.complete


def test_stale_temp_dir_is_listed_with_its_age(cache_copy: Path) -> None:
    entry = _first_kernel(cache_copy)
    temp = entry.path / f"tmp.pid_4242_{uuid.uuid4()}"
    temp.mkdir()
    (temp / f"{entry.kernel}.cubin").write_bytes(b"x" * 100)
    old = time.time() - 3600
    os.utime(temp / f"{entry.kernel}.cubin", (old, old))
    os.utime(temp, (old, old))
    inv = triton_cache.scan(cache_copy)
    [found] = inv.temp_dirs
    assert found.path == temp and found.key == entry.key and found.pid == 4242 and found.bytes == 100
    assert found.age_seconds >= 3590
    assert {e.key: e for e in inv.entries}[entry.key].complete  # the group itself is still whole
    assert triton_cache.remove_temp_dir(found) == 100 and not temp.exists()


def test_copied_cache_points_outside(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    src, _ = built
    dst = tmp_path / "copied"
    shutil.copytree(src, dst)  # manifests still name src
    inv = triton_cache.scan(dst)
    assert len(inv.kernels) == KERNELS_PER_TARGET
    assert all(e.points_outside for e in inv.kernels)
    assert all(e.complete for e in inv.kernels)  # the files are there, under the new path
    assert not any(e.points_outside for e in triton_cache.scan(src).kernels)


def test_non_kernel_paths_are_classified(cache_copy: Path) -> None:
    module_key = "A" * 52
    (cache_copy / module_key).mkdir()
    (cache_copy / module_key / "cuda_utils.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (cache_copy / ("B" * 52)).mkdir()
    (cache_copy / "notes.txt").write_text("hi")
    (cache_copy / safe_io.TRASH_DIR_NAME).mkdir()
    inv = triton_cache.scan(cache_copy)
    by_key = {e.key: e for e in inv.entries}
    assert by_key[module_key].kind == "module" and by_key[module_key].kernel == "cuda_utils"
    assert by_key[module_key].complete
    assert by_key["B" * 52].kind == "empty" and not by_key["B" * 52].complete
    kinds = {o.path.name: o.kind for o in inv.others}
    assert kinds == {"notes.txt": "file", safe_io.TRASH_DIR_NAME: "trash"}
    assert not triton_cache.KEY_RE.match(safe_io.TRASH_DIR_NAME)


def test_scan_of_missing_dir_and_of_a_file(tmp_path: Path) -> None:
    assert triton_cache.scan(tmp_path / "nope").exists is False
    (tmp_path / "f").write_text("")
    with pytest.raises(triton_cache.TritonCacheError):
        triton_cache.scan(tmp_path / "f")


# ------------------------------------------------------------------------------------------
# removal
# ------------------------------------------------------------------------------------------


def test_remove_entry_then_triton_recompiles_only_that_kernel(cache_copy: Path) -> None:
    inv = triton_cache.scan(cache_copy)
    victim = inv.kernels[0]
    assert triton_cache.remove_entry(cache_copy, victim.key) == victim.bytes
    assert not (cache_copy / victim.key).exists()
    trash = cache_copy / safe_io.TRASH_DIR_NAME
    assert list(trash.iterdir()) == []
    after = triton_cache.scan(cache_copy)
    assert {e.key for e in after.kernels} == {e.key for e in inv.kernels} - {victim.key}
    assert all(e.complete for e in after.kernels)
    summary = _summary(_workload(cache_copy, "--shape", SHAPE, "--targets", "sm_90"))
    assert (summary["hits"], summary["misses"]) == (KERNELS_PER_TARGET - 1, 1)
    assert victim.key in {e.key for e in triton_cache.scan(cache_copy).kernels}


def test_remove_entry_rejects_bad_keys_and_ignores_missing(cache_copy: Path) -> None:
    with pytest.raises(triton_cache.TritonCacheError):
        triton_cache.remove_entry(cache_copy, "../etc")
    with pytest.raises(triton_cache.TritonCacheError):
        triton_cache.remove_entry(cache_copy, safe_io.TRASH_DIR_NAME)
    assert triton_cache.remove_entry(cache_copy, "C" * 52) == 0


def test_empty_trash_removes_leftovers(cache_copy: Path) -> None:
    trash = cache_copy / safe_io.TRASH_DIR_NAME
    (trash / "leftover").mkdir(parents=True)
    (trash / "leftover" / "x.cubin").write_bytes(b"y" * 10)
    assert triton_cache.empty_trash(cache_copy) == 10
    assert trash.is_dir() and list(trash.iterdir()) == []
