"""jax-triton's compiled kernels, kept by gpu-cache's startup hook (issue 34) in
``<cache root>/jax_triton``.

Pure standard library. jax-triton compiles each Triton kernel of a JAX program (TTIR, then
PTX) while JAX lowers it, in every process, and keeps the result only in memory. The hook
(``_hook/gpu_cache_hook/kinds/jax_triton/__init__.py``) keeps what one process compiled, so that every later
process lowers at once. Layout:

* ``<folder>/<key>``: one entry per kernel, named by its key (64 hex digits: a sha256 of
  everything that changes the compiler's output). Its content is JSON (:data:`FORMAT`): the
  key, the kernel's Python name and module, the jax-triton and Triton versions, the target,
  the key's parts (for ``gpu-cache doctor --explain``), jax-triton's ``CompilationResult``
  fields (the PTX among them) and the TTIR, framed with its sha256 (the hook's ``digest``:
  a first line ``gpu-cache sha256 <hex>``), so that damage that keeps the size is found.
  ``kernel`` comes first, so that a scan reads a small head of each file to name it.
* ``<folder>/.triton-keys/<32 hex>``: Triton's own key of one Triton installation (a hash of
  its sources and the whole ``libtriton.so``, 500 MB in Triton 3.9's wheel), named by
  the identity of those files (path, inode, size, modification and change times), so the hook
  computes it once per installation and node instead of once per process. Not entries: the
  scan passes the folder over (a validation on another node writes its own, and is no miss);
  the hook removes those unused for 30 days.
* ``<folder>/.gpu-cache-tmp.*`` (the hook's) and ``.<key>.<pid>.<hex>.tmp`` (unpack's): a
  writer's temporary file (an entry is written there, then linked or renamed to its name: a
  reader sees the whole entry or none); one older than the grace period was left by a killed
  process.

An entry is one file: prune removes it whole; the hook moves its modification time on every
hit, which is its last use.
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

from gpu_cache._hook.gpu_cache_hook import digest
from gpu_cache._hook.gpu_cache_hook.kinds.jax_triton.store import (
    ENTRY_LIMIT,
    FORMAT,
    MEMO_FOLDER,
)
from gpu_cache.core import names, safe_io, verified

#: How much of an entry a scan reads to name it.
HEAD_BYTES = 4096
KEY_RE = re.compile(r"[0-9a-f]{64}")
TEMP_PREFIX = names.TEMP_PREFIX
_KERNEL_RE = re.compile(rb'\{"format": \d+, "key": "[0-9a-f]{64}", "kernel": "((?:[^"\\]|\\.){1,500})"')
#: The fields of jax-triton's ``CompilationResult`` an entry must hold, with their types.
RESULT_FIELDS = {"binary": str, "name": str, "shared_mem_bytes": int}
TEXT_FIELDS = ("kernel", "module", "jax_triton", "triton", "target")


@dataclass(frozen=True)
class KernelEntry:
    """One file of the folder: ``key`` is its name."""

    key: str
    path: str
    size: int
    last_use: float
    name: str
    problem: str | None


def parsed(data: bytes, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(entry, None)`` where the bytes of a file, ``data``, are a whole entry of this format
    named ``key`` (as it was written: its sha256), else ``(None, why not)``."""
    try:
        body = digest.opened(data)
    except digest.Damaged as exc:
        return None, str(exc)
    if body is None:
        return None, f"not a jax-triton kernel entry of format {FORMAT}"
    try:
        entry = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return None, f"unreadable entry ({exc.__class__.__name__})"
    why = problem_of(entry, key)
    return (entry, None) if why is None else (None, why)


def problem_in(data: bytes, key: str) -> str | None:
    """Why the bytes of a file are not a whole entry of this format named ``key``, or None."""
    return parsed(data, key)[1]


def problem_of(data: Any, key: str) -> str | None:
    """Why an entry's parsed JSON is not one of this format named ``key``, or None."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a jax-triton kernel entry of format {FORMAT}"
    if data.get("key") != key:
        return "its key is not its file name"
    if not all(isinstance(data.get(name), str) for name in (*TEXT_FIELDS, "ttir")):
        return "a text field is missing"
    result = data.get("result")
    if not isinstance(result, dict):
        return "no compilation result"
    for name, kind in RESULT_FIELDS.items():
        value = result.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"its compilation result has no {name}"
    if not all(_plain(value) for value in result.values()):
        return "its compilation result holds a value of an unknown type"
    return None


def _plain(value: Any) -> bool:
    """A value a CompilationResult field may hold: text, a whole number, none, or a list of
    whole numbers (jax-triton 0.2's cluster dimensions)."""
    if value is None or isinstance(value, str):
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _name_of(path: str, info: os.stat_result) -> str:
    """The kernel's Python name, from the head of the entry ("?" where it has none)."""
    try:
        head = safe_io.read_known(path, HEAD_BYTES, info)
    except safe_io.TooLarge:
        with safe_io.open_regular(path) as fd:
            head = os.read(fd, HEAD_BYTES)
    found = _KERNEL_RE.match(head, digest.LINE)
    if found is None:
        return "?"
    try:
        return str(json.loads(b'"' + found.group(1) + b'"'))
    except ValueError:
        return "?"


def _verify(path: str, info: os.stat_result, key: str) -> str | None:
    try:
        data = safe_io.read_known(path, ENTRY_LIMIT, info)
    except OSError as exc:
        return f"unreadable entry ({exc.__class__.__name__})"
    return problem_in(data, key)


def _describe(item: os.DirEntry[str], info: os.stat_result, now: float, grace_seconds: float,
              verify_after: float | None) -> KernelEntry | None:
    """One name of the folder as an entry (None: a young temporary file, left to its writer)."""
    name = item.name
    if name.startswith(TEMP_PREFIX) or (name.startswith(".") and name.endswith(".tmp")):
        if now - info.st_mtime < grace_seconds:
            return None
        return KernelEntry(name, item.path, info.st_size, info.st_mtime, "(temporary)",
                           "stale temporary file of a killed writer")
    if not stat.S_ISREG(info.st_mode):
        what = safe_io.describe(info.st_mode)
        return KernelEntry(name, item.path, info.st_size, info.st_mtime, f"({what})",
                           f"{what} in the kernel folder (never followed; prune removes it itself)")
    if not KEY_RE.fullmatch(name):
        return KernelEntry(name, item.path, info.st_size, info.st_mtime, "?",
                           "not a jax-triton kernel entry (its name is no key)")
    problem = None
    if info.st_size == 0:
        problem = "an empty file"
    elif verify_after is not None and info.st_mtime >= verify_after:
        problem = _verify(item.path, info, name)
    try:
        kernel = _name_of(item.path, info)
    except OSError:
        kernel = "?"
    if kernel == "?" and problem is None:  # the hook writes the name first: judge the whole file
        problem = _verify(item.path, info, name)
    return KernelEntry(name, item.path, info.st_size, info.st_mtime, kernel, problem)


def scan(folder: Path, grace_seconds: float = 3600.0, verify_after: float | None = None) -> list[KernelEntry]:
    """Every entry in ``folder`` (a missing folder has none); ``verify_after``: parse and check
    the entries written after that time."""
    try:
        listing = list(os.scandir(folder))
    except OSError:
        return []
    now = time.time()
    out = []
    for item in listing:
        if item.name in (safe_io.TRASH_DIR_NAME, verified.NAME, MEMO_FOLDER):
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except OSError:
            continue
        entry = _describe(item, info, now, grace_seconds, verify_after)
        if entry is not None:
            out.append(entry)
    return out


def remove(folder: Path, entry: KernelEntry) -> None:
    """Remove one entry (one name: a link or node itself, never what it points to).

    Raises:
        OSError: it could not be removed (other than already being gone).
    """
    try:
        os.unlink(folder / entry.key)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        os.rmdir(folder / entry.key)
