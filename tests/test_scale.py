"""gpu-cache's own costs: what a dry run re-reads, what ``gpu-cache env`` and the startup hook
load, the last use of a copied cache, and the benchmark that measures them at scale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from gpu_cache.commands.prune import prune
from gpu_cache.config import settings
from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds, verified
from gpu_cache.core.kinds import jax_format as jax_cache
from helpers import HOOK, REPO, SCRIPTS, clean_environ, jax_job_env, run_cli

DAY = 86400.0
HASHES = [f"{i:x}" * 64 for i in range(1, 10)]


def zlib_entry(payload: int = 4000) -> bytes:
    """A -cache file as JAX writes it without zstandard: zlib of a 4-byte compile time and
    the executable."""
    return zlib.compress(b"\0\0\0\1" + os.urandom(payload))


def age(*paths: Path, when: float | None = None) -> None:
    when = time.time() - 2 * 3600 if when is None else when
    for path in paths:
        os.utime(path, (when, when))


def dry_run(root: Path, *args: str) -> dict:
    done = run_cli("prune", "--dry-run", "--json", "--kind", "jax", "--cache-root", str(root), *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["jax"]


def broken_keys(report: dict) -> set[str]:
    return {row["key"] for row in report["removed"] if row["reason"].startswith("broken")}


# --- settings and env: a config that sets nothing skips the schema -----------------------


def test_the_built_in_defaults_are_the_schemas():
    assert settings.fill_defaults(settings.load_schema(), {}) == settings.DEFAULT_CONFIG
    first, second = settings.validate_config({}), settings.validate_config(None)
    assert first == second == settings.DEFAULT_CONFIG
    first["prune"]["max_size"] = "1G"  # a copy: the defaults stay as they are
    assert settings.DEFAULT_CONFIG["prune"]["max_size"] == "10G"


def test_env_without_a_config_loads_neither_jsonschema_nor_yaml_and_says_the_same(tmp_path):
    program = ("import sys\nfrom gpu_cache.cli import main\nmain(sys.argv[1:])\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jsonschema', 'yaml')),"
               " file=sys.stderr)")
    root = str(tmp_path / "root")
    fast = subprocess.run([sys.executable, "-c", program, "env", "--cache-root", root],
                          env=clean_environ(), capture_output=True, text=True, check=True)
    assert fast.stderr.strip().splitlines()[-1] == "[]"
    checked = subprocess.run([sys.executable, "-c", program, "env", "--cache-root", root,
                              "--config-json", '{"stats_hook": true}'],
                             env=clean_environ(), capture_output=True, text=True, check=True)
    assert "jsonschema" in checked.stderr  # a config that sets something is checked
    assert fast.stdout == checked.stdout


def loaded_modules(python: str, environ: dict[str, str]) -> tuple[set[str], bool]:
    """The modules a process of ``python`` has loaded when its program starts, and whether
    gpu-cache's startup hook ran in it (it marks ``sys``)."""
    program = ["-c", "import sys; print(hasattr(sys, '_gpu_cache_startup_hook'), *sorted(sys.modules))"]
    ran, *names = subprocess.run([python, *program], env=environ, capture_output=True, text=True,
                                 check=True).stdout.split()
    return set(names), ran == "True"


@pytest.mark.parametrize("where", ["this interpreter", "a fresh venv"])
def test_the_startup_hook_loads_nothing_into_a_process_without_jax_or_triton(tmp_path, where):
    """The hook's process against a plain one of the same interpreter and venv: it adds its
    own sitecustomize (Debian's Python has one of its own, which the hook runs), its package's
    leaf and start, and at most modules built into the interpreter (atexit: no file is read).
    Both are compared in a fresh venv too, where site imports less than the system Python does
    (a .pth file of its site-packages imports atexit there), as in a newcomer's venv."""
    python = sys.executable
    if where == "a fresh venv":
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                       check=True, capture_output=True)
        python = str(tmp_path / "venv" / "bin" / "python")
    plain, _ = loaded_modules(python, clean_environ())
    hooked, ran = loaded_modules(python, clean_environ(PYTHONPATH=os.pathsep.join([str(HOOK), str(SCRIPTS)]),
                                                       GPU_CACHE_RECORDS=str(tmp_path / "records")))
    assert ran, "the hook did not run"
    added = hooked - plain
    own = {"sitecustomize", "gpu_cache_hook", "gpu_cache_hook.names", "gpu_cache_hook.start"}
    assert added - own <= set(sys.builtin_module_names), sorted(added)
    assert not (tmp_path / "records").exists(), "no record from a process without jax or triton"


# --- the verification record: a later dry run re-reads nothing it verified ----------------


@pytest.fixture
def jax_root(tmp_path) -> Path:
    folder = tmp_path / "root" / "jax"
    folder.mkdir(parents=True)
    for i, digest in enumerate(HASHES[:5]):
        (folder / f"jit_f{i}-{digest}-cache").write_bytes(zlib_entry())
    age(*folder.iterdir())
    return tmp_path / "root"


def corrupt_in_place(path: Path) -> None:
    """Garbage of the same length in the same file (same inode, size and mtime)."""
    info = path.stat()
    with open(path, "r+b") as stream:
        stream.write(os.urandom(info.st_size))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_ino == info.st_ino


def dry_run_here(root: Path) -> dict:
    """A dry run of the JAX kind in this process (so a test can set the recheck budget)."""
    report = prune(settings_from({}, cache_root=str(root)), max_size=1 << 40, max_age=1e9,
                   dry_run=True, only=(kinds.named("jax"),))
    return report.kinds["jax"].as_dict()


def test_a_later_dry_run_decompresses_nothing_it_verified_beyond_its_rechecks(jax_root, monkeypatch):
    """With no recheck budget (a cache far larger than RECHECK_AT_LEAST, seen from one entry),
    an entry verified before is not read again: damage in place that keeps inode, size and mtime
    goes unseen by that run (the rotating rechecks find it: test_prune.py). A copy is another
    file and is read; a broken entry is never recorded as whole."""
    monkeypatch.setattr(verified, "RECHECK_SHARE", 0.0)
    monkeypatch.setattr(verified, "RECHECK_AT_LEAST", 0)
    folder = jax_root / "jax"
    assert broken_keys(dry_run_here(jax_root)) == set()
    record = verified.Record.load(folder)
    assert len(record.known) == 2 * 5, "the dry run recorded the five entries it verified (seal, stamp)"
    victim = folder / f"jit_f0-{HASHES[0]}-cache"
    corrupt_in_place(victim)
    assert broken_keys(dry_run_here(jax_root)) == set(), "the verified entry was not read again"
    # stats verifies nothing, and keeps what the dry runs verified
    assert run_cli("stats", "--cache-root", str(jax_root)).returncode == 0
    assert len(verified.Record.load(folder).known) == 2 * 5
    # A copy is another file (another inode): read again, and found broken.
    shutil.copyfile(victim, folder / "copy")
    os.replace(folder / "copy", victim)
    age(victim)
    assert broken_keys(dry_run_here(jax_root)) == {victim.name[:-len("-cache")]}
    # A broken entry is never recorded as verified: the next dry run still finds it.
    assert broken_keys(dry_run_here(jax_root)) == {victim.name[:-len("-cache")]}
    report = run_cli("prune", "--json", "--kind", "jax", "--cache-root", str(jax_root))
    assert json.loads(report.stdout)["jax"]["entries_removed"] == 1 and not victim.exists()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_verified_root_is_scanned_without_opening_entries(jax_root):
    """With everything verified, stats opens no JAX entry and no Triton manifest; a dry run
    opens no Triton manifest, and reads JAX entries again only for the damage check (#21: in
    turn, within its budget; a root this small is read whole)."""
    triton = jax_root / "triton" / ("A" * 52)
    triton.mkdir(parents=True)
    children = {}
    for suffix in (".source", ".ttir", ".cubin", ".json"):
        (triton / f"k{suffix}").write_text("x")
        children[f"k{suffix}"] = str(triton / f"k{suffix}")
    (triton / "__grp__k.json").write_text(json.dumps({"child_paths": children}))
    args = ["prune", "--dry-run", "--json", "--cache-root", str(jax_root)]
    first = run_cli(*args)
    assert first.returncode == 0 and json.loads(first.stdout)["triton"]["entries_removed"] == 0

    def opened_by(*command: str) -> list[str]:
        log = jax_root.parent / "strace.log"
        traced = subprocess.run(["strace", "-f", "-e", "trace=openat,open", "-o", str(log),
                                 sys.executable, "-m", "gpu_cache", *command],
                                env=clean_environ(), capture_output=True, text=True)
        assert traced.returncode == 0, traced.stderr
        return [line for line in log.read_text().splitlines() if str(jax_root) in line]

    stats = opened_by("stats", "--json", "--cache-root", str(jax_root))
    assert not [line for line in stats if "-cache\"" in line or "__grp__" in line], stats
    dry_run = opened_by(*args)
    assert not [line for line in dry_run if "__grp__" in line], dry_run
    entries = len(list((jax_root / "jax").glob("*-cache")))
    assert len({line for line in dry_run if "-cache\"" in line}) <= entries


def test_a_record_that_is_not_one_counts_as_empty(jax_root):
    folder = jax_root / "jax"
    (folder / verified.NAME).write_bytes(os.urandom(1000))
    victim = folder / f"jit_f1-{HASHES[1]}-cache"
    victim.write_bytes(b"x" * 100)  # does not decompress
    age(victim)
    assert broken_keys(dry_run(jax_root)) == {victim.name[:-len("-cache")]}
    assert verified.Record.load(folder).known, "replaced by a real record"


# --- last use of a copied cache: JAX's -atime records win -----------------------------------

FILL = """
import jax, jax.numpy as jnp, numpy as np
for i in range({n}):
    jax.jit(lambda x, i=i: jnp.cos(x) * (i + 3))(np.ones(32, np.float32)).block_until_ready()
"""


@pytest.mark.slow
def test_a_copied_capped_jax_cache_is_pruned_in_true_lru_order(tmp_path):
    source = tmp_path / "source" / "jax"
    environ = jax_job_env(source, shared_fs=True, JAX_COMPILATION_CACHE_MAX_SIZE=str(1 << 30))
    subprocess.run([sys.executable, "-c", FILL.format(n=5)], env=environ, check=True)
    entries = sorted(jax_cache.scan(source), key=lambda e: e.key)
    assert len(entries) == 5 and all(e.atime_path for e in entries), "a capped cache: -atime each"
    # True last uses, in an order that is not the keys' order; the files' times agree with
    # them, as JAX leaves them.
    now = time.time()
    true_use = {}
    for entry, days in zip(entries, (3, 9, 1, 7, 5), strict=True):
        when = now - days * DAY
        entry.atime_path.write_bytes(int(when * 1e9).to_bytes(8, "little"))
        age(entry.cache_path, entry.atime_path, when=when)
        true_use[entry.key] = when
    copy = tmp_path / "copy" / "jax"
    copy.parent.mkdir()
    subprocess.run(["cp", "-r", str(source), str(copy)], check=True)  # no -p: every mtime is now
    assert all(time.time() - p.stat().st_mtime < 600 for p in copy.iterdir())
    lru = sorted(true_use, key=true_use.get)
    kept = lru[-2:]  # the two most recently used fit the cap
    cap = sum(p.stat().st_size for p in copy.iterdir() if p.name.startswith(tuple(kept)))
    done = run_cli("prune", "--json", "--kind", "jax", "--max-size", str(cap), "--max-age", "30d",
                   "--cache-root", str(copy.parent))
    removed = [row["key"] for row in json.loads(done.stdout)["jax"]["removed"]]
    assert removed == lru[:3], "least recently used first, by the -atime records"
    assert sorted(e.key for e in jax_cache.scan(copy)) == sorted(kept)
    stats = json.loads(run_cli("stats", "--json", "--cache-root", str(copy.parent)).stdout)
    assert abs(stats["kinds"]["jax"]["oldest_use_age_seconds"] - 3 * DAY) < 600


def test_file_times_count_where_the_atime_record_was_not_copied(tmp_path):
    """An -atime whose own mtime agrees with it was not copied: a newer -cache mtime (the
    startup hook marks a hit there even where JAX runs without a cap) is the last use."""
    folder = tmp_path / "jax"
    folder.mkdir()
    now = time.time()
    old, hit = now - 9 * DAY, now - 1 * DAY
    key = f"jit_g-{HASHES[2]}"
    (folder / f"{key}-cache").write_bytes(zlib_entry())
    (folder / f"{key}-atime").write_bytes(int(old * 1e9).to_bytes(8, "little"))
    age(folder / f"{key}-atime", when=old)
    age(folder / f"{key}-cache", when=hit)
    (entry,) = jax_cache.scan(folder)
    assert abs(entry.last_use - hit) < 1 and entry.last_use_source == "-atime"
    age(folder / f"{key}-atime", when=now)  # now the -atime file looks copied: its record wins
    (entry,) = jax_cache.scan(folder)
    assert abs(entry.last_use - old) < 1 and "copied" in entry.last_use_source


# --- the benchmark -------------------------------------------------------------------------


@pytest.mark.slow
def test_the_benchmark_runs_on_a_small_root(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("the benchmark builds a real shared library with g++")
    out = tmp_path / "scale.json"
    done = subprocess.run([sys.executable, str(REPO / "tests" / "benchmarks" / "stats_scale.py"),
                           "--sizes", "entries:400", "--repeats", "1", "--startup-repeats", "2",
                           "--work", str(tmp_path / "work"), "--out", str(out)],
                          env=clean_environ(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    (size,) = result["sizes"]
    assert size["broken_entries_found"] == 0 and size["prune_problems"] == []
    assert set(size["entries_by_kind"]) == set(kinds.names_of(kinds.PRUNABLE))  # a root with every kind
    assert all(size["entries_by_kind"].values())
    assert size["prune_removed"] == size["dry_run_would_remove"] > 0
    timed = {"stats", "stats_json", "prune_dry_run", "prune_dry_run_first", "prune"}
    assert timed <= set(size["ratio_to_walk"])
    assert result["jax_compression"] in ("zstd", "zlib")
    assert {"python_pass", "gpu_cache_env", "python_pass_with_hook"} <= set(result["startup"]["median_ms"])


def test_the_docs_say_where_each_kind_reads_last_use():
    from gpu_cache.core import kinds

    docs = (REPO / "docs" / "observe.md").read_text()
    for name in kinds.names_of(kinds.PRUNABLE):
        assert f"| `{name}` | {kinds.KINDS[name].last_use} |" in docs, name
