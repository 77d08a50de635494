"""The seals every registered cache kind's entries get (docs/kinds.md, docs/guarantees.md): on a
real ext4 (a loop-mounted image that hands a new file the inode number just freed) a seal judges
only the file it sealed, and on an overlay the seals of what prune removes go with it. Each
kind's entry is written as the kind writes it (harness/kind_entries.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpu_cache.core.kinds import Kind, integrity
from helpers import run_cli_here, unavailable
from kind_entries import KINDS, age, cli, entry_of, first_file, flip, prune, whole, written


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
