"""PyTorch Inductor's cache and the CUDA driver's cache as kinds of their own: counted by
stats, bounded by prune, removed whole.

Inductor is proven with real ``torch.compile`` on the CPU (its C++ backend), in the folder
gpu-cache exports as ``TORCHINDUCTOR_CACHE_DIR``. The CUDA driver's cache can only be filled
on a GPU: its tests build the layout gpu-cache's inventory expects (``index`` and hashed
folders) and one it does not recognise.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_cache.config.settings import settings_from
from gpu_cache.core.kinds import inductor_format as inductor_cache
from gpu_cache.jobenv import env
from helpers import INDUCTOR_PROBES_PASSED, clean_environ, run_cli

DAY = 86400.0
OLD = time.time() - 40 * DAY

#: Two compiled functions: C++ kernels, FX graphs, AOTAutograd entries, locks. Prints "ok"
#: when the compiled results match eager mode.
WORKLOAD = """
import torch
torch.manual_seed(0)
def f(x, y):
    return (x.sin() + y.cos()).relu() * 2
def g(m):
    return torch.nn.functional.gelu(m @ m.T).sum(dim=0)
x, y, m = torch.randn(64), torch.randn(64), torch.randn(16, 16)
compiled = [torch.compile(f)(x, y), torch.compile(g)(m)]
eager = [f(x, y), g(m)]
assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(compiled, eager)), "results differ"
print("ok")
"""


def _torch_or_skip() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("torch is not installed (pip install torch==2.13.0: the CPU wheel on this disk)")
        pytest.skip("torch is not installed")


def compile_in(root: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the workload in a fresh process with gpu-cache's environment for ``root``;
    ``check``: it must succeed."""
    base = {k: v for k, v in clean_environ().items() if k not in INDUCTOR_PROBES_PASSED}  # probes built
    exports = env.resolve(settings_from({}, cache_root=str(root)), environ=base)
    job = env.job_environ(exports, base=base, TORCHINDUCTOR_COMPILE_THREADS="1")
    assert job["TORCHINDUCTOR_CACHE_DIR"] == str(root / "inductor")
    done = subprocess.run([sys.executable, "-c", WORKLOAD], env=job, capture_output=True, text=True,
                          timeout=900)
    if check:
        assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    return done


def code_groups(folder: Path) -> dict[str, set[str]]:
    """Inductor's code entries as the files show them: ``<shard>/<key>`` -> file names."""
    groups: dict[str, set[str]] = {}
    for shard in folder.iterdir():
        if shard.is_dir() and inductor_cache.SHARD_RE.match(shard.name):
            for file in shard.iterdir():
                groups.setdefault(f"{shard.name}/{file.name.split('.', 1)[0]}", set()).add(file.name)
    return groups


def key_folders(folder: Path) -> set[str]:
    """FX graph and AOTAutograd key folders, relative to the Inductor folder."""
    found = {str(p.relative_to(folder)) for p in (folder / "fxgraph").glob("*/*") if p.is_dir()}
    return found | {str(p.relative_to(folder)) for p in (folder / "aotautograd").glob("*") if p.is_dir()}


def regular_bytes(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*")
               if p.is_file() and not p.is_symlink() and p.name != ".gpu-cache-verified")


def age(paths, when: float = OLD) -> None:
    for path in paths:
        os.utime(path, (when, when), follow_symlinks=False)


def stats(root: Path) -> dict:
    done = run_cli("stats", "--json", "--cache-root", str(root))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def prune_json(root: Path, *args: str) -> dict:
    done = run_cli("prune", "--json", "--cache-root", str(root), *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def compiled_root(tmp_path_factory) -> Path:
    """A cache root that real torch.compile filled (once per module; tests copy it)."""
    _torch_or_skip()
    root = tmp_path_factory.mktemp("inductor") / "root"
    compile_in(root)
    return root


@pytest.fixture
def root(tmp_path, compiled_root) -> Path:
    copy = tmp_path / "root"
    shutil.copytree(compiled_root, copy, symlinks=True)  # copy2: times kept
    return copy


def test_torch_compile_fills_the_exported_folder_and_stats_counts_every_byte(root):
    folder = root / "inductor"
    groups, keyed = code_groups(folder), key_folders(folder)
    assert any(name.endswith(".so") for files in groups.values() for name in files), groups
    assert any(name.endswith(".py") for files in groups.values() for name in files), groups
    assert any(k.startswith("fxgraph/") for k in keyed) and any(k.startswith("aotautograd/") for k in keyed)
    assert list((folder / "locks").iterdir()), "Inductor locks each C++ build"
    info = stats(root)["kinds"]["inductor"]
    assert info["broken"] == 0, info["broken_entries"]
    assert info["bytes"] == regular_bytes(folder)
    assert info["entries"] >= len(groups) + len(keyed)
    assert info["last_use_from"].startswith("the newest modification or access time")
    names = {row["name"] for row in info["by_function"]}
    assert {"FX graph", "AOTAutograd graph"} <= names and any(n.startswith("code (") for n in names)


def test_prune_by_size_removes_whole_entries_and_the_next_compile_works(root):
    folder = root / "inductor"
    groups, keyed = code_groups(folder), key_folders(folder)
    total = regular_bytes(folder)
    report = prune_json(root, "--kind", "inductor", "--max-size", str(total // 2))["inductor"]
    assert report["entries_removed"] > 0 and report["bytes_after"] <= total // 2
    assert report["errors"] == []
    removed = {row["key"] for row in report["removed"]}
    after_groups, after_keyed = code_groups(folder), key_folders(folder)
    for key, files in groups.items():
        if key in removed:
            assert key not in after_groups, f"{key}: part of a removed entry is left"
            assert not (folder / "locks" / f"{key.split('/')[1]}.lock").exists()
        else:
            assert after_groups.get(key) == files, f"{key}: a kept entry lost files"
    assert after_keyed == keyed - removed
    compile_in(root)  # recompiles what went, and still gives the right results
    assert stats(root)["kinds"]["inductor"]["broken"] == 0


def test_prune_by_age_removes_the_old_entries_whole_and_keeps_the_rest(root):
    folder = root / "inductor"
    groups, keyed = code_groups(folder), key_folders(folder)
    old_groups = sorted(groups)[: max(1, len(groups) // 2)]
    old_keyed = {k for k in keyed if k.startswith("fxgraph/")}
    for key in old_groups:
        shard, name = key.split("/")
        age(folder / shard / file for file in groups[key])
        lock = folder / "locks" / f"{name}.lock"
        if lock.exists():
            age([lock])
    for key in old_keyed:
        age([*(folder / key).iterdir(), folder / key])
    report = prune_json(root, "--kind", "inductor", "--max-age", "30d")["inductor"]
    assert {row["key"] for row in report["removed"]} == set(old_groups) | old_keyed
    assert all(row["reason"] == "unused longer than max_age" for row in report["removed"])
    assert set(code_groups(folder)) == set(groups) - set(old_groups)
    assert key_folders(folder) == keyed - old_keyed
    compile_in(root)


def test_cut_short_libraries_are_found_removed_and_rebuilt_whole(root):
    """Inductor trusts a .so that exists: its CPU-feature probes (small programs it builds
    into the cache and loads to see whether the CPU runs, say, AVX-512) stay cut short for
    good, and every later job believes the CPU lacks those features (measured with torch
    2.13 on this CPU: with one probe cut short it compiled other kernels; with all of them,
    every torch.compile failed to build its kernels). Prune finds them (their ELF headers
    reach past their end) and removes them; Inductor then builds them again, whole, and the
    original kernels hit again."""
    folder = root / "inductor"
    probes = {p: p.read_bytes() for p in folder.glob("*/*.so") if not p.name.endswith(".main.so")}
    assert probes, "torch.compile on the CPU builds its CPU-feature probes into the cache"
    for probe, data in probes.items():
        probe.write_bytes(data[: len(data) // 3])  # what a killed linker or a full disk leaves
    age(probes)
    compile_in(root, check=False)  # fails here (or compiles other kernels): never repairs them
    assert all(p.stat().st_size < len(data) for p, data in probes.items()), "never repaired"
    dry = prune_json(root, "--kind", "inductor", "--dry-run")["inductor"]
    broken = {row["key"]: row["reason"] for row in dry["removed"]}
    for probe in probes:
        key = f"{probe.parent.name}/{probe.name.split('.', 1)[0]}"
        assert "cut short" in broken.get(key, ""), (key, dry["removed"])
    assert all(p.exists() for p in probes), "a dry run removes nothing"
    prune_json(root, "--kind", "inductor")
    assert not any(p.exists() for p in probes)
    before = {p for p in folder.rglob("*") if p.is_file()}
    compile_in(root)
    rebuilt = [p for p in probes if p.exists()]  # (the probes it needs: it stops at the first yes)
    assert rebuilt and all(inductor_cache.elf_problem(str(p), p.stat()) is None for p in rebuilt)
    new = {p for p in folder.rglob("*") if p.is_file()} - before - set(probes)
    assert not [p for p in new if p.suffix in (".so", ".py")], "the original kernels hit again"


def test_an_empty_library_is_broken_for_stats_but_a_young_one_may_be_mid_link(tmp_path):
    folder = tmp_path / "root" / "inductor"
    (folder / "ab").mkdir(parents=True)
    (folder / "locks").mkdir()
    old, young = "cabold" + "x" * 46, "cabnew" + "y" * 46
    for key in (old, young):
        (folder / "ab" / f"{key}.cpp").write_text("// kernel\n")
        (folder / "ab" / f"{key}.so").write_bytes(b"")
        (folder / "locks" / f"{key}.lock").write_bytes(b"")
    age([folder / "ab" / f"{old}.cpp", folder / "ab" / f"{old}.so", folder / "locks" / f"{old}.lock"],
        time.time() - 2 * 3600)
    info = stats(tmp_path / "root")["kinds"]["inductor"]
    # The young one is not judged: a linker may be writing it (and it is the last to go).
    assert [row["key"] for row in info["broken_entries"]] == [f"ab/{old}"]
    assert info["entries"] == 2
    report = prune_json(tmp_path / "root", "--kind", "inductor")["inductor"]
    assert [row["key"] for row in report["removed"]] == [f"ab/{old}"]
    assert sorted(p.name for p in (folder / "ab").iterdir()) == [f"{young}.cpp", f"{young}.so"]
    assert sorted(p.name for p in (folder / "locks").iterdir()) == [f"{young}.lock"]


def test_an_entry_being_compiled_is_not_removed(tmp_path):
    folder = tmp_path / "root" / "inductor"
    (folder / "cd").mkdir(parents=True)
    (folder / "locks").mkdir()
    busy, idle = "ccdbusy" + "b" * 45, "ccdidle" + "i" * 45
    for key in (busy, idle):
        (folder / "cd" / f"{key}.py").write_text("# wrapper\n")
        (folder / "locks" / f"{key}.lock").write_bytes(b"")
    age([*(folder / "cd").iterdir(), *(folder / "locks").iterdir()])
    with open(folder / "locks" / f"{busy}.lock", "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what Inductor's FileLock holds while it builds
        report = prune_json(tmp_path / "root", "--kind", "inductor", "--max-age", "1d")
    part = report["inductor"]
    assert [row["key"] for row in part["removed"]] == [f"cd/{idle}"]
    assert any("being compiled" in error for error in part["errors"]), part["errors"]
    assert (folder / "cd" / f"{busy}.py").exists() and (folder / "locks" / f"{busy}.lock").exists()
    assert not (folder / "cd" / f"{idle}.py").exists()


def test_stale_temporaries_and_orphan_locks_go_young_temporaries_stay(tmp_path):
    folder = tmp_path / "root" / "inductor"
    (folder / "ef").mkdir(parents=True)
    (folder / "locks").mkdir()
    stale, fresh = folder / "ef" / ".4242.1.tmp", folder / "ef" / ".4343.1.tmp"
    stale.write_text("half")
    fresh.write_text("half")
    orphan = folder / "locks" / ("cgone" + "z" * 47 + ".lock")
    orphan.write_bytes(b"")
    age([stale, orphan])
    report = prune_json(tmp_path / "root", "--kind", "inductor", "--max-age", "30d")["inductor"]
    reasons = {row["key"]: row["reason"] for row in report["removed"]}
    assert reasons["ef/.4242.1.tmp"].startswith("broken: stale temporary")
    assert reasons[f"locks/{orphan.name}"] == "unused longer than max_age"
    assert fresh.exists() and not stale.exists() and not orphan.exists()


# --- the CUDA driver's cache ---------------------------------------------------------------

def compute_cache(folder: Path, files: int = 6, when: float | None = None) -> int:
    """The layout the driver writes (index + <hex>/<hex>/<hash>); returns its bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index").write_bytes(b"i" * 512)
    total = 512
    for i in range(files):
        digest = f"{i:02x}" + "e0943aa8a566c2"
        (folder / digest[0] / digest[1]).mkdir(parents=True, exist_ok=True)
        (folder / digest[0] / digest[1] / digest[2:16]).write_bytes(b"c" * (1000 + i))
        total += 1000 + i
    if when is not None:
        age(list(folder.rglob("*")), when)
    return total


def test_the_cuda_cache_is_counted_as_one_entry_and_kept_while_used(tmp_path):
    root = tmp_path / "root"
    size = compute_cache(root / "cuda", when=time.time() - DAY)
    info = stats(root)["kinds"]["cuda"]
    assert (info["entries"], info["bytes"], info["broken"]) == (1, size, 0)
    assert info["by_function"][0]["name"] == "ComputeCache"
    report = prune_json(root, "--kind", "cuda", "--max-age", "30d")["cuda"]
    assert report["entries_removed"] == 0 and (root / "cuda" / "index").exists()


def test_the_cuda_cache_goes_whole_when_unused_too_long_or_too_big(tmp_path):
    root = tmp_path / "root"
    compute_cache(root / "cuda", when=OLD)
    report = prune_json(root, "--kind", "cuda", "--max-age", "30d")["cuda"]
    assert report["entries_removed"] == 1 and report["errors"] == []
    assert sorted(p.name for p in (root / "cuda").iterdir()) == [".gpu-cache-trash"]
    assert list((root / "cuda" / ".gpu-cache-trash").iterdir()) == []
    size = compute_cache(root / "cuda")  # in use now, but over the cap
    report = prune_json(root, "--kind", "cuda", "--max-size", str(size - 1))["cuda"]
    assert report["entries_removed"] == 1 and not (root / "cuda" / "index").exists()


def test_a_cuda_cache_of_another_layout_is_counted_and_never_removed(tmp_path):
    root = tmp_path / "root"
    size = compute_cache(root / "cuda", when=OLD)
    (root / "cuda" / "notes.txt").write_text("not the driver's")
    age([root / "cuda" / "notes.txt"])
    info = stats(root)["kinds"]["cuda"]
    assert info["entries"] == 1 and info["bytes"] == size + len("not the driver's")
    assert "layout not recognised" in info["by_function"][0]["name"]
    report = prune_json(root, "--kind", "cuda", "--max-age", "1d", "--max-size", "0")["cuda"]
    assert report["entries_removed"] == 0
    assert (root / "cuda" / "index").exists() and (root / "cuda" / "notes.txt").exists()
