"""Autotuning results kept per GPU type (issue 24): tokamax's ``AutotuningResult`` per
(tokamax version, jax version, device kind), in ``<cache root>/autotune``.

Pure standard library. Layout, written by the startup hook in a warm process
(``_hook/gpu_cache_hook/kinds/autotune.py``) and read by it in every job that imports tokamax:

* ``<folder>/tokamax-<tokamax version>_jax-<jax version>/<device kind as a file name>.json``
* each file is gpu-cache's own wrapper ``{"format": 1, "tokamax": ..., "jax": ..., "device_kind":
  ..., "result": <AutotuningResult.dumps()>}``: its versions are checked before tokamax parses the
  result (tokamax's results do not load across its versions, and fail in pydantic when tried).

A result is one entry (prune removes it whole); a writer's ``.*.tmp`` file older than the
grace period is broken.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The format, as the hook's piece writes and reads it: the wrapper's version, the largest result
# read (AlphaFold 3's ops: a few hundred kB at most), a pair's folder and a device kind's file.
from gpu_cache._hook.gpu_cache_hook.kinds.autotune import (
    FORMAT,
    RESULT_LIMIT,
    file_name,
    version_folder,
)
from gpu_cache.core import safe_io

#: A result's key as ``version_folder`` and ``file_name`` make it: one folder, one visible file.
KEY_RE = re.compile(r"^tokamax-[A-Za-z0-9._+-]*_jax-[A-Za-z0-9._+-]*/[A-Za-z0-9_+-][A-Za-z0-9._+-]*\.json$")


@dataclass(frozen=True)
class AutotuneEntry:
    """One result file: ``key`` is its path below the folder."""

    key: str
    path: str
    size: int
    last_use: float
    device_kind: str
    problem: str | None


def problem_of(data: Any, key: str) -> str | None:
    """Why parsed JSON is not a valid result at ``key`` (``<version folder>/<file name>``), or
    None: gpu-cache's wrapper, named for its device kind, in the folder of its versions."""
    folder_name, _, name = key.rpartition("/")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("result"), str):
        return "not a gpu-cache autotuning result"
    device = data.get("device_kind")
    if not isinstance(device, str) or name != file_name(device):
        return "its device kind does not match its file name"
    if version_folder(str(data.get("tokamax")), str(data.get("jax"))) != folder_name:
        return "its versions do not match its folder"
    return None


def _describe(path: str, info: os.stat_result, folder_name: str) -> tuple[str, str | None]:
    """(device kind, problem) of one result file."""
    if not stat.S_ISREG(info.st_mode):
        return "?", "not a regular file"
    try:
        data = json.loads(safe_io.read_known(path, RESULT_LIMIT, info))
    except (OSError, ValueError, RecursionError) as exc:
        return "?", f"unreadable result ({exc.__class__.__name__})"
    problem = problem_of(data, f"{folder_name}/{os.path.basename(path)}")
    if problem is None or problem.startswith("its versions"):
        return data["device_kind"], problem
    return "?", problem


def scan(folder: Path, grace_seconds: float = 3600.0) -> list[AutotuneEntry]:
    """Every result under ``folder`` (a missing folder has none)."""
    out = []
    now = time.time()
    try:
        pairs = list(os.scandir(folder))
    except OSError:
        return []
    for pair in pairs:
        try:
            pair_info = pair.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(pair_info.st_mode):
            out.append(AutotuneEntry(pair.name, pair.path, pair_info.st_size, pair_info.st_mtime, "?",
                                     "not a version folder"))
            continue
        for name, path, info in safe_io.listing(pair.path):
            key = f"{pair.name}/{name}"
            if name.startswith(".") and name.endswith(".tmp"):
                if now - info.st_mtime >= grace_seconds:
                    out.append(AutotuneEntry(key, path, info.st_size, info.st_mtime, "?",
                                             "half-written result of a killed warm process"))
                continue
            device, problem = _describe(path, info, pair.name)
            out.append(AutotuneEntry(key, path, info.st_size, info.st_mtime, device, problem))
    return out


def remove(folder: Path, entry: AutotuneEntry) -> None:
    """Remove one result whole (one file; a link itself, never what it points to), and its
    version folder once empty.

    Raises:
        OSError: it could not be removed (other than already being gone).
    """
    path = folder / entry.key
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    if "/" in entry.key:
        try:
            os.rmdir(path.parent)
        except OSError:
            pass  # other results remain
