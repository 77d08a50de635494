"""What the pack/unpack tests share (tests/test_carry*.py): the warm they carry, a manifest read
back, unpack as a user runs it, a root's entries and files, and entries of an archive made by
hand (harness/archives.py rebuilds the archive around them)."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_cache import carry
from gpu_cache.core import kinds
from helpers import SMALL, run_cli

#: The warm the carried root holds (tests/conftest.py's ``carry_root``): the small JAX workload
#: and the Triton kernels compiled ahead of time for sm_90.
CONFIG = json.dumps({
    "workloads": {**SMALL["workloads"], "triton-kernels": {"shapes": [1000]}},
    "default_workloads": ["jax-transformer", "triton-kernels"],
    "triton_targets": ["sm_90"],
    "validate": {"measure_cold": False},
})
OTHER_PYTHON = "/root/.pyenv/versions/3.9.18/bin/python"  # a Python without jax or triton
HEX = "0" * 64
TRITON_KEY = "A" * 52


def per_kind(**counts: int) -> dict[str, int]:
    """A report's count for every carried kind: ``counts``, and 0 for the others."""
    return {kind: counts.get(kind, 0) for kind in kinds.names_of(carry.CARRIED)}


def manifest_of(path: Path) -> dict[str, Any]:
    with tarfile.open(path) as tar:
        first = tar.next()
        assert first is not None and first.name == carry.MANIFEST_NAME
        reader = tar.extractfile(first)
        assert reader is not None
        return json.loads(reader.read())


def scan(root: Path, kind: str) -> dict[str, Any]:
    return {e.key: e for e in kinds.named(kind).scan(root / kind, grace_seconds=0.0)}


def unpack(archive: Path, root: Path, *args: str) -> Any:
    return run_cli("unpack", str(archive), "--cache-root", str(root), *args)


def need_other_python() -> None:
    """Skip without OTHER_PYTHON here; in CI, which provides it, fail."""
    if not os.access(OTHER_PYTHON, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{OTHER_PYTHON} is missing")
        pytest.skip(f"{OTHER_PYTHON} is missing")


def one_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_of(key: str, files: dict[str, bytes], **more: Any) -> dict[str, Any]:
    """A manifest's entry of these files, with their sizes and digests."""
    return {"key": key, "files": {n: len(d) for n, d in files.items()},
            "sha256": {n: sha256(d) for n, d in files.items()}, "last_use": time.time() - 60, **more}


def contents(root: Path) -> dict[str, tuple[bytes, float]]:
    """Every file of the cache under ``root`` (not gpu-cache's own state, where unpack keeps the
    proof of the entries it wrote): its bytes and modification time."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime)
            for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != "state"}


def age(root: Path, seconds: float) -> None:
    """Make every file and folder under ``root`` that much older (its entries then lose to an
    archive's: unpack replaces them)."""
    when = time.time() - seconds
    for path in root.rglob("*"):
        os.utime(path, (when, when))


def of_entry(files: dict[str, tuple[bytes, float]], kind: str, key: str) -> dict[str, tuple[bytes, float]]:
    """The files of one entry among ``files`` (from :func:`contents`)."""
    return {name: value for name, value in files.items() if name.startswith(f"{kind}/{key}")}

