"""JAX's persistent compilation cache as a kind: the file-pair layout (``<key>-cache`` and
``<key>-atime``), its own integrity check (each ``-cache`` decompresses whole, and its CRC is
the one recorded when it was first verified), and the variables that make it safe.
(The format itself: :mod:`gpu_cache.core.kinds.jax_format`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_cache.core import names
from gpu_cache.core.kinds.jax_carry import JaxCarry
from gpu_cache.core.kinds.jax_explain import JaxExplain
from gpu_cache.core.kinds.kind import Entry, Exported, Kind, ReadOnlyUse
from gpu_cache.core.verified import Record


class _Jax(Kind):
    name = "jax"
    env_var = names.JAX_CACHE_DIR_VAR
    read_only = ReadOnlyUse.READ
    switch_off = (names.JAX_ENABLE_CACHE_VAR, "false")
    own_check = True
    records_folder = True
    own_compile_field = "own_compile_seconds"  # its compile_seconds has hits and waits in it
    last_use = ("the time in JAX's -atime record where a size cap made JAX keep one: it "
                "wins over file times, which a copy without times sets to 'now' (they "
                "count too only where the -atime file's own mtime agrees with it); "
                "else the -cache file's mtime, which the startup hook sets on every hit")

    @property
    def write_grace(self) -> float:  # type: ignore[override]
        """JAX writes entries in place: one younger than this may be mid-write."""
        from gpu_cache.core.kinds import jax_format as jax_cache

        return jax_cache.WRITE_GRACE_SECONDS

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: Record | None) -> list[Entry]:
        """``verify_after``: decompress the entries written after that time (and not verified
        before, by ``record``). Temporary files of an interrupted prune older than
        ``grace_seconds`` come as broken entries."""
        from gpu_cache.core.kinds import jax_format as jax_cache

        return [Entry(self, e.key, e.name, e.size, e.last_use, e.problem, e,
                      path=e.cache_file or e.atime_file)
                for e in jax_cache.scan(folder, verify_after, temp_grace=grace_seconds, record=record)]

    def _remove(self, folder: Path, entry: Entry) -> None:
        """``-cache`` first, then ``-atime``, under JAX's lock."""
        from gpu_cache.core.kinds import jax_format as jax_cache

        assert isinstance(entry.source, jax_cache.JaxEntry)
        jax_cache.remove(folder, entry.source)

    def repair(self, folder: Path, found: list[Entry]) -> tuple[int, list[str]]:
        """A ``.lockfile`` that is not a regular file goes; a lone ``-cache`` of a capped cache
        gets its ``-atime`` (without it, every later write of a capped JAX fails)."""
        from gpu_cache.core.kinds import jax_format as jax_cache

        repaired, errors = 0, []
        try:
            if jax_cache.repair_lockfile(folder):
                repaired += 1
        except OSError as exc:
            errors.append(f"{jax_cache.LOCK_NAME}: {exc.strerror or exc}")
        for entry in found:
            if isinstance(entry.source, jax_cache.JaxEntry) and entry.source.needs_atime:
                try:
                    jax_cache.write_atime(folder, entry.source)
                    repaired += 1
                except OSError as exc:
                    errors.append(f"{entry.key}: cannot write its -atime: {exc.strerror or exc}")
        return repaired, errors

    def present(self, folder: Path, key: str) -> bool:
        return (folder / f"{key}-cache").is_file() or (folder / key).is_file()  # jax 0.4.30: the key alone

    def volatile(self, file_name: str) -> bool:
        return file_name.endswith("-atime")  # rewritten on every use of a capped cache

    def new_since(self, folder: Path, since: float) -> list[Entry]:
        """Empty or truncated entries (a full disk or a killed writer; JAX itself never repairs
        them); entries younger than :data:`jax_cache.WRITE_GRACE_SECONDS` may be mid-write."""
        from gpu_cache.core.kinds import jax_format as jax_cache

        return [Entry(self, e.key, e.name, e.size, e.last_use, e.problem, e)
                for e in jax_cache.scan(folder, since - 1.0) if e.problem]

    def exports(self, folder: Path, settings: Any, network_fs: str | None, tier: bool) -> Exported:
        """Every compile is kept (no minimum time or size); XLA's own caches as configured,
        except on a network filesystem, where its autotune cache fails atomic renames and
        crashes (they stay off), and in a node-local tier, where its per-fusion autotune cache
        is safe to keep."""
        xla_caches, adjusted = settings.xla_caches, None
        if tier and xla_caches == "none":
            xla_caches = names.XLA_AUTOTUNE_CACHE
        elif network_fs is not None and xla_caches != "none":
            adjusted = (f"{folder} is on {network_fs}, where XLA's autotune cache fails atomic renames "
                        f"and crashes; exporting {names.JAX_XLA_CACHES_VAR}=none instead of {xla_caches!r}")
            xla_caches = "none"
        return Exported({names.JAX_MIN_COMPILE_TIME_VAR: "0", names.JAX_MIN_ENTRY_SIZE_VAR: "-1",
                         names.JAX_XLA_CACHES_VAR: xla_caches}, adjusted)

    def missed_name(self, key: str) -> str:
        return key.rsplit("-", 1)[0]

    def outside_fix(self, own_flag: bool) -> str:
        if own_flag:
            return ("its program sets its own folder (a flag such as --jax_compilation_cache_dir, or "
                    f"jax.config.update): drop that flag or point it at ${self.env_var}")
        return f"its {self.env_var} was set outside gpu-cache: unset it"


KIND = _Jax(carry=JaxCarry, explain=JaxExplain)
