"""The ptxas shim's cache (issue 34): ``<cache root>/ptxas``, written by the startup hook's shim
(``_hook/gpu_cache_hook/kinds/ptxas/shim.py``, which defines the format).

Pure standard library. Every file is one entry, written whole (a temporary file, then a link):

* ``<64 hex>.ptxas``: one ptxas result, framed with its sha256 (the hook's ``digest``:
  a first line ``gpu-cache sha256 <hex>``, so that damage that keeps the size is found):
  ``gpu-cache ptxas entry 2``, its key, the sizes of its stdout, stderr and output and the real
  run's seconds, the key parts (kernel name, ptxas version, ptxas digest, options, input
  digest; separated by ``\\x1f``), then the three;
* ``<40 hex>.identity``: what one state of a real ptxas file said to ``--version``, with its
  digest (a lost one is made again by the next call, at the cost of one ``--version``);
* ``.gpu-cache-tmp.*``: a writer's temporary file; one older than the grace period is broken.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_cache._hook.gpu_cache_hook import digest
from gpu_cache._hook.gpu_cache_hook.kinds.ptxas.shim import (  # the shim's format: it writes the entries
    ENTRY_MAGIC,
    IDENTITY_MAGIC,
    MAX_BYTES,
    META_SEP,
)
from gpu_cache.core import names, safe_io

ENTRY_RE = re.compile(r"^([0-9a-f]{64})\.ptxas$")
IDENTITY_RE = re.compile(r"^[0-9a-f]{40}\.identity$")
TMP_PREFIX = names.TEMP_PREFIX
#: What an entry's header takes at most (the key parts are cut to 2000 characters).
HEAD_BYTES = 4096
META_FIELDS = ("name", "ptxas", "ptxas_digest", "options", "input")


@dataclass(frozen=True)
class PtxasEntry:
    """One file of the folder: ``key`` is its file name; ``parts`` the key parts of a result."""

    key: str
    name: str
    size: int
    last_use: float
    problem: str | None
    parts: dict[str, str]


def read_result(path: str, info: os.stat_result, verify: bool) -> tuple[str, dict[str, str], str | None]:
    """``(kernel name, key parts, problem)`` of the result file ``path`` (``info``: its
    stat): whole when its header names its own key and the sizes it gives add up to the
    file's; with ``verify`` the whole file is read, and it must also be as it was written
    (its sha256)."""
    try:
        if verify:
            data = safe_io.read_known(path, MAX_BYTES, info)
        else:
            with open(path, "rb", buffering=0) as stream:
                data = stream.read(digest.LINE + HEAD_BYTES)
    except safe_io.TooLarge:
        return "?", {}, f"larger than the {MAX_BYTES} bytes the shim reads"
    except OSError as exc:
        return "?", {}, f"unreadable ({exc.strerror or exc})"
    damaged = None
    if verify:
        try:
            digest.opened(data)
        except digest.Damaged as exc:
            damaged = str(exc)
    body = data[digest.LINE:]
    if not data.startswith(digest.MAGIC) or not body.startswith(ENTRY_MAGIC):
        return "?", {}, "not an entry of this gpu-cache's ptxas shim (an older one's?)"
    try:
        key, sizes, meta, _rest = body[len(ENTRY_MAGIC):].split(b"\n", 3)
        lengths = [int(n) for n in sizes.split()[:3]]
    except ValueError:
        return "?", {}, damaged or "its header is cut short"
    parts = dict(zip(META_FIELDS, meta.decode("utf-8", "replace").split(META_SEP)))
    name = parts.get("name") or "?"
    if damaged:
        return name, parts, damaged
    if ENTRY_RE.match(os.path.basename(path)).group(1) != key.decode("ascii", "replace"):
        return name, parts, "its header names another key"
    whole = digest.LINE + len(ENTRY_MAGIC) + len(key) + len(sizes) + len(meta) + 3 + sum(lengths)
    if whole != info.st_size or len(lengths) < 3 or lengths[2] == 0:
        return name, parts, "not whole (a writer was cut short)"
    return name, parts, None


def _starts_with(path: str, magic: bytes) -> bool:
    try:
        with open(path, "rb", buffering=0) as stream:
            return stream.read(len(magic)) == magic
    except OSError:
        return False


def scan(folder: Path, grace_seconds: float, verify_after: float | None = None) -> list[PtxasEntry]:
    """Every result, identity and stale temporary file in ``folder``; links and other files
    than regular ones are broken entries (the shim never reads them). ``verify_after``: read
    the results used (or written) after that time whole, and check their sha256."""
    try:
        listing = list(os.scandir(folder))
    except OSError:
        return []
    now = time.time()
    out = []
    for item in listing:
        result, temporary = ENTRY_RE.match(item.name), item.name.startswith(TMP_PREFIX)
        if not (result or temporary or IDENTITY_RE.match(item.name)):
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except OSError:
            continue
        name, parts, problem = ("ptxas identity" if not result else "?"), {}, None
        if not stat.S_ISREG(info.st_mode):
            problem = "not a regular file"
        elif temporary:
            if now - info.st_mtime < grace_seconds:
                continue  # a shim may be writing it
            name, problem = "temporary file", "left by a ptxas shim that was killed"
        elif result:
            verify = verify_after is not None and info.st_mtime >= verify_after
            name, parts, problem = read_result(item.path, info, verify)
        elif not _starts_with(item.path, IDENTITY_MAGIC):
            problem = "not an identity file of gpu-cache's ptxas shim"
        out.append(PtxasEntry(item.name, name, info.st_size, info.st_mtime, problem, parts))
    return out
