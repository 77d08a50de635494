"""Cache entries of every kind behind one shape, for pruning and statistics.

Each inventoried kind has a ``scan_<kind>`` and a ``remove_<kind>`` here; the registry in
:mod:`gpu_cache.core.kinds` says which kind uses which.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from gpu_cache.core import names
from gpu_cache.core.caches import autotune as autotune_cache
from gpu_cache.core.caches import cuda as cuda_cache
from gpu_cache.core.caches import inductor as inductor_cache
from gpu_cache.core.caches import jax as jax_cache
from gpu_cache.core.caches import jax_triton as jax_triton_cache
from gpu_cache.core.caches import ptxas as ptxas_cache
from gpu_cache.core.caches import triton as triton_cache
from gpu_cache.core.caches import vllm as vllm_cache
from gpu_cache.core.verified import Record


@dataclass
class Entry:
    """One whole cache entry. ``problem`` is set for a broken one (pruning removes it).
    ``removable``: False for what gpu-cache counts but never removes (a CUDA cache whose
    layout it does not recognise)."""

    kind: str
    key: str
    name: str
    size: int
    last_use: float
    problem: str | None
    source: object  # the kind's own record of the entry, for removal
    removable: bool = True


def scan_jax(folder: Path, grace_seconds: float, verify_after: float | None = None,
             record: Record | None = None) -> list[Entry]:
    """JAX entries; ``verify_after``: decompress those written after that time (and not
    verified before, by ``record``). Temporary files of an interrupted prune older than
    ``grace_seconds`` come as broken entries."""
    return [Entry("jax", e.key, e.name, e.size, e.last_use, e.problem, e)
            for e in jax_cache.scan(folder, verify_after, temp_grace=grace_seconds, record=record)]


def remove_jax(folder: Path, entry: Entry) -> None:
    """Remove a JAX entry: ``-cache`` first, then ``-atime``.

    Raises:
        OSError: a file could not be removed.
    """
    assert isinstance(entry.source, jax_cache.JaxEntry)
    jax_cache.remove(folder, entry.source)


def scan_triton(folder: Path, grace_seconds: float, verify_after: float | None = None,
                record: Record | None = None) -> list[Entry]:
    """Triton key folders, stale writers' temporary folders, and trash left by a removal."""
    try:
        inventory = triton_cache.scan(folder, record)
    except triton_cache.TritonCacheError:
        return []  # not a folder: doctor and env report it
    now = inventory.scanned_at
    out = []
    for item in inventory.entries:
        problem = None
        if not item.complete or item.points_outside:
            # Triton writes the group manifest last: a young incomplete group may be mid-write.
            if now - item.mtime < grace_seconds:
                continue
            problem = "; ".join(item.problems) or "incomplete group"
        out.append(Entry("triton", item.key, item.kernel or item.kind, item.bytes, item.mtime,
                         problem, item))
    for temp in inventory.temp_dirs:
        if temp.age_seconds >= grace_seconds:
            out.append(Entry("triton", f"{temp.key}/{temp.path.name}", "(temporary)", temp.bytes,
                             now - temp.age_seconds, "stale temporary folder of a killed writer", temp))
    for other in inventory.others:
        if other.kind == "trash":
            out.append(Entry("triton", other.path.name, "(trash)", other.bytes, 0.0,
                             "left over from an interrupted removal", other))
        elif other.kind == "file" and other.path.name.startswith(names.TEMP_PREFIX):
            try:
                changed = other.path.lstat().st_mtime
            except OSError:
                continue
            if now - changed >= grace_seconds:  # a younger one may be mid-promotion
                out.append(Entry("triton", other.path.name, "(temporary)", other.bytes, changed,
                                 "stale temporary file of an interrupted promotion from a "
                                 "node-local tier", other))
        elif other.kind == "symlink":
            # Triton writes real folders only; a link would make it load (or write) elsewhere.
            out.append(Entry("triton", other.path.name, "(symbolic link)", 0, 0.0,
                             "a symbolic link in the cache folder (never followed; prune removes "
                             "the link itself)", other))
    return out


def remove_triton(folder: Path, entry: Entry) -> None:
    """Remove a Triton entry: a key folder is renamed into a trash folder (atomic on one
    filesystem) and then deleted, so a reader finds either the whole group or none of it.

    Raises:
        OSError: the entry could not be removed.
    """
    source = entry.source
    if isinstance(source, triton_cache.TritonEntry):
        triton_cache.remove_entry(folder, source.key)
    elif isinstance(source, triton_cache.TempDir):
        triton_cache.remove_temp_dir(source)
    elif isinstance(source, triton_cache.OtherPath) and source.kind == "symlink":
        if source.path.is_symlink():  # (a trash link is replaced by a folder on first use)
            try:
                source.path.unlink()  # the link itself, never what it points to
            except FileNotFoundError:
                pass
    elif isinstance(source, triton_cache.OtherPath) and source.kind == "file":
        try:
            source.path.unlink()  # a promotion's temporary file (never followed)
        except FileNotFoundError:
            pass
    else:
        triton_cache.empty_trash(folder)


def scan_records(folder: Path, grace_seconds: float, verify_after: float | None = None,
                 record: Record | None = None) -> list[Entry]:
    """The records as entries of their own kind, so that prune bounds them by age and size:
    each ``*.json`` file is one entry (last use: when it was written); a half-written
    ``.*.json.tmp`` older than the grace period, or anything that is not a regular file, is
    broken."""
    try:
        listing = list(os.scandir(folder))
    except OSError:
        return []
    now = time.time()
    out = []
    for item in listing:
        temporary = item.name.startswith(".") and item.name.endswith(".tmp")
        if not (item.name.endswith(".json") or temporary):
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except OSError:
            continue
        problem = None
        if not stat.S_ISREG(info.st_mode):
            problem = "not a regular file"
        elif temporary:
            if now - info.st_mtime < grace_seconds:
                continue  # a process may be writing it right now
            problem = "half-written record of a process that was killed or ran out of space"
        out.append(Entry("records", item.name, "record", info.st_size, info.st_mtime, problem,
                         item.path))
    return out


def remove_file(folder: Path, entry: Entry) -> None:
    """Delete an entry that is one file (a record, a ``.pyc``): a link or node is removed
    itself, never followed; a process that needs it again writes or compiles it anew.

    Raises:
        OSError: it could not be removed (other than already being gone).
    """
    try:
        os.unlink(folder / entry.key)
    except FileNotFoundError:
        pass


def scan_bytecode(folder: Path, grace_seconds: float, verify_after: float | None = None,
                  record: Record | None = None) -> list[Entry]:
    """Each ``.pyc`` file under the bytecode folder is one entry (key: its path below the
    folder); Python writes it through a temporary file and a rename, so a ``.pyc`` is whole,
    and a leftover temporary older than the grace period is broken."""
    out = []
    now = time.time()
    base = os.fspath(folder)
    skip = len(base) + 1
    pending = [base]
    while pending:
        try:
            listing = os.scandir(pending.pop())
        except OSError:
            continue
        with listing:
            for item in listing:
                try:
                    info = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    pending.append(item.path)  # (a link to a folder is an entry: never followed)
                    continue
                name = item.name
                temporary = not name.endswith(".pyc")
                if temporary and now - info.st_mtime < grace_seconds:
                    continue  # an interpreter may be writing it
                problem = None
                if not stat.S_ISREG(info.st_mode):
                    problem = "not a regular file"
                elif temporary:
                    problem = "temporary file of an interpreter that was killed"
                out.append(Entry("bytecode", item.path[skip:], name.split(".", 1)[0],
                                 info.st_size, info.st_mtime, problem, item.path))
    return out


def scan_inductor(folder: Path, grace_seconds: float, verify_after: float | None = None,
                  record: Record | None = None) -> list[Entry]:
    """Inductor's entries (:mod:`gpu_cache.core.caches.inductor`): code files of one key with its
    lock, FX graph and AOTAutograd key folders, every other file; with ``verify_after``,
    each C++ kernel library is checked to be whole (once per file state, by ``record``)."""
    return [Entry("inductor", e.key, e.name, e.size, e.last_use, e.problem, e)
            for e in inductor_cache.scan(folder, grace_seconds, verify_after is not None, record)]


def remove_inductor(folder: Path, entry: Entry) -> None:
    """Remove an Inductor entry whole (a code entry under its lock; a key folder renamed
    away first).

    Raises:
        OSError: it could not be removed (EBUSY: being compiled right now).
    """
    assert isinstance(entry.source, inductor_cache.InductorEntry)
    inductor_cache.remove(folder, entry.source)


def scan_vllm(folder: Path, grace_seconds: float, verify_after: float | None = None,
              record: Record | None = None) -> list[Entry]:
    """vLLM's entries (:mod:`gpu_cache.core.caches.vllm`): each torch.compile hash folder, and
    every other name at the top of its cache root."""
    return [Entry("vllm", e.key, e.name, e.size, e.last_use, e.problem, e) for e in vllm_cache.scan(folder)]


def remove_vllm(folder: Path, entry: Entry) -> None:
    """Remove a vLLM entry whole (a folder renamed away first).

    Raises:
        OSError: it could not be removed.
    """
    assert isinstance(entry.source, vllm_cache.VllmEntry)
    vllm_cache.remove(folder, entry.source)


def scan_cuda(folder: Path, grace_seconds: float, verify_after: float | None = None,
              record: Record | None = None) -> list[Entry]:
    """The CUDA driver's cache as one entry (:mod:`gpu_cache.core.caches.cuda`); one whose layout
    is not recognised is counted but never removed."""
    found = cuda_cache.scan(folder)
    if found is None:
        return []
    name = cuda_cache.LAYOUT if found.recognised else \
        f"(layout not recognised: {found.why_not}; counted, never pruned)"
    return [Entry("cuda", cuda_cache.LAYOUT, name, found.size, found.last_use, None, found,
                  removable=found.recognised)]


def remove_cuda(folder: Path, entry: Entry) -> None:
    """Remove the whole CUDA cache (the driver starts a new one).

    Raises:
        OSError: it could not be removed, or its layout was not recognised.
    """
    assert isinstance(entry.source, cuda_cache.CudaCache)
    cuda_cache.remove(folder, entry.source)


def scan_autotune(folder: Path, grace_seconds: float, verify_after: float | None = None,
                  record: Record | None = None) -> list[Entry]:
    """Autotuning results (:mod:`gpu_cache.core.caches.autotune`): one entry per result file,
    named by its device kind."""
    return [Entry("autotune", e.key, e.device_kind, e.size, e.last_use, e.problem, e)
            for e in autotune_cache.scan(folder, grace_seconds)]


def scan_ptxas(folder: Path, grace_seconds: float, verify_after: float | None = None,
               record: Record | None = None) -> list[Entry]:
    """The ptxas shim's files (:mod:`gpu_cache.core.caches.ptxas`): each result (named by its
    kernel) and each identity file is one entry; every result's header is checked whole, and
    ``verify_after``: the sha256 of those used after that time."""
    return [Entry("ptxas", e.key, e.name, e.size, e.last_use, e.problem, e)
            for e in ptxas_cache.scan(folder, grace_seconds, verify_after)]


def remove_autotune(folder: Path, entry: Entry) -> None:
    """Remove one autotuning result whole.

    Raises:
        OSError: it could not be removed.
    """
    assert isinstance(entry.source, autotune_cache.AutotuneEntry)
    autotune_cache.remove(folder, entry.source)


def scan_jax_triton(folder: Path, grace_seconds: float, verify_after: float | None = None,
                    record: Record | None = None) -> list[Entry]:
    """jax-triton's kernels kept by the startup hook (:mod:`gpu_cache.core.caches.jax_triton`):
    one entry per file, named by its kernel."""
    return [Entry("jax_triton", e.key, e.name, e.size, e.last_use, e.problem, e)
            for e in jax_triton_cache.scan(folder, grace_seconds, verify_after)]


def remove_jax_triton(folder: Path, entry: Entry) -> None:
    """Remove one jax-triton kernel entry (one file).

    Raises:
        OSError: it could not be removed.
    """
    assert isinstance(entry.source, jax_triton_cache.KernelEntry)
    jax_triton_cache.remove(folder, entry.source)
