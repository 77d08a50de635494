"""The contract every registered cache kind keeps (docs/kinds.md): the generic faults and attacks,
run on each kind of :data:`gpu_cache.core.kinds.ALL` through one whole entry of it written as the
kind writes them (``tests/kind_examples/<kind>.py``). A new kind gets these tests by being
registered. Each test names the generic guard it holds; removing that guard fails it."""

from __future__ import annotations

import importlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

from gpu_cache.core import kinds, names
from gpu_cache.core.kinds import Kind, integrity
from helpers import hook_piece, run_cli_here, unavailable

DAY = 86400.0
OLD = time.time() - 10 * DAY  # beyond prune's grace period and any tool's write grace
KINDS = [pytest.param(kind, id=kind.name) for kind in kinds.ALL]
#: Text a hostile name or record may hold, which no output may pass on raw.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\rforged line\n"


def examples(kind: Kind) -> ModuleType:
    try:
        return importlib.import_module(f"kind_examples.{kind.name}")
    except ModuleNotFoundError:
        pytest.fail(f"no tests/kind_examples/{kind.name}.py: a registered kind needs an example entry")


def age(folder: Path, when: float = OLD, atime: float | None = None) -> None:
    """Every name under ``folder`` (and it) last modified and read at ``when``."""
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (when if atime is None else atime, when), follow_symlinks=False)


def written(root: Path, kind: Kind, count: int = 2) -> list[str]:
    """``count`` whole entries of ``kind`` under ``root``, aged: their keys (in the order written)."""
    keys = [examples(kind).write(kind.folder(root), number) for number in range(count)]
    age(kind.folder(root))
    return list(dict.fromkeys(keys))  # (a whole-folder kind is one entry however many are written)


def entry_of(root: Path, kind: Kind, key: str) -> kinds.Entry:
    (found,) = [e for e in kind.scan(kind.folder(root), grace_seconds=0.0) if e.key == key]
    return found


def whole(root: Path, kind: Kind) -> list[str]:
    """The keys of the whole entries of ``kind`` under ``root`` (not what a removal left)."""
    return [e.key for e in kind.scan(kind.folder(root)) if e.problem is None]


def first_file(kind: Kind, entry: kinds.Entry) -> str:
    return next(path for top in kind.files(entry) for path, _info in integrity.files_of(top))


def cli(*args: str) -> dict:
    done = run_cli_here(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def prune(root: Path, *args: str) -> dict:
    return cli("prune", "--json", "--kind", *args, "--cache-root", str(root))


def flip(path: str) -> None:
    """One bit of ``path``'s middle byte inverted in place: its size, inode and times kept."""
    info = os.stat(path)
    with open(path, "r+b") as file:
        file.seek(info.st_size // 2)
        byte = file.read(1)
        file.seek(info.st_size // 2)
        file.write(bytes([byte[0] ^ 0x10]))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


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


def entry_parts(kind: Kind, entry: kinds.Entry) -> list[str]:
    """What a job reads of an entry: its path and every regular file of it (a numba index and
    its data files, the files of a Triton key folder), each once."""
    files = [path for top in kind.files(entry) for path, _info in integrity.files_of(top)]
    return list(dict.fromkeys([entry.path, *files] if entry.path else files))


def mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode:
        unavailable(f"mount {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def ext4(tmp_path):
    """A fresh ext4 filesystem (a loop-mounted image): it hands a new file the inode number just
    freed, as the one a cache root is on did, and keeps each inode's generation."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        unavailable("an ext4 loop mount needs root and mkfs.ext4")
    image, point = tmp_path / "ext4.img", tmp_path / "ext4"
    point.mkdir()
    with open(image, "wb") as file:
        file.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    mount("-o", "loop", str(image), str(point))
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.fixture
def overlay(ext4, tmp_path):
    """An overlayfs over that ext4 (as a container's disk is): the inode numbers are ext4's, freed
    ones handed on at once, but it keeps no generation of theirs."""
    for name in ("lower", "upper", "work"):
        (ext4 / name).mkdir()
    point = tmp_path / "overlay"
    point.mkdir()
    mount("-t", "overlay", "overlay", "-o", f"lowerdir={ext4 / 'lower'},upperdir={ext4 / 'upper'},"
          f"workdir={ext4 / 'work'}", str(point))
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


def move_off(path: Path) -> None:
    """Put the file or folder ``path`` on another inode, as it is (bytes, mode, times, what a
    folder holds)."""
    aside = path.with_name(f"{path.name}.moved")
    if path.is_dir():
        os.rename(path, aside)
        path.mkdir()
        shutil.copystat(aside, path)
        for child in aside.iterdir():
            os.rename(child, path / child.name)
        aside.rmdir()
    else:
        shutil.copy2(path, aside)
        os.replace(aside, path)


def on_the_freed_inode(files: dict[str, bytes], victim: str, number: int, folder: Path) -> None:
    """Write ``files`` (path: bytes) anew, as a job writes an entry again, ``victim`` on the inode
    ``number`` freed before. ext4 gives a new file the lowest free number of its folder's group:
    a name that took it since (the verification record a removal saved, a folder made now) is
    put on another first, and the lower free numbers are filled (then freed again)."""
    for path in [p for p in folder.rglob("*") if p.lstat().st_ino == number]:
        move_off(path)
    for path in files:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    for path in [p for p in folder.rglob("*") if p.lstat().st_ino == number]:
        move_off(path)
    fillers = []
    for attempt in range(200):
        with open(victim, "xb") as file:
            file.write(files[victim])
        if os.stat(victim).st_ino == number:
            break
        fillers.append(f"{victim}.{attempt}")
        os.rename(victim, fillers[-1])
    else:
        pytest.fail(f"{victim} did not get inode {number} back in 200 tries")
    for filler in fillers:
        os.unlink(filler)
    for path, data in files.items():
        if path != victim:
            with open(path, "xb") as file:
                file.write(data)


def sealed_entry(root: Path, kind: Kind) -> tuple[list[str], str, dict[str, bytes]]:
    """Two entries of ``kind`` sealed whole by a prune: their keys, the first file of the first
    one, and that entry's files with their bytes."""
    if not kind.verifies:
        pytest.skip(f"{kind.name} is not checked: {kind.unsealed_why}")
    keys = written(root, kind)
    if len(keys) < 2:
        pytest.skip(f"{kind.name}'s whole folder is one entry")
    assert prune(root, kind.name)[kind.name]["entries_removed"] == 0  # found whole, and sealed
    entry = entry_of(root, kind, keys[0])
    files = {path: Path(path).read_bytes()
             for top in kind.files(entry) for path, _info in integrity.files_of(top)}
    return keys, first_file(kind, entry), files


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_seal_judges_only_the_file_it_sealed(kind, ext4):
    """A file found damaged (a dry run seals it DAMAGED), then written again whole by a job, at
    its path and of its size, on the inode number ext4 hands on at once: the next prune takes
    the new file for what it is (whole) and removes nothing. Before, it had the path, inode and
    size of the DAMAGED seal and was removed again (the fifth attack set's seal case, one run of
    three under load). Guard: the inode's generation in the seal's key (integrity.seal_of;
    the file went without a prune, so no seal was dropped)."""
    root = ext4 / "root"
    keys, victim, files = sealed_entry(root, kind)
    number = os.stat(victim).st_ino
    flip(victim)
    dry = cli("prune", "--dry-run", "--json", "--kind", kind.name, "--cache-root", str(root))
    assert [r["key"] for r in dry[kind.name]["removed"]] == [keys[0]]  # sealed DAMAGED now
    os.unlink(victim)
    on_the_freed_inode({victim: files[victim]}, victim, number, kind.folder(root))
    age(kind.folder(root))
    assert prune(root, kind.name)[kind.name]["removed"] == []
    assert sorted(whole(root, kind)) == sorted(keys)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_seals_of_what_prune_removes_go_with_it(kind, overlay):
    """Where the filesystem keeps no inode generation (overlayfs, as in a container): ``doctor
    --fix`` removes a damaged entry, a job writes it again whole, its first file on the inode
    number just freed: the next prune removes nothing. Guard: prune drops the seals of what it
    removes (integrity.forget)."""
    root = overlay / "root"
    keys, victim, files = sealed_entry(root, kind)
    number = os.stat(victim).st_ino
    flip(victim)
    done = run_cli_here("doctor", "--fix", "--no-fail", "--json", "--cache-root", str(root))
    assert [r["key"] for r in json.loads(done.stdout)["fixed"][kind.name]["removed"]] == [keys[0]]
    assert not any(os.path.lexists(path) for path in files)
    on_the_freed_inode(files, victim, number, kind.folder(root))
    age(kind.folder(root))
    removed = prune(root, kind.name)[kind.name]["removed"]  # (what the removal left: Triton's trash)
    assert not [r for r in removed if r["key"] in keys], removed
    assert sorted(whole(root, kind)) == sorted(keys)


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


TIERED = [pytest.param(kind, id=kind.name) for kind in kinds.ALL if kind.tiered]


def tier_of(local: Path, shared: Path):
    """The startup hook's node-local tier of a job whose cache root is ``shared``."""
    return hook_piece("tier").Tier(str(local), str(shared), 0, None)


def tree(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` with its bytes (none of gpu-cache's own)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != ".gpu-cache-verified"}


@pytest.mark.parametrize("kind", TIERED)
def test_the_tier_fetches_only_whole_entries_nobody_else_may_have_written(kind, tmp_path):
    """Three entries in the shared tier, sealed by a prune: one then damaged (one bit, size and
    mtime kept), one made writable by everyone. The hook's fetch serves the third as it is, and
    neither of the others: both are counted in the record, and the damaged one is set aside in
    the shared tier. Guards: the seal and trust checks of gpu_cache_hook.tier's fetch."""
    root, local = tmp_path / "root", tmp_path / "tier"
    keys = written(root, kind, count=3)
    prune(root, kind.name)  # seals what it finds whole
    damaged = first_file(kind, entry_of(root, kind, keys[0]))
    flip(damaged)
    open_to_all = first_file(kind, entry_of(root, kind, keys[1]))
    os.chmod(open_to_all, 0o666)
    tier = tier_of(local, root)
    for key in keys:
        examples(kind).fetch(tier, key)
    counts = tier.record(kind.name)
    assert counts["damaged"] == 1 and counts["untrusted"] >= 1, counts  # (a tree: at each fetch)
    assert not os.path.lexists(damaged), "set aside in the shared tier"
    fetched = tree(kind.folder(local))
    shared = tree(kind.folder(root))
    assert whole(local, kind) == [keys[2]]
    for path in fetched:  # what it fetched is byte for byte the shared tier's
        assert not path.startswith(".gpu-cache-tmp")
    third = first_file(kind, entry_of(local, kind, keys[2]))
    relative = os.path.relpath(third, kind.folder(local))
    assert fetched[relative] == shared[relative] or kind.name == "triton"  # (a group names local paths)
    assert os.path.relpath(damaged, kind.folder(root)) not in fetched
    assert os.path.relpath(open_to_all, kind.folder(root)) not in fetched


@pytest.mark.parametrize("kind", TIERED)
def test_the_tier_promotes_whole_entries_and_never_over_one_there(kind, tmp_path):
    """Two entries a job wrote in its local tier; the shared tier already holds the first one
    (another node promoted it first). Promotion places the second whole (the shared tier's
    scan finds it whole) and leaves the first one's files as they were, not one replaced (a
    reader there may be reading them). Guard: gpu_cache_hook.tier.files.link_new (a new name only,
    never a replacement)."""
    root, local = tmp_path / "root", tmp_path / "tier"
    keys = written(local, kind, count=2)
    assert written(root, kind, count=1) == keys[:1]  # (the same entry, in files of its own)
    before = {p: os.stat(p).st_ino for p in map(str, kind.folder(root).rglob("*"))}
    tier = tier_of(local, root)
    for key in keys:
        examples(kind).promote(tier, key)
    assert {p: os.stat(p).st_ino for p in before} == before, "an entry there is never replaced"
    assert sorted(whole(root, kind)) == sorted(keys)
    assert prune(root, kind.name)[kind.name]["entries_removed"] == 0


@pytest.mark.parametrize("kind", TIERED)
def test_the_tiers_bound_trims_whole_entries_least_recently_used_first(kind, tmp_path):
    """Three entries in a job's node-local tier, used 3, 2 and 1 days ago, and a bound that holds
    two: the hook's bound at exit removes the oldest whole (none of its files left) and keeps
    the others whole. On a node where ``gpu-cache prune`` never runs, this bound is the only
    one. Guard: the kind's tier layout that its hook piece declares (gpu_cache_hook.tier.bound)."""
    root, local = tmp_path / "root", tmp_path / "tier"
    keys = written(local, kind, count=3)
    keys.sort(reverse=True)  # (the least recently used is not the first by key)
    files = {}
    for days, key in zip((3, 2, 1), keys, strict=True):
        tops = kind.files(entry_of(local, kind, key))
        files[key] = [p for top in tops for p, _info in integrity.files_of(top)]
        for path in [*tops, *files[key]]:
            os.utime(path, (time.time() - days * DAY,) * 2, follow_symlinks=False)
    bound = sum(os.lstat(p).st_size for key in keys[1:] for p in files[key])
    layouts = hook_piece("tier").layouts(hook_piece("names").pieces())
    tier = hook_piece("tier").Tier(str(local), str(root), bound, None, layouts)
    assert tier.trim() == 1
    assert not any(os.path.lexists(p) for p in files[keys[0]]), "the oldest entry goes whole"
    assert all(stat.S_ISREG(os.lstat(p).st_mode) for key in keys[1:] for p in files[key])
    assert sorted(whole(local, kind)) == sorted(keys[1:])


CARRIED = [pytest.param(kind, id=kind.name) for kind in kinds.ALL if kind.carry is not None]


def foreign(root: Path, kind: Kind, keys: list[str]) -> None:
    """The first entry of ``keys`` made another user's, a file of the second writable by all."""
    os.chown(entry_of(root, kind, keys[0]).path, pwd.getpwnam("nobody").pw_uid, -1, follow_symlinks=False)
    os.chmod(first_file(kind, entry_of(root, kind, keys[1])), 0o666)


def same_files(kind: Kind, root: Path, other: Path, key: str) -> None:
    """The entry ``key`` has the same files with the same bytes in both roots."""
    def files(top: Path) -> dict[str, bytes]:
        return {os.path.relpath(p, kind.folder(top)): Path(p).read_bytes()
                for t in kind.files(entry_of(top, kind, key)) for p, _info in integrity.files_of(t)}

    theirs, mine = files(root), files(other)
    assert theirs.keys() == mine.keys() and (theirs == mine or kind.name == "triton")  # (a group: its paths)


@pytest.mark.parametrize("kind", CARRIED)
def test_pack_and_unpack_carry_whole_entries_and_leave_foreign_ones_out(kind, tmp_path):
    """Three entries, one another user's and one with a file everyone may write: ``pack`` leaves
    those two out and counts them, ``unpack`` at another root writes the third whole, as it was.
    Guards: pack's read rule (carry/_pack.py) and the kind's carry part."""
    root, other, archive = tmp_path / "root", tmp_path / "other", tmp_path / "carry.tar"
    keys = written(root, kind, count=3)
    foreign(root, kind, keys)
    report = cli("pack", str(archive), "--kind", kind.name, "--json", "--cache-root", str(root))
    assert sorted(u["key"] for u in report["untrusted"]) == sorted(keys[:2]), report
    assert report["entries"] == {kind.name: 1} and report["skipped"] == []
    unpacked = cli("unpack", str(archive), "--force", "--json", "--cache-root", str(other))
    assert unpacked["written"] == {kind.name: 1} and unpacked["damaged"] == [], unpacked
    assert whole(other, kind) == keys[2:]
    same_files(kind, root, other, keys[2])


@pytest.fixture(scope="module")
def registry_host(tmp_path_factory):
    from registry import RegistryServer, missing_requirements

    missing = missing_requirements()
    if missing:
        unavailable(f"the registry needs {', '.join(missing)} (run .ci/install-registry.sh as root)")
    with RegistryServer(tmp_path_factory.mktemp("registry")) as server:
        yield server.host


@pytest.mark.slow
@pytest.mark.parametrize("kind", CARRIED)
def test_publish_and_fetch_carry_whole_entries_and_leave_foreign_ones_out(kind, registry_host, tmp_path):
    """Three entries a validated pass used, one another user's and one with a file everyone may
    write: ``publish`` leaves those two out and counts them, ``fetch`` at a new site writes the
    third whole. Guards: publish's read rule (carry/_pack.py) and the kind's carry part."""
    root, other = tmp_path / "root", tmp_path / "other"
    keys = written(root, kind, count=3)
    foreign(root, kind, keys)
    module = examples(kind)
    used = module.recorded(keys) if hasattr(module, "recorded") else \
        {kind.name: {"hits": len(keys), "hit_keys": keys}}
    record = {"time": time.time(), "run_id": "r", "rule": "validate_cache", "gpu_type": "cpu", "host": "h",
              "pid": 1, "env": {}, "device": {"platform": "cpu", "kinds": ["cpu"], "count": 1},
              "software": {"python": "3.11.7", "image": "lab.sif"}, **used}
    assert kind.carry.recorded_keys(json.loads(json.dumps(record))) >= set(keys)
    records = kinds.named("records").folder(root)
    records.mkdir(parents=True)
    (records / "h-1-1.json").write_text(json.dumps(record))
    verdict = tmp_path / "cpu.json"
    verdict.write_text(json.dumps({"gpu_type": "cpu", "passed": True, "status": "passed", "misses": 0,
                                   "device": {"name": "cpu"}}))
    ref = f"{registry_host}/contract/{kind.name.replace('_', '-')}:1"
    report = cli("publish", ref, "--verdict", str(verdict), "--json", "--cache-root", str(root))
    assert sorted(u["key"] for u in report["untrusted"]) == sorted(keys[:2]), report
    assert report["layers"][kind.name]["entries"] == 1
    fetched = cli("fetch", ref, "--gpu-type", "cpu", "--image", "lab.sif", "--json",
                  "--cache-root", str(other))
    assert fetched["unpacked"][kind.name]["written"] == {kind.name: 1}, fetched
    assert whole(other, kind) == keys[2:]
    same_files(kind, root, other, keys[2])
