"""The registry of cache kinds is the one source every module and the startup hook read."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys

from gpu_cache._hook.gpu_cache_hook.names import Facts
from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds, software
from gpu_cache.jobenv import env
from helpers import REPO, SCRIPTS, clean_environ, hook_piece, run_cli, write_config

HOOK = SCRIPTS / "gpu_cache" / "_hook"


def test_each_piece_is_a_registered_kinds_and_the_host_reads_its_facts():
    """One name per kind on both sides: each piece of the startup hook is named as a registered
    kind (the autotune kind's piece was ``tokamax``, and a check of the facts skipped it), and
    every kind but the hook's own records has one. The host's kind takes its job-side facts from
    it (what it watches, its tier layout, its node-local folders, its software) and declares
    none of them again; each tier layout is one the bound knows."""
    pieces = {piece.kind: piece for piece in hook_piece("names").pieces()}
    assert sorted(pieces) == sorted(kind.name for kind in kinds.ALL if kind.name != "records")
    for kind in kinds.ALL:
        declared = pieces.get(kind.name)
        assert vars(kind.piece) == (vars(declared) if declared else vars(Facts(kind.name))), kind.name
    layouts = hook_piece("tier.bound").LAYOUTS
    assert all(words[0] in layouts for piece in pieces.values() for words in piece.tier)
    assert software.key_fields() == ("python", *dict.fromkeys(n for p in pieces.values() for n in p.software))
    assert software.IMAGE_VARIABLES == hook_piece("names").IMAGE_VARIABLES


def test_every_folder_env_may_hand_out_as_node_local_is_judged_on_every_node(tmp_path):
    """``gpu-cache env`` sends a kind it cannot switch off to ``$TMPDIR/gpu-cache-<uid>/<kind>``
    where the root cannot be used; its exports reach other nodes, where another account may
    have made that folder first. So each such variable is one the startup hook's guard judges on
    every node: a piece declares it ``node-local`` (or it is the hook's own: records, locks), and
    env hands out no other (``_unjudged``): so every such kind has a piece that declares it. Every
    kind, every opt-in on, through the real command (no kind listed here). Guard: the pieces'
    ``node-local`` facts (without them: vllm's and autotune's variables failed here)."""
    site = hook_piece("names")
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
    judged |= {site.RECORDS_VAR, site.LOCKS_VAR}  # the hook's own (gpu_cache_hook.start judges them)
    # every kind that cannot be switched off goes node-local (env refuses a folder no piece judges)
    assert {kind.env_var for kind in kinds.EXPORTED if kind.switch_off is None} <= set(handed), handed
    assert [name for name in handed if name not in judged] == []


def test_no_shared_module_of_the_hook_names_a_kind():
    """The hook's shared code (sitecustomize, records, the tier and its bound, trust, flight...)
    loops over the pieces' declared facts: no string in it (docstrings aside) is a kind's name
    or a piece's module, and no piece is imported by a name built from a kind's. (The records
    kind aside: the hook writes records itself, and "records" is a word of several formats.)"""
    names = {kind.name for kind in kinds.ALL} | {piece.kind for piece in hook_piece("names").pieces()}
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


def test_each_pieces_modules_name_its_kind_as_the_registry_does():
    """The part of the record a piece writes, and the kind it single-flights and tiers, is its
    ``KIND``: in each module of a piece that keeps one, it is the piece's name, which is the
    registry's (the host reads the part by the kind's name)."""
    found = {}
    for path in sorted((HOOK / "gpu_cache_hook" / "kinds").rglob("*.py")):
        piece = path.relative_to(HOOK / "gpu_cache_hook" / "kinds").parts[0].removesuffix(".py")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["KIND"]:
                found[str(path.relative_to(HOOK))] = (ast.literal_eval(node.value), piece)
    assert len(found) >= 10, found
    assert {where: (kind, piece) for where, (kind, piece) in found.items()
            if kind != piece or piece not in kinds.KINDS} == {}


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


def test_every_kind_is_in_each_file_the_recipe_names():
    """A kind is its two modules and a line in each file the recipe of docs/kinds.md names; a
    kind missing from one of them fails here (the README's summary of a run, the schema and
    config/README.md for an opt-in or an observed kind, docs/observe.md's two tables, its name
    in ``core.names``, its example entry), and the recipe names each of those files."""
    from gpu_cache.config.settings import load_schema
    from gpu_cache.core import names

    readme, config = (REPO / "README.md").read_text(), (REPO / "config" / "README.md").read_text()
    observe = (REPO / "docs" / "observe.md").read_text()
    schema = load_schema()["properties"]
    expects = re.search(r"`expects`: the cache kinds it compiles for \(([^)]*)\)", config)
    variables = {value for value in vars(names).values() if isinstance(value, str)}
    missing = []
    for kind in kinds.ALL:
        where = {"README.md's summary": f"\n  {kind.name} cache: " in readme,
                 "docs/observe.md's tables": observe.count(f"\n| `{kind.name}` | ") == 2,
                 "core/names.py": kind.env_var in variables,
                 "tests/kind_examples": (REPO / "tests" / "kind_examples" / f"{kind.name}.py").is_file()}
        if kind.enabled_by:
            where["the schema's opt-in"] = kind.enabled_by in schema
            where["config/README.md's opt-in"] = f"| `{kind.enabled_by}` |" in config
        if kind.observed:
            where["config/README.md's expects"] = f"`{kind.name}`" in expects.group(1)
        missing += [f"{kind.name}: {place}" for place, there in where.items() if not there]
    assert missing == []
    recipe = (REPO / "docs" / "kinds.md").read_text().split("## The recipe")[1].split("\n## ")[0]
    named = ("core/kinds/<kind>.py", "_hook/gpu_cache_hook/kinds/<kind>.py", "core/names.py",
             "gpu_cache_hook/names.py", "config.schema.yaml", "config/README.md", "README.md",
             "docs/observe.md", "tests/kind_examples/<kind>.py")
    assert [name for name in named if name not in recipe] == []


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
    loaded on use (imported as a kind, the part has no KIND: every command would fail), the
    host takes the kind as observed from its piece alone (the kind declares nothing of the job
    side), env gives it no node-local folder where its piece does not judge one on each node,
    and the startup hook watches the module its piece names and records the kind's part.
    Guards: the registry's ``_found``, ``Kind.piece``, env's ``_unjudged`` (without it:
    ``$TMPDIR/gpu-cache-<uid>/dropped_in``, which no node judged) and the hook's ``pieces``."""
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
    observed = subprocess.run([sys.executable, "-c", "from gpu_cache.core import kinds; "
                               "print(' '.join(kinds.names_of(kinds.OBSERVED)))"],
                              env=copy, capture_output=True, text=True)
    assert sorted(observed.stdout.split()) == sorted([*kinds.names_of(kinds.OBSERVED), "dropped_in"]), \
        observed.stderr
    (tmp_path / "a file").write_text("")
    done = run_cli("env", "--json", "--cache-root", str(tmp_path / "a file" / "root"),
                   env=copy | {"TMPDIR": str(tmp_path)})
    exports, problems = json.loads(done.stdout)["exports"], json.loads(done.stdout)["problems"]
    assert "DROPPED_IN_DIR" not in exports and exports["NUMBA_CACHE_DIR"].startswith(str(tmp_path))
    assert problems["dropped_in"].endswith("no node-local fallback: the startup hook's piece of dropped_in "
                                           "does not judge DROPPED_IN_DIR on each node")
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


# --- the shared lists are the pieces' facts, which records, doctor, references and the runner loop over


def test_doctor_and_a_mismatch_name_the_software_every_piece_declares(tmp_path):
    """The key fields are Python and every piece's software: doctor shows them all, with the
    key environment the pieces declare, and a job whose numba or tokamax differs from what
    warmed the cache is a mismatch (before: a list of six fields that lacked both, and doctor's
    third list). Guard: ``software.key_fields``."""
    done = run_cli("doctor", "--json", "--cache-root", str(tmp_path / "root"))
    report = json.loads(done.stdout)
    fields = ("python", *dict.fromkeys(n for piece in hook_piece("names").pieces() for n in piece.software))
    assert tuple(report["versions"]) == fields and {"numba", "tokamax", "jax-triton"} <= set(fields)
    assert tuple(report["key_environment"]) == kinds.KEY_ENVIRONMENT
    assert {"XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "CUDA_VISIBLE_DEVICES", "TRITON_DEFAULT_FP_FUSION"} <= \
        set(kinds.KEY_ENVIRONMENT)
    warmed, ran = {"numba": "0.68.1", "tokamax": "0.0.12"}, {"numba": "0.67.0", "tokamax": "0.0.13"}
    assert software.differences(warmed, ran) == ["tokamax", "numba"]


def test_the_references_are_kept_apart_by_what_changes_what_is_computed(tmp_path):
    """The outputs proof's references are kept apart by the pieces' ``key-environment`` (XLA's
    flags, Triton's fp fusion) and not by their ``place-environment`` (where the cache is, which
    of the node's GPUs ran): a validate run in the node-local tier compares with the warm run's."""
    from gpu_cache.core import references

    def folder(**environ: str):
        return references.folder_of(tmp_path, "fingerprint", environ)

    assert folder() == folder(JAX_COMPILATION_CACHE_DIR="/tier/jax", CUDA_VISIBLE_DEVICES="1")
    assert folder() != folder(XLA_FLAGS="--xla_gpu_autotune_level=0") != folder(TRITON_DEFAULT_FP_FUSION="0")


def test_the_cold_pass_runs_every_tool_without_its_cache(tmp_path):
    """The runner's honest cold baseline: every exported kind switched off or in the empty
    scratch folder, and what a piece declares ``cold`` set: the CUDA driver's cache, which an
    empty folder would still serve to the pass's later processes. Guard: ``cold_environ``'s
    loop over the pieces' ``cold`` facts (it was a constant of the runner)."""
    from gpu_cache.core.runner import cold_environ

    environ = cold_environ({"CUDA_CACHE_DISABLE": "0"}, tmp_path)
    assert environ["CUDA_CACHE_DISABLE"] == "1"
    for kind in kinds.EXPORTED:
        assert environ[kind.switch_off[0]] == kind.switch_off[1] if kind.switch_off else \
            environ[kind.env_var] == str(tmp_path / kind.name), kind.name
