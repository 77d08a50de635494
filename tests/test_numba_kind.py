"""Numba's on-disk cache as a kind (docs/kinds.md's recipe, both halves): with gpu-cache's
environment a ``@njit(cache=True)`` function compiled by one process is served to the next from
``$NUMBA_CACHE_DIR`` under the cache root; the startup hook records the miss, then the hit, by
the key gpu-cache's inventory gives the entry; prune removes it whole.

Numba's files are pickles: the hook judges each before numba unpickles it (another account's
pickle, one that account could have rewritten, one in a folder others may write: never loaded,
the job still right), a damaged entry of the user's own is a miss (set aside, compiled again),
and prune and ``doctor --fix`` find a file cut short or emptied without unpickling it. Each
attack's "pickle" makes a folder when unpickled: that folder never appears."""

from __future__ import annotations

import json
import os
import pickle
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flight_jobs import job_env
from gpu_cache.config.settings import settings_from
from gpu_cache.core import kinds
from gpu_cache.jobenv import env as jobenv
from helpers import HOOK, clean_environ, records, run_cli_here

pytest.importorskip("numba")

KIND = kinds.named("numba")
#: A job: one cached function, called with two signatures (two overloads of one entry).
JOB = '''
import json, sys
import numba

@numba.njit(cache=True)
def triangle(n):
    total = 0
    for i in range(n):
        total += i
    return total

print(json.dumps({"int": triangle(int(sys.argv[1])), "float": triangle(float(sys.argv[1]))}))
'''
RIGHT = {"int": 4950, "float": 4950.0}
OLD = time.time() - 10 * 86400.0  # beyond prune's grace period


class Payload:
    """Another account's pickle: unpickling it runs ``os.mkdir(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def run(folder: Path, env: dict[str, str], umask: int | None = None, timeout: float = 600) -> dict:
    """The job in ``folder`` (written there first), which must succeed: its answer."""
    job = folder / "job.py"
    if not job.exists():
        job.write_text(JOB)
    done = subprocess.run([sys.executable, str(job), "100"], env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=None if umask is None else lambda: os.umask(umask))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def entry_files(root: Path) -> tuple[Path, list[Path]]:
    """The job's entry: its index and its data files (``.1.nbc`` first: the first overload the
    job looks up, ``triangle(int)``)."""
    (entry,) = KIND.scan(KIND.folder(root), grace_seconds=0.0)
    index, *data = map(Path, KIND.files(entry))
    return index, sorted(data)


def planted(base: Path, target: Path) -> Path:
    """Another account's pickle, written over ``target`` by root and given to nobody: the marker
    it would make."""
    marker = base / "ran-another-accounts-code"
    target.write_bytes(pickle.dumps(Payload(marker)))
    os.chown(target, pwd.getpwnam("nobody").pw_uid, -1)
    target.chmod(0o644)
    return marker


def as_nobody(*command: str) -> None:
    done = subprocess.run(["runuser", "-u", "nobody", "--", *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr  # the attack is real: that account can do it


@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
def test_a_fresh_process_hits_what_the_first_compiled(tmp_path):
    root = tmp_path / "root"
    env = job_env(root)
    assert env["NUMBA_CACHE_DIR"] == str(root / "numba")
    assert run(tmp_path, env) == run(tmp_path, env) == RIGHT
    first, second = records(root, "numba")
    assert (first["misses"], first["hits"], second["misses"], second["hits"]) == (2, 0, 0, 2)
    (entry,) = KIND.scan(KIND.folder(root), grace_seconds=0.0)
    assert entry.problem is None and entry.name.endswith("triangle")
    assert set(second["hit_keys"]) == {entry.key} and {m["key"] for m in first["missed"]} == {entry.key}
    assert len(KIND.files(entry)) == 3  # the index and one data file per overload
    KIND.remove(KIND.folder(root), entry)
    assert KIND.scan(KIND.folder(root)) == []
    third = run(tmp_path, env) and records(root, "numba")[-1]
    assert (third["misses"], third["hits"]) == (2, 0)  # removed whole: compiled again


@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
def test_a_job_under_umask_000_writes_privately_and_an_index_others_rewrote_is_never_loaded(base):
    """A job under ``umask 000`` makes numba's folder and files writable by nobody else (guard:
    the piece's private writes; without them the index was 0666). An index left 0666 (by a job
    without the hook), which another account then rewrote with its pickle: the next job, after
    a fresh ``gpu-cache env`` (which judges folders only), does not load it, answers right, and
    the one after it hits again (guard: the piece's judgement of the file before numba opens
    it; without it the other account's code ran)."""
    root = base / "root"
    env = job_env(root)
    assert run(base, env, umask=0) == RIGHT
    index, data = entry_files(root)
    assert [oct(p.stat().st_mode & 0o077) for p in (index.parent, index, *data)] == ["0o0"] + ["0o44"] * 3
    for folder in (root, KIND.folder(root), index.parent):
        folder.chmod(0o755)  # as numba made them under a usual umask, before the hook
    index.chmod(0o666)
    payload = base / "payload"
    marker = planted(base, payload)
    payload.chmod(0o644)
    as_nobody("cp", str(payload), str(index))
    assert index.stat().st_uid == os.getuid()  # rewritten in place: still the victim's file
    env = job_env(root)
    assert env["NUMBA_CACHE_DIR"] == str(KIND.folder(root))  # env finds nothing wrong
    assert run(base, env) == RIGHT
    assert not marker.exists(), "another account's pickle ran in the job"
    second = records(root, "numba")[-1]
    assert (second["hits"], second["misses"]) == (0, 2)
    (refused,) = second["refused"]
    assert refused.startswith(f"{index} is writable by everyone") and refused.endswith("; set aside")
    assert run(base, env) == RIGHT and records(root, "numba")[-1]["hits"] == 2


@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
@pytest.mark.parametrize("which", ["index", "data"])
def test_another_accounts_file_in_the_users_own_folder_is_never_loaded(base, which):
    """A left-over file of another account's (mode 0644) in the user's own per-source folder,
    the index or a data file, each a pickle of that account's: the job does not load it (the
    overload it names is compiled), answers right, and sets it aside; the next job hits both
    overloads. Guard: the piece's judgement of each file before numba unpickles it."""
    root = base / "root"
    env = job_env(root)
    assert run(base, env) == RIGHT
    index, data = entry_files(root)
    target = index if which == "index" else data[0]
    marker = planted(base, target)
    assert run(base, env) == RIGHT
    assert not marker.exists(), "another account's pickle ran in the job"
    second = records(root, "numba")[-1]
    assert (second["hits"], second["misses"]) == ((0, 2) if which == "index" else (1, 1))
    (refused,) = second["refused"]
    assert refused == f"{target} is owned by uid {pwd.getpwnam('nobody').pw_uid}; set aside"
    assert run(base, env) == RIGHT and records(root, "numba")[-1]["hits"] == 2


@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
@pytest.mark.parametrize("what", ["FIFO", "symbolic link"])
def test_a_fifo_or_link_at_a_data_file_is_never_opened(tmp_path, what):
    """A FIFO, or a link to a pickle elsewhere, where a data file should be: stats calls the
    entry broken, and the job neither waits on the FIFO for ever (numba's own open would) nor
    follows the link: it compiles that overload, answers right, and sets the name aside.
    Guards: the kind's check of each file of an entry, the piece's judged open."""
    root = tmp_path / "root"
    env = job_env(root)
    assert run(tmp_path, env) == RIGHT
    _index, data = entry_files(root)
    elsewhere = tmp_path / "elsewhere.nbc"
    shutil.copyfile(data[0], elsewhere)
    data[0].unlink()
    os.mkfifo(data[0]) if what == "FIFO" else data[0].symlink_to(elsewhere)
    done = run_cli_here("stats", "--json", "--cache-root", str(root))
    (broken,) = json.loads(done.stdout)["kinds"]["numba"]["broken_entries"]
    assert f"a {what} where a file of the entry should be" in broken["problem"], broken
    assert run(tmp_path, env, timeout=120) == RIGHT  # (numba's own open of the FIFO never returns)
    second = records(root, "numba")[-1]
    assert (second["hits"], second["misses"]) == (1, 1)
    said = "not a regular file" if what == "FIFO" else "a symbolic link"
    assert second["refused"] == [f"{data[0]} is {said}; set aside"]
    assert data[0].is_file() and not data[0].is_symlink() and elsewhere.is_file()


@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
def test_the_guard_holds_where_the_hook_records_nothing(base):
    """Neither records nor single-flight (``stats_hook: false``, single-flight off), nor the
    ptxas cache, nor jax-triton's kernel cache (the user's own empty ``GPU_CACHE_JAX_TRITON``),
    which all need the hook: the hook is still
    on the jobs' PYTHONPATH and loads the numba piece wherever gpu-cache gave numba its folder,
    and another account's index is not loaded. Guards: the kind's ``needs_hook`` and the piece's
    ``watches-with NUMBA_CACHE_DIR``."""
    root = base / "root"
    environ = clean_environ(GPU_CACHE_JAX_TRITON="")
    config = {"stats_hook": False, "single_flight": {"enabled": False}, "ptxas_cache": False}
    settings = settings_from(config, cache_root=str(root))
    env = jobenv.job_environ(jobenv.resolve(settings, environ), environ)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(HOOK)
    assert run(base, env) == RIGHT
    index, _data = entry_files(root)
    marker = planted(base, index)
    assert run(base, env) == RIGHT
    assert not marker.exists(), "another account's pickle ran in the job"
    assert not (root / "records").exists() or records(root, "numba") == []


def test_a_numba_whose_caching_the_piece_does_not_know_reads_no_cache(tmp_path):
    """A numba whose ``numba.core.caching`` lacks the classes the piece judges files through
    (here one with its ``Cache`` alone): its disk cache is off in the process (every look-up a
    miss, nothing saved), one warning line says so, and the record's state. Guard: the piece's
    check of what it wraps (else its files would be unpickled unjudged)."""
    stub = tmp_path / "stub" / "numba" / "core"
    stub.mkdir(parents=True)
    for init in (stub.parent / "__init__.py", stub / "__init__.py"):
        init.write_text("")
    (stub / "caching.py").write_text(
        "class Cache:\n"
        "    def load_overload(self, sig, target_context):\n        return 'unpickled unjudged'\n"
        "    def save_overload(self, sig, data):\n        return 'saved'\n")
    root = tmp_path / "root"
    env = job_env(root)
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "stub")
    done = subprocess.run([sys.executable, "-c", "import numba.core.caching as c; "
                           "print(c.Cache().load_overload(1, 2), c.Cache().save_overload(1, 2))"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["None", "None"], done
    assert "numba.core.caching is not the one this hook knows: its disk cache is off" in done.stderr
    (section,) = records(root, "numba")
    assert section["state"].endswith("its disk cache is off (compiled in each process)")


@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
def test_a_folder_opened_to_everyone_within_one_exported_environment_is_never_read(base):
    """The per-source folder turns 0777 after ``gpu-cache env`` ran (the profile exports once
    per run), and another account puts its index in: the later jobs of that environment neither
    load from that folder nor write into it, and answer right. Guard: the piece's judgement of
    the folder at every load and write (without it, the file's own judgement still refused the
    index, but the job wrote its entry into a folder anyone may write)."""
    root = base / "root"
    env = job_env(root)
    assert run(base, env) == RIGHT
    index, _data = entry_files(root)
    for folder in (root, KIND.folder(root)):
        folder.chmod(0o755)
    index.parent.chmod(0o777)
    payload = base / "payload"
    marker = planted(base, payload)
    as_nobody("cp", str(payload), str(index.parent / "theirs"))
    as_nobody("mv", "-f", str(index.parent / "theirs"), str(index))
    before = sorted((p.name, p.stat().st_ino) for p in index.parent.iterdir())
    assert run(base, env) == RIGHT
    assert not marker.exists(), "another account's pickle ran in the job"
    assert sorted((p.name, p.stat().st_ino) for p in index.parent.iterdir()) == before
    second = records(root, "numba")[-1]
    assert (second["hits"], second["misses"]) == (0, 2)
    refused = f"{index.parent} is writable by everyone"
    assert set(second["refused"]) == {refused, f"{refused}: not written"}


def age(root: Path) -> None:
    for path in KIND.folder(root).rglob("*"):
        os.utime(path, (OLD, OLD), follow_symlinks=False)


def damage(path: Path, how: str) -> None:
    """``path`` cut in half, emptied, or one bit flipped (its size and times kept): of its middle
    byte, or of the first byte of the LLVM bitcode a data file holds (its magic number)."""
    info = path.stat()
    if how in ("flipped", "bitcode flipped"):
        at = info.st_size // 2 if how == "flipped" else path.read_bytes().index(b"BC\xc0\xde")
        with open(path, "r+b") as file:
            file.seek(at)
            byte = file.read(1)
            file.seek(at)
            file.write(bytes([byte[0] ^ 0x10]))
    else:
        os.truncate(path, info.st_size // 2 if how == "cut in half" else 0)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def prune(root: Path, *args: str) -> dict:
    done = run_cli_here("prune", "--json", "--kind", "numba", *args, "--cache-root", str(root))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["numba"]


@pytest.mark.parametrize(("which", "how"), [
    *[(which, how) for which in ("index", "data") for how in ("cut in half", "emptied", "flipped")],
    ("data", "bitcode flipped")])
@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
def test_a_damaged_entry_of_ones_own_is_a_miss_never_a_failed_job(tmp_path, which, how):
    """The job's own index or data file cut in half, emptied, or (after a prune sealed it) one
    bit flipped at the same size; a data file whose LLVM bitcode is damaged, not sealed: the
    next job answers right (numba raised UnpicklingError, EOFError or an LLVM bitcode error:
    exit 1, job after job), the file is set aside and compiled again, and the job after it hits
    both overloads. Guards: the piece's load that takes numba's errors for a miss and sets the
    file aside, its seal check, and its look-up that takes an overload numba cannot rebuild
    for a miss (the bitcode). (The data file
    is the first overload's: compiled again alone, its bytes are those sealed, so a seal keyed
    by path, inode and size holds for the new file where ext4 hands it the freed inode.)"""
    root = tmp_path / "root"
    env = job_env(root)
    assert run(tmp_path, env) == RIGHT
    index, data = entry_files(root)
    target = index if which == "index" else data[0]
    if how == "flipped":
        age(root)
        assert prune(root)["entries_removed"] == 0  # seals the entry
    damage(target, how)
    assert run(tmp_path, env) == RIGHT
    second = records(root, "numba")[-1]
    (damaged,) = second["damaged"]
    assert damaged.startswith(f"{target}: ") and damaged.endswith("; set aside"), damaged
    assert run(tmp_path, env) == RIGHT and records(root, "numba")[-1]["hits"] == 2
    (entry,) = KIND.scan(KIND.folder(root), grace_seconds=0.0)
    assert entry.problem is None


@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
@pytest.mark.parametrize("how", ["cut in half", "emptied"])
@pytest.mark.parametrize("which", ["index", "data"])
def test_prune_and_doctor_find_a_file_cut_short_or_emptied(tmp_path, which, how):
    """An index or data file cut in half or emptied: ``prune --dry-run`` would remove the entry
    (it said "would remove 0 of 1" and jobs kept failing), ``doctor --fix`` removes it, and
    nothing is left of it. Guard: the kind's own check (numba_format's walk of the pickles)."""
    root = tmp_path / "root"
    assert run(tmp_path, job_env(root)) == RIGHT
    index, data = entry_files(root)
    damage(index if which == "index" else data[0], how)
    (would,) = prune(root, "--dry-run")["removed"]
    reason = would["reason"]
    assert reason.startswith("broken: ") and ("not whole" in reason or "empty" in reason), reason
    done = run_cli_here("doctor", "--fix", "--no-fail", "--json", "--cache-root", str(root))
    (removed,) = json.loads(done.stdout)["fixed"]["numba"]["removed"]
    assert removed["key"] == would["key"]
    assert KIND.scan(KIND.folder(root), grace_seconds=0.0) == []
    assert not index.exists() and not any(p.exists() for p in data)


@pytest.mark.slow  # a numba job in a fresh process: more than 2 s here
def test_prune_never_unpickles_what_it_checks(base):
    """An index and a data file that are whole pickles of another account's making, in the
    user's own folder: prune, its dry run, doctor --fix and stats walk them (and remove the
    entry as another user's), and none of them runs the pickle. Guard: numba_format walks
    opcodes with pickletools.genops and never loads."""
    root = base / "root"
    assert run(base, job_env(root)) == RIGHT
    index, data = entry_files(root)
    marker = planted(base, data[0])
    index.write_bytes(pickle.dumps(Payload(marker)) * 2)  # the user's own: checked whole
    for args in (("prune", "--dry-run", "--json"), ("stats", "--json"), ("doctor", "--fix", "--no-fail"),
                 ("prune", "--json")):
        run_cli_here(*args, "--cache-root", str(root))
    assert not marker.exists(), "gpu-cache unpickled a file it checked"
    assert KIND.scan(KIND.folder(root), grace_seconds=0.0) == []
