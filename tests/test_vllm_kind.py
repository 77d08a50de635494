"""vLLM's cache root as a kind of its own (issue 31): exported under the cache root, counted by
stats with one entry per torch.compile hash folder, pruned whole.

vLLM is not installed here (it needs a GPU build of torch): the tests write the layout vLLM's
docs and ``vllm/compilation/backends.py`` describe (``torch_compile_cache/<hash>/rank_<i>_<j>/
<model part>/`` with its ``vllm_compile_cache.py`` index and the compiled files beside it).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from helpers import clean_environ, run_cli

DAY = 86400.0
OLD = time.time() - 40 * DAY


def engine_folder(root: Path, digest: str, ranks: int = 1, when: float | None = None) -> int:
    """One engine's torch.compile folder; returns its bytes."""
    total = 0
    for rank in range(ranks):
        part = root / "vllm" / "torch_compile_cache" / digest / f"rank_{rank}_0" / "backbone"
        (part / "inductor_cache" / "ab").mkdir(parents=True)
        for name, size in (("vllm_compile_cache.py", 300), ("computation_graph.py", 2000),
                           ("inductor_cache/ab/cabc.py", 5000)):
            (part / name).write_bytes(b"x" * size)
            total += size
    if when is not None:
        for path in (root / "vllm" / "torch_compile_cache" / digest).rglob("*"):
            os.utime(path, (when, when), follow_symlinks=False)
    return total


def cli_json(*args: str) -> dict:
    done = run_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_env_exports_vllms_cache_root_under_the_root(tmp_path):
    done = run_cli("env", "--json", "--cache-root", str(tmp_path / "root"), env=clean_environ())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["exports"]["VLLM_CACHE_ROOT"] == str(tmp_path / "root" / "vllm")


def test_each_engine_folder_is_one_entry_and_prune_removes_the_old_one_whole(tmp_path):
    root = tmp_path / "root"
    old = engine_folder(root, "1517964802", ranks=2, when=OLD)
    new = engine_folder(root, "2a7c00f1aa")
    (root / "vllm" / "modelinfos").mkdir()
    (root / "vllm" / "modelinfos" / "llama.json").write_text("{}")
    info = cli_json("stats", "--cache-root", str(root))["kinds"]["vllm"]
    assert (info["entries"], info["bytes"], info["broken"]) == (3, old + new + 2, 0)
    names = {f["name"] for f in info["by_function"]}
    assert "torch.compile 1517964802 (rank_0_0, rank_1_0)" in names

    report = cli_json("prune", "--cache-root", str(root), "--kind", "vllm", "--max-age", "30d")["vllm"]
    assert report["entries_removed"] == 1 and report["bytes_removed"] == old and report["errors"] == []
    compile_cache = root / "vllm" / "torch_compile_cache"
    assert sorted(p.name for p in compile_cache.iterdir()) == ["2a7c00f1aa"]
    assert (compile_cache / "2a7c00f1aa" / "rank_0_0" / "backbone" / "vllm_compile_cache.py").exists()


@pytest.mark.parametrize("inner", ["torch_compile_cache", "torch_compile_cache/1517964802/rank_0_0"])
def test_a_folder_vllm_writes_into_that_another_user_owns_is_refused(base, inner):
    root = base / "root"
    engine_folder(root, "1517964802")
    exported = cli_json("env", "--cache-root", str(root))
    assert exported["exports"]["VLLM_CACHE_ROOT"] == str(root / "vllm") and "vllm" not in exported["problems"]
    planted = root / "vllm" / inner
    os.chown(planted, pwd.getpwnam("nobody").pw_uid, -1)
    planted.chmod(0o777)
    plant = subprocess.run(["runuser", "-u", "nobody", "--", "touch", str(planted / "planted.py")],
                           capture_output=True, text=True)
    assert plant.returncode == 0, plant.stderr  # the attack is real: nobody adds a file vLLM reads
    exported = cli_json("env", "--cache-root", str(root))
    assert exported["exports"]["VLLM_CACHE_ROOT"] != str(root / "vllm")
    assert f"{planted} is owned by nobody" in exported["problems"]["vllm"]
    doctor = run_cli("doctor", "--cache-root", str(root), env=clean_environ())
    assert doctor.returncode == 1 and f"vllm: PROBLEM: {planted} is owned by nobody" in doctor.stdout
