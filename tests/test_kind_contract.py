"""The contract every registered cache kind keeps (docs/kinds.md): the generic faults and attacks,
run on each kind of :data:`gpu_cache.core.kinds.ALL` through one whole entry of it written as the
kind writes them (``tests/kind_examples/<kind>.py``, harness/kind_entries.py). A new kind gets
these tests by being registered. Each test names the generic guard it holds; removing that guard
fails it. The seals on a real ext4 and overlay are in test_kind_seals.py, the node-local tier and
what carries entries (pack, unpack, publish, fetch) in test_kind_tier_carry.py."""

from __future__ import annotations

import json
import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from gpu_cache.core import kinds, names
from gpu_cache.core.kinds import integrity
from helpers import run_cli_here
from kind_entries import (
    DAY,
    HOSTILE,
    KINDS,
    age,
    cli,
    entry_of,
    entry_parts,
    first_file,
    flip,
    prune,
    whole,
    written,
)


@pytest.mark.parametrize("command", ["prune", "doctor --fix"])
@pytest.mark.parametrize("kind", KINDS)
def test_same_size_damage_is_found_and_removed(kind, command, tmp_path):
    """One flipped bit, size and mtime kept, in an entry a prune found whole: the next prune
    (or ``doctor --fix``) removes it as broken and keeps the others. Guard: the kind's own
    check where it has one (JAX), else the seal every verifying scan keeps (integrity.check)."""
    if not kind.verifies:
        pytest.skip(f"{kind.name} is not checked: {kind.unsealed_why}")
    root = tmp_path / "root"
    keys = written(root, kind)
    assert prune(root, kind.name)[kind.name]["entries_removed"] == 0  # found whole, and sealed
    flip(first_file(kind, entry_of(root, kind, keys[0])))
    if command == "prune":
        removed = prune(root, kind.name)[kind.name]["removed"]
    else:
        done = run_cli_here("doctor", "--fix", "--no-fail", "--json", "--cache-root", str(root))
        removed = json.loads(done.stdout)["fixed"][kind.name]["removed"]
    assert [r["key"] for r in removed] == [keys[0]], removed
    assert removed[0]["reason"].startswith("broken: ")
    assert whole(root, kind) == keys[1:]


def test_a_record_of_the_previous_version_condemns_nothing(tmp_path):
    """A verification record the previous gpu-cache wrote (seals keyed by path, inode number and
    size), calling every file DAMAGED: it is read without a fault and matches no file now, so
    prune removes nothing and seals each file again."""
    import zlib

    from gpu_cache.core import verified

    kind = kinds.named("bytecode")
    root = tmp_path / "root"
    keys = written(root, kind)
    folder = kind.folder(root)
    old = verified.Record(folder)
    for top in [p for key in keys for p in kind.files(entry_of(root, kind, key))]:
        for path, info in integrity.files_of(top):
            relative = os.path.relpath(path, folder).encode()
            old.put(hash((8, zlib.crc32(relative), info.st_ino, info.st_size)) & ((1 << 64) - 1),
                    verified.DAMAGED)
    assert old.save() and len(verified.Record.load(folder).known) == len(keys)
    assert prune(root, kind.name)[kind.name]["removed"] == []
    assert sorted(whole(root, kind)) == sorted(keys)
    assert verified.DAMAGED not in verified.Record.load(folder).known.values()


@pytest.mark.parametrize("how", ["owned by nobody", "mode 0666"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_entry_another_user_may_have_written_is_never_taken_whole(kind, how, tmp_path):
    """An entry one of whose files (or its folder) is owned by another user, or that everyone
    may write, each file in turn: broken (stats says why), and prune removes it; the others
    stay. Guard: the trust rule in Kind.scan, over every file of an entry (with only the file
    its path names judged, a numba data file of another user's was taken whole: M33)."""
    layout = written(tmp_path / "layout", kind)
    parts = [os.path.relpath(p, kind.folder(tmp_path / "layout"))
             for p in entry_parts(kind, entry_of(tmp_path / "layout", kind, layout[0]))]
    for number, part in enumerate(parts):
        root = tmp_path / f"root{number}"
        keys = written(root, kind)
        path = kind.folder(root) / part
        assert path.exists(), (part, keys)
        if how == "owned by nobody":
            os.chown(path, pwd.getpwnam("nobody").pw_uid, -1, follow_symlinks=False)
        else:
            os.chmod(path, 0o666)
        stats = cli("stats", "--json", "--cache-root", str(root))["kinds"][kind.name]
        (broken,) = stats["broken_entries"]
        assert broken["key"] == keys[0] and "not trusted" in broken["problem"], (part, broken)
        removed = prune(root, kind.name)[kind.name]["removed"]
        assert [r["key"] for r in removed] == [keys[0]], part
        assert whole(root, kind) == keys[1:]


@pytest.mark.parametrize("kind", KINDS)
def test_a_link_or_fifo_where_an_entry_is_is_never_followed_nor_opened(kind, tmp_path):
    """An entry replaced by a link to a file of the user's own, another by a FIFO: no scan
    follows or opens them (a FIFO would block for ever); prune removes the names themselves and
    the user's file is unchanged. Guard: Kind.scan's judgement of what is at an entry's path."""
    root = tmp_path / "root"
    keys = written(root, kind, count=3)
    if len(keys) < 3:
        pytest.skip(f"{kind.name}'s whole folder is one entry (a link at it: the kind-folder test)")
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's own")
    paths = [entry_of(root, kind, key).path for key in keys[:2]]
    for path in paths:
        _remove(path)
    os.symlink(mine, paths[0])
    os.mkfifo(paths[1])
    stats = cli("stats", "--json", "--cache-root", str(root))["kinds"][kind.name]
    assert sorted((b["key"], b["problem"]) for b in stats["broken_entries"]) == sorted(
        [(keys[0], "a symbolic link where an entry should be (never followed nor opened)"),
         (keys[1], "a FIFO where an entry should be (never followed nor opened)")])
    report = prune(root, kind.name)[kind.name]
    assert {r["key"] for r in report["removed"]} >= set(keys[:2]), report["removed"]
    assert not any(os.path.lexists(p) for p in paths)
    assert mine.read_text() == "the user's own"
    assert whole(root, kind) == keys[2:]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil

        shutil.rmtree(path)
    else:
        os.unlink(path)


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_folder_that_links_out_of_the_root_is_never_touched(kind, tmp_path):
    """``<root>/<kind>`` a link to a folder of the user's own that holds entries of the kind
    (#21: with ``records`` linked, ``prune --max-size 1K`` deleted the user's files): stats,
    prune, its dry run and doctor --fix leave it as it was (no file removed, none written: not
    even a verification record; nothing read as records), prune says why in one line, and
    another kind under the root is pruned as ever. Guard: safe_io.within in prune and stats."""
    root = tmp_path / "root"
    mine = tmp_path / "mine"
    written(mine, kind)
    before = sorted((str(p), p.lstat().st_mtime) for p in mine.rglob("*"))
    root.mkdir()
    kind.folder(root).symlink_to(mine / kind.name, target_is_directory=True)
    other = next(k for k in kinds.ALL if k is not kind)
    written(root, other)
    common = ("--max-size", "1", "--cache-root", str(root))
    assert cli("stats", "--json", "--cache-root", str(root))["runs"] == []
    dry = cli("prune", "--dry-run", "--json", *common)
    real = cli("prune", "--json", *common)
    assert sorted((str(p), p.lstat().st_mtime) for p in mine.rglob("*")) == before
    fixed = cli("doctor", "--fix", "--no-fail", "--json", "--cache-root", str(root))
    # (not even a probe file made and removed there, which would move the folder's mtime)
    assert sorted((str(p), p.lstat().st_mtime) for p in mine.rglob("*")) == before
    for problems in (dry["problems"], real["problems"], fixed["warnings"]):
        (said,) = [p for p in problems if p.startswith(f"{kind.name}: {kind.folder(root)} is a link")]
        assert "outside the cache root; not pruned" in said
    assert dry[kind.name]["entries_before"] == 0 and real[other.name]["entries_removed"] >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_odd_names_are_shown_escaped(kind, tmp_path):
    """A name with terminal controls and a line break in the kind's folder, and one as an
    entry's own name where the layout allows: what stats and prune print holds no control
    character and forges no line. Guard: core/shown.py on every line they print."""
    root = tmp_path / "root"
    written(root, kind)
    odd = kind.folder(root) / f"odd{HOSTILE}name"
    odd.write_text("x")
    age(kind.folder(root))
    for args in (("stats",), ("prune", "--dry-run", "--max-age", "1s", "--kind", kind.name)):
        done = run_cli_here(*args, "--cache-root", str(root))
        assert done.returncode == 0, done.stderr
        for stream in (done.stdout, done.stderr):
            assert not any(ch in stream for ch in "\x1b\x07\r"), stream
            assert not any(line.startswith("forged line") for line in stream.splitlines()), stream


@pytest.mark.parametrize("kind", KINDS)
def test_an_entry_dated_ahead_of_the_clock_counts_as_the_oldest(kind, tmp_path):
    """An entry whose files are dated a year ahead (a wrong clock, or by hand) would otherwise
    never be least recently used: prune takes it first. Guard: prune.plan's FUTURE_SLACK."""
    root = tmp_path / "root"
    keys = written(root, kind, count=2)
    if len(keys) < 2:
        age(kind.folder(root), time.time() + 365 * DAY)
        assert [r["key"] for r in prune(root, kind.name)[kind.name]["removed"]] == keys
        return
    entry = entry_of(root, kind, keys[0])
    for top in kind.files(entry):
        age(Path(top), time.time() + 365 * DAY) if os.path.isdir(top) else \
            os.utime(top, (time.time() + 365 * DAY,) * 2)
    age(Path(entry_of(root, kind, keys[1]).path or kind.folder(root)), time.time() - 3600)
    removed = prune(root, kind.name)[kind.name]["removed"]
    assert [r["key"] for r in removed] == [keys[0]], removed
    assert "ahead of the clock" in removed[0]["reason"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_write_probe_of_a_starting_job_is_no_entry(kind, tmp_path):
    """``gpu-cache env`` writes, renames and removes a probe file in each kind folder as a job
    starts (jobenv.fs). Caught there by a validation beside it, the probe was a new entry: a
    false FAILED ("1 compilation(s) missed ... .gpu-cache-probe-..."), seen in CI; a prune then
    removed it under the starting job. Neither sees one now. Guard: Kind.scan's _fresh_probe."""
    root = tmp_path / "root"
    keys = written(root, kind, count=1)
    before = {e.key for e in kind.scan(kind.folder(root), grace_seconds=0.0)}
    probes = [kind.folder(root) / f"{names.PROBE_PREFIX}{'ab' * 16}{suffix}" for suffix in ("", ".renamed")]
    for probe in probes:
        probe.write_bytes(b"probe")
    assert {e.key for e in kind.scan(kind.folder(root), grace_seconds=0.0)} == before
    cli("prune", "--json", "--kind", kind.name, "--cache-root", str(root))
    assert all(probe.is_file() for probe in probes)
    assert sorted(whole(root, kind)) == sorted(keys)


@pytest.mark.parametrize("kind", KINDS)
def test_a_probe_name_dated_an_hour_away_either_way_is_an_entry(kind, tmp_path):
    """A file named as env's write probe counts as one only within an hour of now, on both
    sides: one dated two hours back (a killed process's) and one dated a year ahead (a network
    filesystem's clock, or by hand) are entries, which prune bounds. Before, one dated ahead was
    never counted nor pruned: 601 of 801 MB of them stayed under a 1 KB bound. Guard: Kind.scan's
    _fresh_probe, its window on both sides of now."""
    root = tmp_path / "root"
    written(root, kind, count=1)
    probes = []
    for label, when in (("past", time.time() - 2 * 3600), ("ahead", time.time() + 365 * DAY)):
        probe = kind.folder(root) / f"{names.PROBE_PREFIX}{label}{'ab' * 16}"
        probe.write_bytes(b"x" * 4096)
        os.utime(probe, (when, when))
        probes.append(probe)
    listed = [e.key for e in kind.scan(kind.folder(root), grace_seconds=0.0)]
    found = [any(probe.name in key for key in listed) for probe in probes]
    if not found[0]:
        pytest.skip(f"{kind.name} takes no such name for an entry of its own")
    assert found == [True, True], listed
    removed = prune(root, kind.name, "--max-size", "1K")[kind.name]["removed"]
    assert all(any(probe.name in r["key"] for r in removed) for probe in probes), removed
    assert not any(os.path.lexists(probe) for probe in probes)


@pytest.mark.parametrize("kind", KINDS)
def test_gpu_caches_own_reads_are_no_use(kind, tmp_path):
    """Entries unused for 40 days: a dry run (which reads and seals every entry) is no use of
    them, where a kind's last use is its files' access time too (a hit only reads them), so the
    prune after it still removes them by age, whole. Guard: integrity's O_NOATIME reads."""
    root = tmp_path / "root"
    keys = written(root, kind, count=2)
    age(kind.folder(root), time.time() - 40 * DAY)
    cli("prune", "--dry-run", "--json", "--kind", kind.name, "--cache-root", str(root))
    removed = prune(root, kind.name, "--max-age", "30d")[kind.name]["removed"]
    assert sorted(r["key"] for r in removed) == sorted(keys)
    assert whole(root, kind) == []


@pytest.mark.parametrize("kind", KINDS)
def test_an_old_entry_read_an_hour_ago_is_kept(kind, tmp_path):
    """Entries written 40 days ago, one of them read an hour ago (its files' access time), where
    a hit only reads an entry: ``prune --max-age 30d`` keeps that one, whole, and removes the
    other. Guard: the kind's last use, which counts its files' access times."""
    if not kind.read_is_use:
        pytest.skip(f"{kind.name}'s last use is written on a hit: {kind.last_use}")
    root = tmp_path / "root"
    keys = written(root, kind, count=2)
    age(kind.folder(root), time.time() - 40 * DAY)
    for top in kind.files(entry_of(root, kind, keys[-1])):
        for path, _info in integrity.files_of(top):
            os.utime(path, (time.time() - 3600, time.time() - 40 * DAY))
    removed = prune(root, kind.name, "--max-age", "30d")[kind.name]["removed"]
    assert [r["key"] for r in removed] == keys[:-1]
    assert whole(root, kind) == keys[-1:]


@pytest.mark.parametrize("kind", KINDS)
def test_lru_prune_removes_whole_entries_least_recently_used_first(kind, tmp_path):
    """Three entries used 3, 2 and 1 days ago, a cap that holds two: the oldest goes whole
    (none of its files left), the others stay whole. Guard: prune.plan and Kind.remove."""
    root = tmp_path / "root"
    keys = written(root, kind, count=3)
    if len(keys) < 3:
        pytest.skip(f"{kind.name}'s whole folder is one entry")
    keys.sort(reverse=True)  # (the least recently used is not the first by key)
    files = {}
    for days, key in zip((3, 2, 1), keys, strict=True):
        entry = entry_of(root, kind, key)
        files[key] = [p for top in kind.files(entry) for p, _info in integrity.files_of(top)]
        for top in kind.files(entry):
            age(Path(top), time.time() - days * DAY) if os.path.isdir(top) else \
                os.utime(top, (time.time() - days * DAY,) * 2)
    sizes = {e.key: e.size for e in kind.scan(kind.folder(root))}
    cap = sizes[keys[1]] + sizes[keys[2]]
    removed = prune(root, kind.name, "--max-size", str(cap))[kind.name]["removed"]
    assert [r["key"] for r in removed] == [keys[0]], removed
    assert not any(os.path.lexists(p) for p in files[keys[0]])
    assert all(stat.S_ISREG(os.lstat(p).st_mode) for key in keys[1:] for p in files[key])


@pytest.mark.parametrize("kind", KINDS)
def test_what_a_record_says_of_a_kind_is_shown_escaped(kind, tmp_path):
    """A record whose section of an observed kind names a missed computation with terminal
    controls and a line break, and a verdict of the kind's counts with such problems: ``stats``,
    ``doctor --explain`` and ``summary`` print them escaped. Guard: core/shown.py on every line
    they print."""
    if not kind.observed:
        pytest.skip(f"the startup hook records no hits or misses of {kind.name}")
    root = tmp_path / "root"
    folder = kinds.named("records").folder(root)
    folder.mkdir(parents=True)
    missed = [{"name": HOSTILE, "key": HOSTILE, "parts": {"name": HOSTILE}, "why": HOSTILE}]
    (folder / "host-1-1.json").write_text(json.dumps({
        "time": time.time(), "host": HOSTILE, "pid": 1, "rule": HOSTILE, "run_id": HOSTILE, "env": {},
        kind.name: {"hits": 0, "misses": 1, "missed": missed}}))
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({
        "gpu_type": HOSTILE, "device": {"name": HOSTILE}, "passed": False, "warm_seconds": 1.0,
        "problems": [f"{kind.name}: {HOSTILE} missed: {HOSTILE}"], "software": {"jax": HOSTILE},
        kind.name: {"hits": 0, "misses": 1, "new_entries": 1}}))
    for args in (("stats", "--cache-root", str(root)), ("doctor", "--explain", "--cache-root", str(root)),
                 ("summary", "--validate", str(verdict))):
        done = run_cli_here(*args)
        assert done.returncode == 0, done.stderr
        for stream in (done.stdout, done.stderr):
            assert not any(ch in stream for ch in "\x1b\x07\r"), stream
            assert not any(line.startswith("forged line") for line in stream.splitlines()), stream
