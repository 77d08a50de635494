"""What the registry tests share (tests/test_registry*.py): the warm they publish, fetch as a user
runs it, a refusal's one line, a root's JAX entries, blobs and manifests pushed by hand.
tests/conftest.py starts the registry (``registry_server``) and publishes (``published``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_cache import oci
from gpu_cache.core import kinds
from helpers import SMALL, read_json, run_cli, unavailable
from registry import missing_requirements

CONFIG = json.dumps({**SMALL, "validate": {"measure_cold": False}})
OTHER_PYTHON = "/root/.pyenv/versions/3.9.18/bin/python"  # a Python without jax


def needs_registry() -> None:
    missing = missing_requirements()
    if missing:
        unavailable(f"the registry tests need {', '.join(missing)} (run .ci/install-registry.sh as root)")



def warm_and_validate(root: Path, work: Path) -> Path:
    """Warm ``root`` on the CPU and validate it; the verdict's path."""
    for command in ("warm", "validate"):
        result = run_cli(
            command,
            "--config-json",
            CONFIG,
            "--cache-root",
            str(root),
            "--output",
            str(work / f"{command}.json"),
            "--log",
            str(work / f"{command}.log"),
        )
        assert result.returncode == 0, result.stderr
    assert read_json(work / "validate.json")["passed"] is True
    return work / "validate.json"



def fetch(ref: str, root: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return run_cli("fetch", ref, "--cache-root", str(root), *args, env=env)


def one_line(result: Any) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def entries(root: Path) -> dict[str, Any]:
    return {e.key: e for e in kinds.named("jax").scan(root / "jax", grace_seconds=0.0)}

def pushed(session: oci.Session, path: Path) -> tuple[str, int]:
    """The file at ``path`` uploaded as a blob: its digest and size."""
    data = path.read_bytes()
    session.upload(path, oci.sha256_digest(data), len(data), path.name)
    return oci.sha256_digest(data), len(data)


def pushed_manifest(session: oci.Session, manifest: dict[str, Any]) -> str:
    """``manifest`` put into the registry under its digest, which it returns."""
    raw = json.dumps(manifest).encode()
    session.put_manifest(oci.sha256_digest(raw), raw, oci.MANIFEST_TYPE)
    return oci.sha256_digest(raw)
