"""The facts a kind's hook piece declares in its head (gpu_cache_hook/names.py: ``Facts``,
``pieces``), read as a job and the host read them: what each fact line gives, where the facts
end, which modules a process watches, and which entries of the pieces' folder are pieces at all
(nothing there may make the hook fail or wait)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HOOK, hook_piece

HEAD = b"# gpu-cache hook piece\n"


def test_each_fact_line_is_read_up_to_the_first_line_that_is_no_comment():
    facts = hook_piece("names").Facts("k", [
        b"# watches a b", b"# watches-with VAR m1 m2", b"# cold X=1=2 Y=z", b"# tier f layout",
        b"# software numba", b"", b"# watches late"])
    assert (facts.watches, facts.watches_with, facts.cold, facts.tier, facts.software) == (
        ["a", "b"], [("VAR", "m1"), ("VAR", "m2")], [("X", "1=2"), ("Y", "z")], [("f", "layout")],
        ["numba"])  # (a value of cold may hold '=': only the first splits)


def test_a_cold_fact_without_its_value_and_a_word_that_is_no_fact_are_refused():
    names = hook_piece("names")
    with pytest.raises(ValueError, match="not VAR=value"):
        names.Facts("k", [b"# cold X"])
    with pytest.raises(ValueError, match="'watchs', which is no fact"):
        names.Facts("k", [b"# watchs a"])


def test_a_process_watches_its_always_modules_its_own_when_on_and_those_its_variables_name():
    facts = hook_piece("names").Facts("k", [b"# watches-always a", b"# watches b", b"# watches-with V c"])
    assert facts.watched(False, {}) == ["a"]
    assert facts.watched(True, {}) == ["a", "b"]
    assert facts.watched(True, {"V": "/abs"}) == ["a", "b", "c"]
    assert facts.watched(False, {"V": "relative"}) == ["a"]  # (only an absolute folder turns it on)


def test_only_pieces_are_pieces_and_nothing_in_their_folder_makes_the_listing_wait_or_stop(tmp_path):
    """Before the two pieces, in the order listed: a private module, a name that is no
    identifier, a folder named like a module, a FIFO named like one (no writer: an open that
    waits would wait forever), a package folder without its __init__.py, a module without the
    piece line. The listing runs in a process of its own, bounded."""
    kinds = tmp_path / "kinds"
    kinds.mkdir()
    (kinds / "_private.py").write_bytes(HEAD + b"# watches x\n")
    (kinds / "a-b.py").write_bytes(HEAD)
    (kinds / "aa.py").mkdir()
    os.mkfifo(kinds / "ab.py")
    (kinds / "ac").mkdir()
    (kinds / "ad.py").write_bytes(b"# watches x\n")
    (kinds / "ok.py").write_bytes(HEAD + b"# watches ok\n")
    (kinds / "pkg").mkdir()
    (kinds / "pkg" / "__init__.py").write_bytes(HEAD + b"# software pkg\n")
    program = ("import json, sys; from gpu_cache_hook import names; "
               "print(json.dumps([(f.kind, f.watches, f.software) for f in names.pieces(sys.argv[1])]))")
    done = subprocess.run([sys.executable, "-c", program, str(kinds)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(HOOK)), timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [["ok", ["ok"], []], ["pkg", [], ["pkg"]]]


def test_every_piece_of_this_hook_is_found(tmp_path):
    """The hook's own folder: a piece per module or package of kinds/ but its private ones."""
    kinds = Path(HOOK) / "gpu_cache_hook" / "kinds"
    expected = sorted(p.name.removesuffix(".py") for p in kinds.iterdir()
                      if not p.name.startswith("_") and (p.suffix == ".py" or (p / "__init__.py").exists()))
    assert [f.kind for f in hook_piece("names").pieces()] == expected
