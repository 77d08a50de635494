"""Python's own bytecode as an opt-in cache kind: one folder per interpreter and image, written
even where the image forbids bytecode, counted and pruned like the other kinds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HOOK, SCRIPTS, clean_environ, run_cli, write_config

#: Prints where the module's bytecode is and the value it holds.
IMPORT = "import sys, mymod; print(mymod.__cached__, mymod.X, sys.dont_write_bytecode)"


def bytecode_env(root: Path, code: Path, **extra: str) -> dict[str, str]:
    """A job's environment with the bytecode cache on, as `gpu-cache env` exports it, in an
    image that forbids bytecode (PYTHONDONTWRITEBYTECODE=1)."""
    return clean_environ(GPU_CACHE_BYTECODE=str(root / "bytecode"), PYTHONDONTWRITEBYTECODE="1",
                         PYTHONPATH=os.pathsep.join([str(HOOK), str(code), str(SCRIPTS)]), **extra)


def run(python: str, env: dict[str, str]) -> list[str]:
    done = subprocess.run([python, "-c", IMPORT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def write_module(code: Path, value: int, mtime: int = 1_000_000_000) -> None:
    """mymod.py holding X = value, with a fixed mtime and size, as a reproducible image has."""
    code.mkdir(exist_ok=True)
    source = code / "mymod.py"
    source.write_text(f"X = {value}\n")
    os.utime(source, (mtime, mtime))


def test_off_by_default_and_exported_when_asked(tmp_path):
    off = json.loads(run_cli("env", "--json", "--cache-root", str(tmp_path)).stdout)["exports"]
    assert "GPU_CACHE_BYTECODE" not in off
    config = write_config(tmp_path / "c.yaml", {"bytecode_cache": True})
    on = json.loads(run_cli("env", "--json", "--config", str(config), "--cache-root", str(tmp_path)).stdout)
    assert on["exports"]["GPU_CACHE_BYTECODE"] == str(tmp_path / "bytecode")
    assert str(HOOK) in on["exports"]["PYTHONPATH"]


def test_bytecode_is_written_where_the_image_forbids_it_and_read_back(tmp_path):
    code = tmp_path / "code"
    write_module(code, 1)
    env = bytecode_env(tmp_path, code)
    cached, value, forbidden = run(sys.executable, env)
    assert Path(cached).is_relative_to(tmp_path / "bytecode") and Path(cached).is_file()
    assert (value, forbidden) == ("1", "False")
    written = Path(cached).stat().st_mtime_ns
    assert run(sys.executable, env)[0] == cached  # the second process reads it back
    assert Path(cached).stat().st_mtime_ns == written  # and does not write it again
    assert not (code / "__pycache__").exists()  # nothing beside the sources (a read-only image)


def test_each_interpreter_and_image_has_a_folder_of_its_own(tmp_path):
    code = tmp_path / "code"
    write_module(code, 1)
    in_a = run(sys.executable, bytecode_env(tmp_path, code, APPTAINER_CONTAINER="/images/a.sif"))
    # The same source, rebuilt into another image with the same mtime and size: Python would
    # trust the first image's .pyc; the second image's own folder serves the new source.
    write_module(code, 2)
    in_b = run(sys.executable, bytecode_env(tmp_path, code, APPTAINER_CONTAINER="/images/b.sif"))
    assert Path(in_a[0]).parent != Path(in_b[0]).parent
    assert (in_a[1], in_b[1]) == ("1", "2")
    # The SAME image name rebuilt with normalised mtimes: Python alone would serve its stale
    # bytecode; the hook's .pyc files carry the source's hash, checked at each import (#21).
    rebuilt = run(sys.executable, bytecode_env(tmp_path, code, APPTAINER_CONTAINER="/images/a.sif"))
    assert rebuilt == [in_a[0], "2", "False"]


@pytest.mark.slow
def test_stats_count_and_prune_removes_bytecode(tmp_path):
    code = tmp_path / "code"
    write_module(code, 1)
    env = bytecode_env(tmp_path, code)
    cached = Path(run(sys.executable, env)[0])
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(tmp_path)).stdout)
    assert stats["kinds"]["bytecode"]["entries"] >= 1
    pruned = run_cli("prune", "--json", "--kind", "bytecode", "--max-size", "0",
                     "--cache-root", str(tmp_path))
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["bytecode"]["entries_removed"] >= 1 and not cached.exists()
    assert run(sys.executable, env)[1] == "1"  # the next import compiles again
