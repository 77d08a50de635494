"""JAX's entries carried (:mod:`gpu_cache.core.kinds.carrying`): an executable and its last use
(``<key>-cache`` and ``<key>-atime``; older jax: the key alone), checked whole on both sides
(decompressed), written under JAX's lock where the cache has one."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Collection
from contextlib import suppress
from pathlib import Path
from typing import Any

from gpu_cache.core import names, safe_io
from gpu_cache.core.kinds import carrying
from gpu_cache.core.kinds.carrying import (
    Carried,
    Damaged,
    ManifestEntry,
    Writer,
    fill,
    member_mtime,
    new_file,
)

#: A JAX entry's key: ``<name>-<sha256 hex>``.
KEY_RE = re.compile(r"^[^/\x00]+-[0-9a-f]{64}$")


class JaxCarry(carrying.Carry):
    """File pairs (:mod:`.jax_format`), each executable decompressed whole (:mod:`.jax_frames`)."""

    device = "device"  # JAX keys hold the device topology

    def entries(self, folder: Path, wanted: set[str] | None) -> list[Carried]:
        """Every entry whose executable decompresses whole (not truncated, no bomb)."""
        from gpu_cache.core.kinds import jax_format as jax_cache
        from gpu_cache.core.kinds import jax_frames

        found = [e for e in self.kind.scan(folder, grace_seconds=3600.0) if e.name != "(temporary)"]
        out = []
        for entry in found:
            if wanted is not None and entry.key not in wanted:
                continue
            source = entry.source
            assert isinstance(source, jax_cache.JaxEntry)
            problem = entry.problem
            if problem is None and source.cache_path is not None:
                problem = jax_frames.undecompressable(source.cache_path)
            files = {p.name: p for p in (source.cache_path, source.atime_path) if p is not None}
            out.append(Carried(entry.key, entry.name, files, entry.last_use,
                               problem if problem or source.cache_path else "no -cache file"))
        return out

    def names_ok(self, key: str, files: Collection[str]) -> bool:
        """The executable, and its last use where JAX kept one."""
        names = set(files)
        return bool(KEY_RE.fullmatch(key)) and names <= {f"{key}-cache", f"{key}-atime", key} \
            and bool({f"{key}-cache", key} & names)

    def writers(self, folder: Path, dir_fd: int) -> Callable[[ManifestEntry, bool], Writer]:
        """JAX's writers; whether the cache is capped is learned once (from its entries)."""
        from gpu_cache.core.kinds import jax_format as jax_cache

        capped = os.path.lexists(folder / jax_cache.LOCK_NAME) or any(
            isinstance(e.source, jax_cache.JaxEntry) and e.source.atime_path is not None
            and e.source.cache_path is not None for e in self.kind.scan(folder))
        return lambda entry, replace: JaxWriter(folder, dir_fd, entry, replace, capped)

    def software_of(self, identity: dict[str, Any]) -> tuple[Any, ...]:
        """jaxlib is in the key; the compression (zstandard or zlib) too."""
        return (identity.get("jax"), identity.get("jaxlib"), bool(identity.get("zstandard")))

    def software_words(self, identity: dict[str, Any]) -> str:
        if not identity.get("jax"):
            return f"no jax (Python {identity.get('python') or '?'})"
        compression = "zstd" if identity.get("zstandard") else "zlib"
        return f"jax {identity['jax']} (jaxlib {identity.get('jaxlib') or '?'}, {compression})"

    def path_in_key(self, identity: dict[str, Any], records: list[dict[str, Any]]) -> bool | None:
        """jax <= 0.10 hashes the path of XLA's caches in the cache folder into every key, where
        they are on; unknown without the records' environments."""
        from gpu_cache.core import software

        xla_caches = {_text(r["env"].get(names.JAX_XLA_CACHES_VAR)) for r in records}  # (env: a mapping)
        if not xla_caches:
            return None
        version = software.release(identity.get("jax"))
        return bool(version) and version < (0, 11) and bool(xla_caches - {"none"})


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class JaxWriter(Writer):
    """Each file into a temporary file beside its name, checked, then all renamed into place
    (``-cache`` before ``-atime``) under JAX's lock where the cache has one (``capped``)."""

    def __init__(self, folder: Path, dir_fd: int, entry: ManifestEntry, replace: bool, capped: bool) -> None:
        super().__init__(folder, dir_fd, entry, replace)
        self.capped = capped
        self.temps: dict[str, str] = {}

    def _temp(self, file_name: str, write: Callable[[int], None], mtime: float) -> None:
        temp = safe_io.temp_name(file_name)
        new_file(temp, self.dir_fd, write, mtime)
        self.temps[file_name] = temp

    def add(self, file_name: str, source: Any, member: Any) -> None:
        self._temp(file_name, lambda fd: fill(fd, file_name, source, member, self.entry),
                   member_mtime(member))
        self.pending.discard(file_name)

    def _newer_here(self) -> bool:
        """A whole entry of this key that a process wrote or used since the plan was made."""
        for name in (f"{self.entry.key}-cache", self.entry.key):
            try:
                info = os.lstat(name, dir_fd=self.dir_fd)
            except FileNotFoundError:
                continue
            return stat.S_ISREG(info.st_mode) and info.st_size > 0 and info.st_mtime >= self.entry.last_use
        return False

    def finish(self) -> bool:
        from gpu_cache.core import safe_locks
        from gpu_cache.core.kinds import jax_format as jax_cache
        from gpu_cache.core.kinds import jax_frames

        key, last_use = self.entry.key, self.entry.last_use
        executable = next(n for n in (f"{key}-cache", key) if n in self.temps)
        problem = jax_frames.undecompressable(self.folder / self.temps[executable])
        if problem:
            raise Damaged(problem)
        if self.capped and f"{key}-cache" in self.temps and f"{key}-atime" not in self.temps:
            # A capped JAX reads every -atime when it evicts: give the entry one (its last use).
            self._temp(f"{key}-atime",
                       lambda fd: safe_io.write_all(fd, int(last_use * 1e9).to_bytes(8, "little")),
                       last_use)
        with safe_locks.exclusive_lock(self.folder / jax_cache.LOCK_NAME, timeout=60, create=False):
            if self._newer_here():
                return False
            for name in sorted(self.temps, key=lambda n: n.endswith("-atime")):
                os.replace(self.temps[name], name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                del self.temps[name]
        return True

    def abandon(self) -> None:
        for temp in self.temps.values():
            with suppress(OSError):
                os.unlink(temp, dir_fd=self.dir_fd)
        self.temps = {}
