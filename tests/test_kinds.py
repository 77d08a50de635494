"""The registry of cache kinds is the one source every module and the startup hook read."""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys

from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds, software
from gpu_cache.jobenv import env
from helpers import SCRIPTS, clean_environ, hook_piece, hook_source, run_cli, write_config

HOOK = SCRIPTS / "gpu_cache" / "_hook"


def test_the_hooks_pieces_declare_what_the_registry_says_of_each_kind():
    """Each kind's hook piece declares, in its first lines, the module the registry says the
    hook watches, and a tier layout the bound knows exactly where the registry says the kind is
    tiered; the distributions whose versions a record keeps are theirs, which the host reads."""
    pieces = {piece.kind: piece for piece in hook_piece("sitecustomize").pieces()}
    for kind in kinds.ALL:
        piece = pieces.get(kind.name)
        if kind.watched_module:
            assert piece is not None and kind.watched_module in piece.watches, kind.name
        assert bool(piece and piece.tier) == kind.tiered, kind.name
    layouts = hook_piece("tier.bound").LAYOUTS
    assert all(words[0] in layouts for piece in pieces.values() for words in piece.tier)
    assert [name for piece in pieces.values() for name in piece.software] == list(software.key_packages())
    assert software.IMAGE_VARIABLES == hook_piece("sitecustomize").IMAGE_VARIABLES


def test_every_folder_env_may_hand_out_as_node_local_is_judged_on_every_node(tmp_path):
    """``gpu-cache env`` sends a kind it cannot switch off to ``$TMPDIR/gpu-cache-<uid>/<kind>``
    where the root cannot be used; its exports reach other nodes, where another account may
    have made that folder first. So each such variable is one the startup hook's guard judges on
    every node: a piece declares it ``node-local`` (or it is the hook's own: records, locks).
    Every kind, every opt-in on, through the real command (no kind listed here). Guard: the
    pieces' ``node-local`` facts (without them: vllm's and autotune's variables failed here)."""
    site = hook_piece("sitecustomize")
    blocker = tmp_path / "a file"
    blocker.write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    config = write_config(tmp_path / "config.yaml", {kind.enabled_by: True for kind in kinds.ALL
                                                     if kind.enabled_by})
    done = run_cli("env", "--json", "--config", str(config), "--cache-root", str(blocker / "root"),
                   env=clean_environ(TMPDIR=str(tmp)))
    assert done.returncode == 0, done.stderr
    local = tmp / f"gpu-cache-{os.getuid()}"
    handed = sorted(name for name, value in json.loads(done.stdout)["exports"].items()
                    if value.startswith(f"{local}{os.sep}"))
    judged = {name for piece in site.pieces() for name in piece.node_local}
    judged |= {name for name, _what in site._OWN_NODE_LOCAL} | {site.LOCKS_VAR}  # (_install's)
    assert len(handed) >= 8, handed  # (every kind that cannot be switched off)
    assert [name for name in handed if name not in judged] == []


def test_no_shared_module_of_the_hook_names_a_kind():
    """The hook's shared code (sitecustomize, records, the tier and its bound, trust, flight...)
    loops over the pieces' declared facts: no string in it (docstrings aside) is a kind's name
    or a piece's module, and no piece is imported by a name built from a kind's. (The records
    kind aside: the hook writes records itself, and "records" is a word of several formats.)"""
    names = {kind.name for kind in kinds.ALL} | {piece.kind for piece in hook_piece("sitecustomize").pieces()}
    names.discard("records")
    found = []
    for path in sorted(HOOK.rglob("*.py")):
        if "kinds" in path.relative_to(HOOK).parts:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value.strip(".")
                if text in names or text.startswith("kinds.") or text.split(".", 1)[0] in names:
                    found.append(f"{path.relative_to(HOOK)}:{node.lineno}: {node.value!r}")
    assert found == []


def test_the_hooks_seal_reader_reads_the_records_prune_writes(tmp_path):
    """The record's format and the seals' key have one home, the hook's seal reader
    (``_hook/gpu_cache_hook/seals.py``), which the host imports: a seal prune records is found by
    the hook, with its value, in a record of many; a record another user may have written seals
    nothing."""
    from gpu_cache.core import verified
    from gpu_cache.core.kinds import integrity
    from helpers import hook_piece

    seals = hook_piece("seals")
    assert integrity.seals.__file__ == seals.__file__
    record = verified.Record(tmp_path)
    for number in range(1000):
        record.put(seals.seal_key(f"{number}", number, number, number), number)
    record.save()
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = seals.Seals(folder)
        assert all(found.sealed(seals.seal_key(f"{n}", n, n, n)) == n for n in range(1000))
        assert found.sealed(seals.seal_key("1000", 1000, 1000, 1000)) is None
        os.chmod(tmp_path / verified.NAME, 0o666)  # another user may have written it: no seals
        assert seals.Seals(folder).sealed(seals.seal_key("1", 1, 1, 1)) is None
    finally:
        os.close(folder)


def test_the_jax_triton_pieces_agree_with_the_registry_and_the_inventory():
    from gpu_cache.core.kinds import jax_triton_format as jax_triton

    def constants(module: str) -> dict:
        tree = ast.parse(hook_source(module).read_text())
        return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(node.value, ast.Constant) and hasattr(t, "id")}

    kind = kinds.KINDS["jax_triton"]
    store, piece = constants("kinds.jax_triton.store"), constants("kinds.jax_triton")
    assert (store["KIND"], store["FORMAT"], store["MEMO_FOLDER"]) == \
        (kind.name, jax_triton.FORMAT, jax_triton.MEMO_FOLDER)
    assert piece["KIND"] == kind.name  # its variable: the hook's names (tests/test_names.py)
    assert jax_triton.ENTRY_LIMIT == 64 << 20  # the store's: written as an expression there
    assert "ENTRY_LIMIT = 64 << 20" in hook_source("kinds.jax_triton.store").read_text()


def test_every_kind_gets_its_variable_and_folder(tmp_path):
    exports = env.resolve(settings_from({"bytecode_cache": True}, cache_root=str(tmp_path)), {})
    for kind in kinds.EXPORTED:
        assert exports.values[kind.env_var] == str(tmp_path / kind.name)
        assert (tmp_path / kind.name).is_dir()


def test_inventoried_kinds_are_the_prunable_and_observed_ones():
    listed = ("jax", "triton", "inductor", "vllm", "bytecode", "cuda", "autotune", "jax_triton", "ptxas",
              "records")
    # in the listed order; the kinds found follow
    assert tuple(kinds.names_of(kinds.PRUNABLE))[:len(listed)] == listed
    # ptxas: recorded from the shim's calls
    observed = [name for name in kinds.names_of(kinds.OBSERVED) if name in listed]
    assert observed == ["jax", "triton", "inductor", "jax_triton", "ptxas"]
    assert all(kind.last_use for kind in kinds.PRUNABLE)


def test_a_workload_may_expect_every_observed_kind_and_no_other():
    """The schema's ``expects`` names exactly the kinds whose requests the hook records (a kind
    it cannot name, or one validation cannot check, is a config mistake only later)."""
    from gpu_cache.config.settings import load_schema

    workload = load_schema()["properties"]["workloads"]["additionalProperties"]["properties"]
    assert workload["expects"]["items"]["enum"] == kinds.names_of(kinds.OBSERVED)


def test_the_kind_interface_stays_small_and_its_facets_are_objects_of_their_own():
    """``Kind`` says what a kind is and what every kind does alike: at most 55 members (the
    names defined on it, ``__x__`` ones aside). What only some kinds do is a facet, an object
    the kind has (``kind.carry``, ``kind.explain``: None where it has none), made for it; the
    carried kinds are those with a carry."""
    members = [name for name in vars(kinds.Kind) if not name.startswith("__")]
    assert len(members) <= 55, members
    assert not [name for name in members if name.startswith(("carry_", "explain_"))]
    for kind in kinds.ALL:
        assert all(facet is None or facet.kind is kind for facet in (kind.carry, kind.explain)), kind
    assert tuple(kind for kind in kinds.ALL if kind.carry is not None) == kinds.CARRIED
    assert kinds.names_of(kinds.CARRIED) and [k for k in kinds.ALL if k.explain is not None]


def test_every_kind_module_is_registered_once():
    """Each module of core/kinds that holds a ``KIND`` is in the registry, once (a kind whose
    module the registry's rule took for another kind's part would be left out)."""
    modules = [p.stem for p in (SCRIPTS / "gpu_cache" / "core" / "kinds").glob("[!_]*.py")]
    held = [getattr(importlib.import_module(f"gpu_cache.core.kinds.{m}"), "KIND", None) for m in modules]
    assert sorted(k.name for k in held if isinstance(k, kinds.Kind)) == sorted(k.name for k in kinds.ALL)
    assert len(set(kinds.KINDS)) == len(kinds.ALL)


#: A kind of its own dropped into a copy of the package: its module, and its hook piece, which
#: watches a standard module no process imports at start.
DROPPED_KIND = '''
from gpu_cache.core.kinds.layouts import SingleFile


class _Dropped(SingleFile):
    name = "dropped_in"
    env_var = "DROPPED_IN_DIR"
    watched_module = "colorsys"
    last_use = "its mtime"

    def _entries(self, folder, grace_seconds, verify_after, record):
        return []


KIND = _Dropped()
'''
DROPPED_PIECE = '''# gpu-cache hook piece
# watches colorsys
def on_import(module, hook):
    hook.observed("dropped_in")
    hook.parts["dropped_in"] = {"hits": 1, "misses": 0, "module": module.__name__}


def section(hook):
    return hook.parts["dropped_in"]
'''


def test_a_kind_added_as_its_modules_alone_is_registered_watched_and_recorded(tmp_path):
    """A copy of the package with one more kind, whose modules are all that is added (its
    kind, its format part beside it, its hook piece): the registry lists it after the listed
    kinds (so env, stats, prune and the contract suite take it) and leaves its part to be
    loaded on use (imported as a kind, the part has no KIND: every command would fail), and
    the startup hook watches the module its piece names and records the kind's part.
    Guards: the registry's ``_found`` and the hook's ``pieces``."""
    package = tmp_path / "scripts" / "gpu_cache"
    shutil.copytree(SCRIPTS / "gpu_cache", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "core" / "kinds" / "dropped_in.py").write_text(DROPPED_KIND)
    (package / "core" / "kinds" / "dropped_in_format.py").write_text('"""The format of its entries."""\n')
    (package / "_hook" / "gpu_cache_hook" / "kinds" / "dropped_in.py").write_text(DROPPED_PIECE)
    copy = clean_environ(PYTHONPATH=str(tmp_path / "scripts"))
    listed = subprocess.run([sys.executable, "-c", "from gpu_cache.core import kinds; "
                             "print(' '.join(k.name for k in kinds.ALL))"],
                            env=copy, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    listed = listed.stdout.split()
    assert [name for name in listed if name != "dropped_in"] == [k.name for k in kinds.ALL]
    assert listed.index("dropped_in") >= 10  # after the listed kinds (the found ones: by name)
    stats = subprocess.run([sys.executable, "-m", "gpu_cache", "stats", "--json", "--cache-root",
                            str(tmp_path / "root")], env=copy, capture_output=True, text=True)
    assert stats.returncode == 0, stats.stderr
    assert "dropped_in" in json.loads(stats.stdout)["kinds"]
    records = tmp_path / "records"
    job = clean_environ(PYTHONPATH=str(package / "_hook"), GPU_CACHE_RECORDS=str(records))
    for program in ("pass", "import colorsys"):
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=job)
        assert done.returncode == 0 and not done.stderr, done.stderr
    (record,) = [json.loads(p.read_text()) for p in records.glob("*.json")]
    assert record["libraries"] == ["dropped_in"]
    assert record["dropped_in"] == {"hits": 1, "misses": 0, "module": "colorsys"}
