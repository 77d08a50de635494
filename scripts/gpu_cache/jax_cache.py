"""JAX's persistent compilation cache on disk: entries, their last use, safe removal.

Layout (``jax/_src/lru_cache.py`` in the jax sources): ``<key>-cache`` holds the compressed executable,
``<key>-atime`` (only with a size cap) the last use as 8 little-endian bytes of
nanoseconds, and ``.lockfile`` guards both when a cap is set. ``<key>`` is
``<module name>-<sha256 hex>``.
"""

from __future__ import annotations

import os
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

ATIME_SUFFIX = "-atime"
#: A ``-cache`` file younger than this may still be being written (JAX writes in place).
WRITE_GRACE_SECONDS = 1.0
VERIFIED_STAMP = ".gpu-cache-verified"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: ``<key>-cache``/``<key>-atime``; older jax (0.4.30, as images that pin it run) writes the
#: executable as plain ``<key>`` and keeps no ``-atime``.
_FILE_RE = re.compile(r"^(?P<key>(?P<name>.+)-(?P<hash>[0-9a-f]{64}))(?:-(?P<suffix>cache|atime))?$")


@dataclass
class JaxEntry:
    """One cache entry: its ``-cache`` file, its ``-atime`` sidecar, or both.

    ``problem`` says why it is broken (then pruning removes it whatever its age): an empty
    ``-cache`` file (a full disk), one that does not decompress (truncated by a full disk
    or a killed writer; checked only when scanning with ``verify_after``), or an ``-atime``
    without its ``-cache``. ``needs_atime`` marks a ``-cache`` without ``-atime`` in a
    size-capped cache: JAX reads every ``-atime`` when it evicts, so such an entry makes
    every later write fail until it is repaired.
    """

    key: str
    name: str
    cache_path: Path | None
    atime_path: Path | None
    size: int
    last_use: float
    problem: str | None
    needs_atime: bool = False


def _read_atime(path: Path) -> float | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) != 8:
        return None
    return int.from_bytes(data, "little") / 1e9


def undecompressable(path: Path) -> str | None:
    """Why the ``-cache`` file at ``path`` cannot be what JAX wrote, or None.

    JAX compresses with zstd when ``zstandard`` is importable, else with zlib, and puts a
    4-byte compile time before the executable. A zstd entry is only checked where
    ``zstandard`` is installed (elsewhere JAX would never look it up: the compression is
    part of the key).
    """
    try:
        data = path.read_bytes()
    except OSError:
        return None  # gone or unreadable: not this check's business
    try:
        if data.startswith(_ZSTD_MAGIC):
            try:
                import zstandard  # type: ignore[import-not-found]
            except ImportError:
                return None
            plain = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        else:
            decompressor = zlib.decompressobj()
            plain = decompressor.decompress(data)
            if not decompressor.eof:
                return "truncated -cache file (the writer ran out of space or was killed)"
    except Exception as exc:  # noqa: BLE001 - zlib.error, zstandard.ZstdError: both mean corrupt
        return f"-cache file does not decompress ({type(exc).__name__}: {exc})"
    if len(plain) <= 4:
        return "-cache file holds no executable"
    return None


def scan(folder: Path, verify_after: float | None = None) -> list[JaxEntry]:
    """All entries in a JAX cache folder (missing folder: none). With ``verify_after`` (a
    time), each ``-cache`` file modified after it and older than
    :data:`WRITE_GRACE_SECONDS` is decompressed to find broken ones. Never raises for
    races: a file that disappears while scanning is skipped."""
    halves: dict[str, dict[str, tuple[Path, os.stat_result]]] = {}
    names: dict[str, str] = {}
    try:
        listing = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for item in listing:
        match = _FILE_RE.match(item.name)
        if not match:
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except OSError:
            continue
        key = match["key"]
        halves.setdefault(key, {})[match["suffix"] or "cache"] = (Path(item.path), info)
        names[key] = match["name"]
    # JAX keeps -atime files and a .lockfile only with a size cap; a lone -atime proves nothing.
    capped = (folder / ".lockfile").exists() or any(len(parts) == 2 for parts in halves.values())
    entries = []
    for key, parts in halves.items():
        cache = parts.get("cache")
        atime = parts.get("atime")
        last_use = max((info.st_mtime for _p, info in parts.values()), default=0.0)
        if atime is not None:
            last_use = max(last_use, _read_atime(atime[0]) or 0.0)
        problem = None
        if cache is None:
            problem = "-atime without -cache"
        elif cache[1].st_size == 0:
            problem = "empty -cache file (written while the disk was full)"
        elif verify_after is not None and verify_after < cache[1].st_mtime \
                < time.time() - WRITE_GRACE_SECONDS:
            problem = undecompressable(cache[0])
        entries.append(JaxEntry(
            key=key, name=names[key],
            cache_path=cache[0] if cache else None, atime_path=atime[0] if atime else None,
            size=sum(info.st_size for _p, info in parts.values()),
            last_use=last_use, problem=problem,
            needs_atime=capped and cache is not None and atime is None and problem is None,
        ))
    return entries


def verified_until(folder: Path) -> float:
    """When a prune last verified this folder's entries (0: never). Entries written later
    are verified by the next prune; the ones before were checked already."""
    try:
        return (folder / VERIFIED_STAMP).stat().st_mtime
    except OSError:
        return 0.0


def mark_verified(folder: Path, when: float) -> None:
    """Record that every entry written before ``when`` was verified.

    Raises:
        OSError: the stamp cannot be written.
    """
    stamp = folder / VERIFIED_STAMP
    stamp.touch()
    os.utime(stamp, (when, when))


def write_atime(folder: Path, entry: JaxEntry) -> None:
    """Give a lone ``-cache`` its ``-atime`` (its last use), so a capped JAX can evict again.

    Raises:
        OSError: the sidecar cannot be written.
    """
    path = folder / f"{entry.key}{ATIME_SUFFIX}"
    temp = folder / f".{entry.key}{ATIME_SUFFIX}.tmp"
    temp.write_bytes(int(entry.last_use * 1e9).to_bytes(8, "little"))
    os.replace(temp, path)
    entry.atime_path = path


def remove(folder: Path, entry: JaxEntry) -> None:
    """Delete one entry as a whole: ``-cache`` first, then ``-atime``.

    In that order a crash between the two leaves only a lone ``-atime``, which JAX ignores
    and the next prune removes; the reverse would leave a lone ``-cache`` that breaks every
    later write of a size-capped cache. When the cache has JAX's ``.lockfile``, the removal
    holds it, so a capped reader never sees half an entry.

    Raises:
        OSError: a file could not be removed (other than already being gone).
    """
    lock_path = folder / ".lockfile"
    lock = None
    if lock_path.exists():
        import filelock

        lock = filelock.FileLock(str(lock_path), timeout=30)
        lock.acquire()
    try:
        for path in (entry.cache_path, entry.atime_path):
            if path is not None:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
    finally:
        if lock is not None:
            lock.release()
