"""The cache kinds gpu-cache manages: one registry that every other module reads.

Adding a kind means adding one :class:`CacheKind` to :data:`KINDS`: env exports its
variable, doctor probes its folder, and when it has an inventory, stats counts it, prune
bounds it, warm and validate diff it, and the report plots it. The startup hook
(``_hook/sitecustomize.py``, standard library only) keeps its own copy of
:data:`WATCHED_MODULES` and :data:`KEY_ENVIRONMENT`; a test fails when they drift.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache.core import names

if TYPE_CHECKING:
    from gpu_cache.core.entries import Entry
    from gpu_cache.core.verified import Record


def _inventory(name: str) -> Callable[..., Any]:
    """``gpu_cache.core.entries.<name>``, imported when first called: ``gpu-cache env`` and every
    Snakemake start read this registry, and need none of the inventories."""

    def call(*args: Any, **kwargs: Any) -> Any:
        from gpu_cache.core import entries

        return getattr(entries, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


class ReadOnlyUse(Enum):
    """How a kind uses a cache folder that it can read but not write."""

    READ = "read"  # the tool reads it as is and only warns when a write fails (JAX)
    SEED = "seed"  # read through gpu-cache's seed cache manager; new entries node-local (Triton)
    FALLBACK = "fallback"  # the tool fails when it cannot write: use a node-local folder


@dataclass(frozen=True)
class CacheKind:
    """One kind of compile cache, kept in ``<cache root>/<name>``.

    ``switch_off``: the variable and value that run the tool without any cache when its
    folder cannot be used (None: the tool always writes somewhere, so it gets a node-local
    folder). ``watched_module``: the top-level module whose import makes the startup hook
    count this kind's hits and misses (None: not observed). ``scan``/``remove``: the
    inventory (None: exported, but not yet counted or pruned). ``last_use``: where the
    inventory reads an entry's last use, for the README and stats. ``exported``: env points
    the kind's variable at its folder and doctor probes it (the records folder is set up by
    env on its own terms, only with the stats hook). ``enabled_by``: the boolean setting
    that turns an opt-in kind on. ``carried``: ``gpu-cache pack``/``unpack`` carry its entries
    to another machine (its entries do not hold the path or the host they were made on).
    ``tiered``: with the node-local tier on (issue 23), jobs work in ``<local tier>/<name>``,
    fed from and promoted to ``<cache root>/<name>`` by the startup hook. ``recorded``: the
    hook records its hits and misses without an import of its own to watch (ptxas: the shim's
    calls, counted in the record of the process that put it on ``PATH``). ``inner_folders``:
    glob patterns, below the kind's folder, of the folders the tool itself makes and writes
    into; env and doctor judge each that exists as a kind folder (whoever may add to one
    plants what the tool loads).
    """

    def enabled(self, settings: object) -> bool:
        """Whether ``settings`` (a :class:`gpu_cache.config.settings.Settings`) export this kind."""
        return self.exported and (self.enabled_by is None or bool(getattr(settings, self.enabled_by)))

    name: str
    env_var: str
    read_only: ReadOnlyUse
    switch_off: tuple[str, str] | None = None
    watched_module: str | None = None
    scan: Callable[..., list[Entry]] | None = None
    remove: Callable[[Path, Entry], None] | None = None
    last_use: str = ""
    exported: bool = True
    enabled_by: str | None = None
    verifies: bool = False
    carried: bool = False
    tiered: bool = False
    recorded: bool = False
    inner_folders: tuple[str, ...] = ()

    def folder(self, cache_root: Path) -> Path:
        """This kind's folder under ``cache_root``."""
        return cache_root / self.name

    @property
    def prunable(self) -> bool:
        return self.scan is not None and self.remove is not None


KINDS: dict[str, CacheKind] = {
    kind.name: kind for kind in (
        CacheKind(
            "jax", names.JAX_CACHE_DIR_VAR, ReadOnlyUse.READ,
            switch_off=(names.JAX_ENABLE_CACHE_VAR, "false"), watched_module="jax",
            scan=_inventory("scan_jax"), remove=_inventory("remove_jax"),
            verifies=True, carried=True, tiered=True,
            last_use="the time in JAX's -atime record where a size cap made JAX keep one: it "
                     "wins over file times, which a copy without times sets to 'now' (they "
                     "count too only where the -atime file's own mtime agrees with it); "
                     "else the -cache file's mtime, which the startup hook sets on every hit"),
        CacheKind(
            "triton", names.TRITON_CACHE_DIR_VAR, ReadOnlyUse.SEED, watched_module="triton",
            scan=_inventory("scan_triton"), remove=_inventory("remove_triton"), verifies=True,
            carried=True, tiered=True,
            last_use="the newest mtime in the key folder; the startup hook touches the folder "
                     "on every hit"),
        CacheKind("inductor", names.INDUCTOR_CACHE_DIR_VAR, ReadOnlyUse.FALLBACK,
                  watched_module="torch._inductor.codecache", scan=_inventory("scan_inductor"),
                  remove=_inventory("remove_inductor"), verifies=True, carried=True,
                  tiered=True, last_use="the newest modification or access time of the entry's files "
                           "(Inductor marks no hit; a hit reads them, which moves the access "
                           "time where the mount keeps it, at most daily with relatime)"),
        # vLLM's own compile cache root (issue 31): one entry per torch.compile hash folder;
        # vLLM makes and writes torch_compile_cache/<hash>/rank_<i>_<j>/<model part>/.
        CacheKind("vllm", names.VLLM_CACHE_ROOT_VAR, ReadOnlyUse.FALLBACK,
                  scan=_inventory("scan_vllm"), remove=_inventory("remove_vllm"),
                  inner_folders=("torch_compile_cache", "torch_compile_cache/*",
                                 "torch_compile_cache/*/*", "torch_compile_cache/*/*/*"),
                  last_use="the newest modification or access time of the entry's files (vLLM "
                           "marks no hit; a hit reads them)"),
        # Python's bytecode: the hook puts each interpreter and image in a folder of its own.
        CacheKind("bytecode", names.BYTECODE_VAR, ReadOnlyUse.FALLBACK, enabled_by="bytecode_cache",
                  scan=_inventory("scan_bytecode"), remove=_inventory("remove_file"),
                  last_use="when the .pyc file was written (Python never rewrites a current one)"),
        # The driver bounds it itself (CUDA_CACHE_MAXSIZE); gpu-cache removes it only whole.
        CacheKind("cuda", names.CUDA_CACHE_PATH_VAR, ReadOnlyUse.FALLBACK,
                  scan=_inventory("scan_cuda"), remove=_inventory("remove_cuda"),
                  last_use="the newest modification or access time of any of its files (the "
                           "whole cache is one entry)"),
        # tokamax's autotuning results per (tokamax, jax, device kind), issue 24: the hook saves
        # them in a warm process and enters the matching one in every job that imports tokamax.
        CacheKind("autotune", names.AUTOTUNE_VAR, ReadOnlyUse.READ,
                  scan=_inventory("scan_autotune"), remove=_inventory("remove_autotune"), carried=True,
                  last_use="when the warm step last wrote the result (the file's mtime)"),
        # jax-triton's Triton kernels (issue 34): compiled while JAX lowers, in every process;
        # the startup hook keeps each (its PTX) and loads it in every later process.
        CacheKind("jax_triton", names.JAX_TRITON_VAR, ReadOnlyUse.READ,
                  watched_module="jax_triton.triton_lib", scan=_inventory("scan_jax_triton"),
                  remove=_inventory("remove_jax_triton"), carried=True, tiered=True,
                  last_use="the entry's mtime, which the startup hook sets on every hit"),
        # jaxlib's ptxas runs of jax-triton kernels (issue 34): the hook's ptxas shim keeps each
        # result as one file, written whole and read whole, so it needs no node-local tier; not
        # carried (entries are made where jaxlib launches kernels, on the GPU nodes themselves).
        CacheKind("ptxas", names.PTXAS_VAR, ReadOnlyUse.READ, switch_off=(names.PTXAS_VAR, ""),
                  enabled_by="ptxas_cache", recorded=True, scan=_inventory("scan_ptxas"),
                  remove=_inventory("remove_file"),
                  last_use="the entry file's mtime, which the shim sets on every hit"),
        # Not a compile cache: the startup hook's per-process records, bounded like one.
        CacheKind("records", names.RECORDS_VAR, ReadOnlyUse.FALLBACK, exported=False,
                  scan=_inventory("scan_records"), remove=_inventory("remove_file"),
                  last_use="when the process wrote it (the file's mtime)"),
    )
}
#: Kinds whose folder env exports and doctor probes.
EXPORTED: tuple[str, ...] = tuple(name for name, kind in KINDS.items() if kind.exported)
#: Kinds whose entries gpu-cache lists and prunes.
PRUNABLE: tuple[str, ...] = tuple(name for name, kind in KINDS.items() if kind.prunable)
#: Kinds that ``gpu-cache pack`` and ``unpack`` carry (and pack by default).
CARRIED: tuple[str, ...] = tuple(name for name, kind in KINDS.items() if kind.carried)
#: Kinds that work in the node-local tier when it is on (issue 23).
TIERED: tuple[str, ...] = tuple(name for name, kind in KINDS.items() if kind.tiered)
#: Kinds whose hits and misses the startup hook records (and validation counts).
OBSERVED: tuple[str, ...] = tuple(name for name, kind in KINDS.items()
                                  if kind.watched_module or kind.recorded)
#: Modules the startup hook watches (for Inductor its code cache: a process that imports torch
#: without compiling loads nothing of the hook).
WATCHED_MODULES: tuple[str, ...] = tuple(kind.watched_module for kind in KINDS.values()
                                         if kind.watched_module)
#: Environment variables that change cache keys or where a cache is: kept in each record,
#: shown by doctor, compared by explain.
KEY_ENVIRONMENT: tuple[str, ...] = (
    "XLA_FLAGS", "JAX_ENABLE_X64", "CUDA_VISIBLE_DEVICES", "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", "LIBTPU_INIT_ARGS", "TRITON_DEFAULT_FP_FUSION",
    "TRITON_DISABLE_LINE_INFO",
)


def kind(name: str) -> CacheKind:
    """The registered kind called ``name``.

    Raises:
        KeyError: no such kind.
    """
    return KINDS[name]


def scan(name: str, folder: Path, grace_seconds: float = 3600.0,
         verify_after: float | None = None, record: Record | None = None) -> list[Entry]:
    """Every entry of kind ``name`` in ``folder``; a kind without an inventory has none.
    Temporary files younger than the grace period are left out (a writer may own them);
    ``verify_after``: verify the entries written after that time (JAX: decompress; Inductor:
    check each kernel library). ``record`` (:class:`gpu_cache.core.verified.Record` of
    ``folder``): what earlier scans read or verified, skipped now; the caller saves it."""
    scanner = KINDS[name].scan
    if scanner is None:
        return []
    with no_cyclic_gc():
        if record is None:
            return scanner(folder, grace_seconds, verify_after)
        return scanner(folder, grace_seconds, verify_after, record)


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Python's cycle collector off while a scan makes its objects: a scan of a million
    files makes millions of objects and no cycles, and each collection would walk them all
    again (a fifth of the scan's time). Reference counting frees them as ever."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def remove(name: str, folder: Path, entry: Entry) -> None:
    """Remove one whole entry of kind ``name`` so that no reader sees part of it.

    Raises:
        OSError: the entry could not be removed.
    """
    remover = KINDS[name].remove
    if remover is None:
        raise ValueError(f"cache kind {name!r} has no inventory to remove entries from")
    remover(folder, entry)


def snapshot(cache_root: Path | None, tier: Path | None = None) -> dict[str, set[str]]:
    """The keys present per observed kind (temporary folders included), to diff before/after;
    with ``tier`` (a node-local tier of the root, issue 23), a tiered kind's keys in either."""
    if cache_root is None:
        return {name: set() for name in OBSERVED}
    keys: dict[str, set[str]] = {}
    for name in OBSERVED:
        keys[name] = set()
        for top in (cache_root, tier) if tier is not None and KINDS[name].tiered else (cache_root,):
            try:
                keys[name] |= {e.key for e in scan(name, KINDS[name].folder(top), grace_seconds=0.0)}
            except (OSError, ValueError):
                pass  # unusable folder: env.resolve has said so, and the kind is elsewhere
    return keys
