"""Whole entries of each registered cache kind for the kind-contract tests (tests/test_kind_*.py):
written as the kind writes them (``tests/kind_examples/<kind>.py``), aged, found, damaged in
place, and the CLI's JSON for them."""

from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path
from types import ModuleType

import pytest

from gpu_cache.core import kinds
from gpu_cache.core.kinds import Kind, integrity
from helpers import run_cli_here

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

def entry_parts(kind: Kind, entry: kinds.Entry) -> list[str]:
    """What a job reads of an entry: its path and every regular file of it (a numba index and
    its data files, the files of a Triton key folder), each once."""
    files = [path for top in kind.files(entry) for path, _info in integrity.files_of(top)]
    return list(dict.fromkeys([entry.path, *files] if entry.path else files))
