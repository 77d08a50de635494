"""The cache kinds gpu-cache manages: one registry, a tuple of kind objects: those listed
here, then those found beside them (docs/kinds.md).

Adding a kind means writing its module here (a :class:`Kind` and its inventory, as
``KIND``): the registry finds it (:func:`_found`) and adds it to :data:`ALL` after the kinds
listed here; env exports its variable, doctor probes its folder, stats counts it,
prune bounds it, warm and validate diff it, the report plots it, and the contract suite
(tests/test_kind_contract.py) runs its faults and attacks on it. Generic code iterates
:data:`ALL` and calls the objects; it never names a kind. A name becomes a kind only where a
name comes from outside (an argument, a key of a report or record): :func:`named`. Each kind's
piece of the startup hook (``_hook/gpu_cache_hook/kinds/``, standard library only) declares the
job side's facts of the kind (the modules it watches, its tier layout, its folders judged on
every node, its software, the variables that change its keys), which the kind reads
(``Kind.piece``) rather than declaring them again.

A kind's module imports its format code (``<kind>_format.py``) in the methods that use it, and so
do its facets (``<kind>_carry.py``, ``<kind>_explain.py``, which it imports to make them): ``gpu-cache
env`` and every Snakemake start read this registry, and need none of the inventories.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from gpu_cache._hook.gpu_cache_hook.names import environment
from gpu_cache.core import safe_io
from gpu_cache.core.kinds import (
    autotune,
    bytecode,
    cuda,
    inductor,
    jax,
    jax_triton,
    ptxas,
    records,
    triton,
    vllm,
)
from gpu_cache.core.kinds.explaining import Seen
from gpu_cache.core.kinds.kind import (
    Entry,
    Exported,
    Kind,
    ReadOnlyUse,
    in_tier,
    no_cyclic_gc,
    tier_name,
)
from gpu_cache.core.reports import KindTotals

__all__ = ["ALL", "KINDS", "Entry", "Exported", "Kind", "ReadOnlyUse", "Seen", "named", "no_cyclic_gc",
           "tier_name"]

#: The kinds in the order reports list them (the kinds found beside them follow, by name).
_LISTED: tuple[Kind, ...] = (jax.KIND, triton.KIND, inductor.KIND, vllm.KIND, bytecode.KIND, cuda.KIND,
                             autotune.KIND, jax_triton.KIND, ptxas.KIND, records.KIND)
#: The modules here that are no kind: the interface and what kinds share.
_SHARED = ("kind", "layouts", "integrity", "carrying", "explaining")


def _found(listed: tuple[Kind, ...]) -> tuple[Kind, ...]:
    """The ``KIND`` of each module of this package that is not listed, not shared and not a
    kind's part (``<module>_<part>``, beside its module: loaded on use), by module name: a new
    kind needs no line here (tests/test_kinds.py fails for a module whose kind is left out)."""
    here = os.path.dirname(__file__)
    modules = sorted(name[:-3] for name in os.listdir(here)
                     if name.endswith(".py") and not name.startswith("_"))
    known = {kind.__module__.rpartition(".")[2] for kind in listed} | set(_SHARED)
    found = []
    for module in modules:
        if module in known or any(module.startswith(other + "_") for other in modules):
            continue
        found.append(importlib.import_module(f"{__name__}.{module}").KIND)
    return tuple(found)


#: Every kind, in the order reports list them.
ALL: tuple[Kind, ...] = _LISTED + _found(_LISTED)
#: The kinds by name: for names that come from outside (arguments, reports, records).
KINDS: dict[str, Kind] = {kind.name: kind for kind in ALL}
#: The kinds whose folder env exports and doctor probes.
EXPORTED: tuple[Kind, ...] = tuple(kind for kind in ALL if kind.exported)
#: The kinds whose entries gpu-cache lists and prunes (every kind has an inventory).
PRUNABLE: tuple[Kind, ...] = ALL
#: The kinds that ``gpu-cache pack`` and ``unpack`` carry (and pack by default).
CARRIED: tuple[Kind, ...] = tuple(kind for kind in ALL if kind.carry is not None)
#: The kinds that work in the node-local tier when it is on (issue 23).
TIERED: tuple[Kind, ...] = tuple(kind for kind in ALL if kind.tiered)
#: The kinds whose hits and misses the startup hook records (and validation counts).
OBSERVED: tuple[Kind, ...] = tuple(kind for kind in ALL if kind.observed)
#: Environment variables that change what the kinds' tools compile, where their caches are or
#: which devices run, as their pieces declare them: kept in each record, shown by doctor,
#: compared by explain.
KEY_ENVIRONMENT: tuple[str, ...] = environment(kind.piece for kind in ALL)


def named(name: str) -> Kind:
    """The registered kind called ``name`` (a name from an argument, a report or a record).

    Raises:
        KeyError: no such kind.
    """
    return KINDS[name]


def names_of(found: tuple[Kind, ...]) -> list[str]:
    """The names of the kinds ``found`` (a view), as reports, schemas and help texts list them."""
    return [kind.name for kind in found]


def records_dir(cache_root: Path) -> Path | None:
    """Where the hook writes its records under a cache root (the records kind's folder, links
    resolved); None when that leads out of the root: the hook refuses such a folder, so what is
    there is not its records (a link to a folder of the user's own files, #21)."""
    try:
        return safe_io.within(records.KIND.folder(cache_root), cache_root)
    except safe_io.Outside:
        return None


def record_totals(found: list[dict[str, Any]]) -> dict[str, KindTotals]:
    """Hits, misses and compile seconds per kind summed over the records ``found``: for every
    observed kind, and any other whose section some record holds (:meth:`Kind.totals`)."""
    return {kind.name: totals for kind in ALL if (totals := kind.totals(found)) is not None}


def in_tier_of(folder: str, root: Path | str) -> bool:
    """Whether ``folder`` is a tiered kind's folder in a node-local tier of ``root``: a job's
    cache folder that is the root's."""
    return any(in_tier(folder, root, kind.name) for kind in TIERED)


def snapshot(cache_root: Path | None, tier: Path | None = None) -> dict[str, set[str]]:
    """The keys present per observed kind (temporary folders included), to diff before/after;
    with ``tier`` (a node-local tier of the root, issue 23), a tiered kind's keys in either."""
    observed = [kind for kind in ALL if kind.observed]
    if cache_root is None:
        return {kind.name: set() for kind in observed}
    keys: dict[str, set[str]] = {}
    for kind in observed:
        keys[kind.name] = set()
        for top in (cache_root, tier) if tier is not None and kind.tiered else (cache_root,):
            try:
                keys[kind.name] |= {e.key for e in kind.scan(kind.folder(top), grace_seconds=0.0)}
            except (OSError, ValueError):
                pass  # unusable folder: env.resolve has said so, and the kind is elsewhere
    return keys


def broken_since(cache_root: Path | None, since: float, tier: Path | None = None) -> list[str]:
    """A problem line per kind whose entries written since ``since`` (in the root, or in its
    node-local ``tier``) are broken by the kind's own check (:meth:`Kind.new_since`: a full
    disk or a killed writer)."""
    if cache_root is None:
        return []
    lines = []
    for kind in ALL:
        found = []
        for top in (cache_root,) if tier is None else (cache_root, tier):
            try:
                found += kind.new_since(kind.folder(top), since)
            except OSError:
                pass  # unreadable: the cache environment reported the folder already
        if found:
            lines.append(f"{kind.name}: {len(found)} cache entries written now are broken "
                         f"({found[0].problem}); is the disk full? `gpu-cache doctor --fix` or the "
                         "next prune removes them")
    return lines
