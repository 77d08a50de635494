"""The hook's keyed build folders (``_hook/gpu_cache_hook/builds.py``) are a layout any piece
takes, as the host's kinds take theirs (issue 56): a piece of another tool that builds a library
per key (FlashInfer-like) subclasses ``KeyedBuild`` with its build, load and library, and gets
whole entries, hits in later processes and a rebuild of a damaged one, without copying torch
extensions' code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import HOOK, clean_environ

#: A piece of a tool of its own: it "builds" a library whose bytes are its source's, when a process
#: imports colorsys (which no process imports at start), through the hook's keyed build folders.
TOY_PIECE = '''# gpu-cache hook piece
# watches colorsys
import os

from .. import builds

KIND = "toy_builds"


class _Toy(builds.KeyedBuild):
    kind = KIND

    def build(self):
        with open(os.path.join(self.temp, "libtoy.so"), "w") as library:
            library.write(os.environ["TOY_SOURCE"])

    def load(self, where):
        with open(os.path.join(where, "libtoy.so")) as library:
            return library.read()

    def library(self):
        return "libtoy.so"


def on_import(module, hook):
    hook.observed(KIND)
    stats = hook.parts.setdefault(KIND, {"hits": 0, "misses": 0, "waited": 0, "compile_seconds": 0.0,
                                         "saved_seconds": 0.0, "hit_keys": [], "missed": [],
                                         "dropped": {"hit_keys": 0, "missed": 0}})
    temp = builds.hand_out(KIND, os.environ["TOY_DIR"], "toy", stats, hook)
    _ours, team = builds.handed(temp)
    build = _Toy(temp, team, hook)
    build.keyed("toy", {"source": os.environ["TOY_SOURCE"]})
    module.toy_loaded = build.serve(stats)


def section(hook):
    return hook.parts.get(KIND)
'''


def test_a_piece_of_another_tool_keeps_its_builds_whole_through_the_shared_layout(tmp_path):
    hook = tmp_path / "hook"
    shutil.copytree(HOOK, hook, ignore=shutil.ignore_patterns("__pycache__"))
    (hook / "gpu_cache_hook" / "kinds" / "toy_builds.py").write_text(TOY_PIECE)
    folder, records = tmp_path / "toy", tmp_path / "records"

    def job(source: str) -> dict:
        done = subprocess.run([sys.executable, "-c", "import colorsys; print(colorsys.toy_loaded)"],
                              env=clean_environ(PYTHONPATH=str(hook), GPU_CACHE_RECORDS=str(records),
                                                TOY_DIR=str(folder), TOY_SOURCE=source),
                              capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stderr, done.stdout) == (0, "", f"{source}\n")
        newest = max(records.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        record = json.loads(newest.read_text())
        newest.unlink()
        return record["toy_builds"]

    first, again = job("one"), job("one")
    assert (first["misses"], first["hits"], again["misses"], again["hits"]) == (1, 0, 0, 1)
    (entry,) = [p for p in folder.iterdir() if p.name.startswith("toy-")]
    assert sorted(p.name for p in entry.iterdir()) == ["gpu-cache-build.json", "libtoy.so"]
    assert job("two")["misses"] == 1 and len(list(folder.glob("toy-*"))) == 2  # another key
    (entry / "libtoy.so").chmod(0o644)
    (entry / "libtoy.so").write_text("ONE")  # the same size, other bytes: not as built
    damaged = job("one")
    assert (damaged["misses"], damaged["missed"][0]["why"]) == (1, "its library is not as built")
    assert Path(entry / "libtoy.so").read_text() == "one" and job("one")["hits"] == 1
