"""Entries set aside in the root are dropped from the node-local tier (issue 40): the startup
hook's tier, in real processes over a real local tier, applies the root's set-aside lists once
per node (docs/outputs.md). The whole path (a wrong entry fetched into the tier, validation,
the next job compiling it) is tests/test_outputs_proof.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpu_cache.core import set_aside
from helpers import HOOK, clean_environ

KINDS = ("jax", "triton", "inductor", "jax_triton")
#: A process whose tier looks at each kind once, as a job's first use of each does.
FIRST_USE = ("import json, gpu_cache_hook.tier\n"
             "tier = gpu_cache_hook.tier.get()\n"
             f"print(json.dumps({{k: [tier.enabled(k), tier.record(k)] for k in {KINDS!r}}}))\n")


def job(root: Path, local: Path) -> dict:
    """A process of a job on this node: what its tier dropped per kind."""
    environ = clean_environ(PYTHONPATH=str(HOOK), GPU_CACHE_TIER=str(local), GPU_CACHE_SHARED=str(root))
    done = subprocess.run([sys.executable, "-c", FIRST_USE], env=environ, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and not done.stderr, done.stderr[-3000:]
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
