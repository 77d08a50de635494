"""Entries set aside in the root are dropped from the node-local tier (issue 40): the startup
hook's tier, in real processes over a real local tier, applies the root's set-aside lists once
per node (docs/outputs.md). The whole path (a wrong entry fetched into the tier, validation,
the next job compiling it) is tests/test_outputs_proof.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_cache.core import set_aside
from helpers import HOOK, clean_environ

KINDS = ("jax", "triton", "inductor", "jax_triton")
#: A process whose tier looks at each kind once, as a job's first use of each does.
FIRST_USE = ("import json, sys, gpu_cache_hook.tier\n"
             "def warn(what, exc, off=False):\n"  # (the startup hook's warn prints one such line)
             "    print(f'gpu-cache: warning: {what}: {exc}', file=sys.stderr)\n"
             "tier = gpu_cache_hook.tier.get(warn)\n"
             f"print(json.dumps({{k: [tier.enabled(k), tier.record(k)] for k in {KINDS!r}}}))\n")


def job(root: Path, local: Path, warnings: list[str] | None = None) -> dict:
    """A process of a job on this node: what its tier dropped per kind (its warning lines go to
    ``warnings``; without it, it must print none)."""
    environ = clean_environ(PYTHONPATH=str(HOOK), GPU_CACHE_TIER=str(local), GPU_CACHE_SHARED=str(root))
    done = subprocess.run([sys.executable, "-c", FIRST_USE], env=environ, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and (warnings is not None or not done.stderr), done.stderr[-3000:]
    if warnings is not None:
        warnings += done.stderr.splitlines()
    found = json.loads(done.stdout)
    assert all(on for on, _ in found.values()), found
    return {kind: record["set_aside"] for kind, (_, record) in found.items()}


def files(folder: Path) -> set[str]:
    """The copies in a local tier (its marks left out)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if not p.is_dir() and not p.name.startswith(".gpu-cache-set-aside.")}


def test_each_node_drops_its_copies_of_what_was_set_aside_once_and_keeps_the_rest(tmp_path):
    root, local = tmp_path / "root", tmp_path / "local"
    for kind in KINDS:
        (root / kind).mkdir(parents=True)
    copies = {"jax/jit_f-1a2b-cache", "jax/jit_f-1a2b-atime", "jax/jit_g-3c4d-cache",
              "triton/KEYA/__grp__k.json", "triton/KEYA/k.cubin", "triton/KEYB/k.cubin",
              "inductor/fxgraph/ab/fGRAPH1/x", "inductor/fxgraph/ab/fGRAPH2/x", "inductor/ab/code.py",
              "jax_triton/kernel1", "jax_triton/kernel2"}
    for name in copies:
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text(name)
    outside = tmp_path / "yours"
    outside.write_text("not the tier's")
    (local / "jax" / "jit_h-5e6f-cache").symlink_to(outside)  # a link is removed, never followed

    assert job(root, local) == dict.fromkeys(KINDS, 0)  # nothing set aside: nothing dropped
    for kind, keys in (("jax", ["jit_f-1a2b", "jit_h-5e6f"]), ("triton", ["KEYA"]),
                       ("inductor", ["fGRAPH1"]), ("jax_triton", ["kernel1"])):
        set_aside.tell_tiers(root, kind, keys)
    assert job(root, local) == {"jax": 2, "triton": 1, "inductor": 1, "jax_triton": 1}
    assert files(local) == {"jax/jit_g-3c4d-cache", "triton/KEYB/k.cubin", "inductor/fxgraph/ab/fGRAPH2/x",
                            "inductor/ab/code.py", "jax_triton/kernel2"}
    assert outside.read_text() == "not the tier's"

    # A key compiled (or fetched) again after this node applied the list is that node's to keep.
    (local / "jax" / "jit_f-1a2b-cache").write_text("compiled again")
    assert job(root, local) == dict.fromkeys(KINDS, 0)
    set_aside.tell_tiers(root, "jax", ["jit_g-3c4d"])  # a later set-aside: only its own keys
    assert job(root, local)["jax"] == 1
    assert (local / "jax" / "jit_f-1a2b-cache").read_text() == "compiled again"
    assert not (local / "jax" / "jit_g-3c4d-cache").exists()
    marks = sorted(p.name for p in local.iterdir() if p.name.startswith(".gpu-cache-set-aside.jax."))
    assert len(marks) == 1  # the mark of the list as it is now replaced the earlier one


def test_a_second_set_aside_adds_to_what_a_node_has_not_applied_yet(tmp_path):
    """Two validations set entries aside while the node ran no job: its next job drops both."""
    root, local = tmp_path / "root", tmp_path / "local"
    (root / "jax").mkdir(parents=True)
    for name in ("jit_f-1a2b-cache", "jit_g-3c4d-cache", "jit_h-5e6f-cache"):
        (local / "jax").mkdir(parents=True, exist_ok=True)
        (local / "jax" / name).write_text(name)
    set_aside.tell_tiers(root, "jax", ["jit_f-1a2b"])
    set_aside.tell_tiers(root, "jax", ["jit_g-3c4d"])
    assert job(root, local)["jax"] == 2
    assert files(local) == {"jax/jit_h-5e6f-cache"}


def test_a_list_stays_bounded_and_keeps_every_key_a_node_has_not_applied(tmp_path, monkeypatch):
    """300 validations set aside the same 30 keys over and over: the list holds each key once
    (in the latest record that named it), so a node that applied nothing still drops all 30,
    and a node that applied the list half way drops the 10 set aside again after, and keeps
    the copies it fetched since of the others. A list over its bound loses its oldest records only."""
    root = tmp_path / "root"
    (root / "jax").mkdir(parents=True)
    keys = [f"jit_k{i}-{i:04x}" for i in range(30)]
    fresh, halfway = tmp_path / "fresh", tmp_path / "halfway"
    for local in (fresh, halfway):
        (local / "jax").mkdir(parents=True)
    for n in range(300):  # the first 150 name all 30 keys, the last 150 the first 10 only
        set_aside.tell_tiers(root, "jax", [keys[n % 30] if n < 150 else keys[n % 10]])
        if n == 149:
            assert job(root, halfway)["jax"] == 0  # it holds no copy yet: it only marks the list applied
            for key in keys:
                (halfway / "jax" / f"{key}-cache").write_text("fetched after it applied the list")
    size = (root / "state" / "set-aside-jax.json").stat().st_size
    listed = json.loads((root / "state" / "set-aside-jax.json").read_text())["records"]
    assert sorted(k for r in listed for k in r["keys"]) == sorted(keys) and size < 4096, listed
    for key in keys:
        (fresh / "jax" / f"{key}-cache").write_text("fetched before")
    assert job(root, fresh)["jax"] == 30
    assert job(root, halfway)["jax"] == 10
    assert sorted(p.name for p in (halfway / "jax").iterdir()) == sorted(f"{k}-cache" for k in keys[10:])

    monkeypatch.setattr(set_aside, "LIST_BOUND", 600)
    for n in range(40):
        set_aside.tell_tiers(root, "jax", [f"jit_new{n}-{n:04x}"])
    listed = json.loads((root / "state" / "set-aside-jax.json").read_text())["records"]
    assert len(json.dumps({"records": listed})) <= 600 and listed[-1]["keys"] == ["jit_new39-0027"]


@pytest.mark.skipif(os.geteuid() != 0, reason="useradd, chown and runuser need root")
def test_a_list_another_account_may_have_written_is_not_applied(base, private_user, tmp_path):
    """A list left owned by another account, then a state folder of that account with a list it
    wrote itself: the node drops none of its copies, and says so in one warning line a process."""
    root, local = base / "root", tmp_path / "local"
    (root / "jax").mkdir(parents=True)
    (local / "jax").mkdir(parents=True)
    copies = {f"jax/jit_f{i}-{i:04x}-cache" for i in range(3)}
    for name in copies:
        (local / name).write_text(name)
    set_aside.tell_tiers(root, "jax", ["jit_f0-0000"])
    listed = root / "state" / "set-aside-jax.json"
    shutil.chown(listed, user=private_user, group=private_user)
    warnings: list[str] = []
    assert job(root, local, warnings)["jax"] == 0 and files(local) == copies
    assert len(warnings) == 1 and f"{listed} is owned by uid" in warnings[0], warnings

    shutil.chown(root / "state", user=private_user, group=private_user)
    theirs = base / "theirs.json"
    theirs.write_text(json.dumps({"records": [{"id": "x", "keys": ["jit_f1-0001", "jit_f2-0002"]}]}))
    theirs.chmod(0o644)
    listed.unlink()
    done = subprocess.run(["runuser", "-u", private_user, "--", "cp", str(theirs), str(listed)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    warnings.clear()
    assert job(root, local, warnings)["jax"] == 0 and files(local) == copies
    assert len(warnings) == 1 and f"{root / 'state'} is owned by uid" in warnings[0], warnings
