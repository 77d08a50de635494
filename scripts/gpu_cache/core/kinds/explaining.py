"""What explaining a kind's misses asks of it (``gpu-cache doctor --explain``, ``validate``:
:mod:`gpu_cache.commands.explain`, docs/kinds.md): a kind that explains its misses has an
:class:`Explain` (``kind.explain``; None: it explains none), which says why each computation a
process missed did, against what the processes before it computed (:class:`Seen`). The large
parts are the kind's own, ``<kind>_explain.py`` beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache.core import hook_records

if TYPE_CHECKING:
    from gpu_cache.core.kinds.kind import Kind
    from gpu_cache.core.reports import Missed


class Seen:
    """What the processes before the one being explained computed, per kind: grown record
    by record, so accounting for N records reads each once. Each kind keeps what it needs in
    ``by_kind`` under its own name (:meth:`Explain.seen`); ``cache_root``: where the cache is,
    for kinds that compare with its entries."""

    def __init__(self, cache_root: Path | None = None) -> None:
        self.cache_root = cache_root
        self.by_kind: dict[str, Any] = {}


class Explain:
    """How one kind explains its misses: made for its kind (``kind``), which has it as
    ``kind.explain``. As it is, it names each miss a record names, with no cause beyond its
    entry not being there: what ``doctor --explain`` says of a kind that explains none. A kind's
    part overrides what it can say more of."""

    #: What ``doctor --explain`` calls the misses of this kind that a record names.
    missed_words: str = "computations the process missed (one by one below)"

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    def record(self, record: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each computation of the kind that the record's process missed, explained against
        the ``earlier`` records (none: the kind explains no single process)."""
        return []

    def run(self, cache_root: Path, records: list[dict[str, Any]], run_id: str | None,
            limit: int = 20) -> tuple[list[dict[str, Any]], list[str]]:
        """Why a run's misses of the kind missed (:meth:`record` of each of its processes,
        against every record written before it; at most ``limit``), and a problem line for
        each explained one, for ``validate``."""
        ordered = sorted(records, key=_time)
        out: list[dict[str, Any]] = []
        for record in ordered:
            if record.get("run_id") == run_id and len(out) < limit:
                earlier = [r for r in ordered if _time(r) < _time(record) and r is not record]
                out += self.record(record, earlier)[:limit - len(out)]
        return out, [self.problem_line(e) for e in out if e["causes"]]

    def problem_line(self, explained: dict[str, Any]) -> str:
        """The problem line of one explained miss."""
        return f"{self.kind.name}: {explained['name']} missed: {explained['causes'][0]}"

    def misses(self, record: dict[str, Any], section: dict[str, Any], misses: int, seen: Seen,
               room: int) -> list[tuple[str, int, list[dict[str, Any]]]]:
        """A process's ``misses`` of the kind explained computation by computation (``doctor
        --explain``): (cause, how many, at most ``room`` explanations in all). ``seen``: what the
        processes before it computed."""
        named = hook_records.missed_of(section, self.kind.name)[:misses]
        keys = [self.missed(m, record, seen) for m in named[:room]]
        out = [(self.missed_words, len(named), keys)]
        rest = misses - len(named)
        if rest:
            out.append(self.unnamed(record, rest, seen, room - len(keys)))
        return [cause for cause in out if cause[1]]

    def missed(self, miss: Missed, record: dict[str, Any], seen: Seen) -> dict[str, Any]:
        """One miss a record names, explained against what ``seen`` holds."""
        return {"name": miss.name, "key": miss.key, "compared_with": None, "changed": [],
                "causes": ["its entry was not in the cache"]}

    def unnamed(self, record: dict[str, Any], rest: int, seen: Seen, room: int
                ) -> tuple[str, int, list[dict[str, Any]]]:
        """The cause of ``rest`` misses that the record counts but does not name."""
        return ("the process compiled more than its record could name", rest, [])

    def seen(self, record: dict[str, Any], seen: Seen) -> None:
        """Add what a record's process computed to ``seen``, for the later processes' misses."""


class AgainstEntries(Explain):
    """A kind whose misses are each compared with the cache's entries, read once: each item of
    a record's ``missed`` explained against them, and a problem line by its last cause (what
    changed, or why there was none)."""

    #: What reads the kind's entries in a folder (None: none), and explains against them one
    #: missed item of a record: ``entries(folder).explain(item, record)``.
    entries: Callable[[Path | None], Any]

    def run(self, cache_root: Path, records: list[dict[str, Any]], run_id: str | None,
            limit: int = 20) -> tuple[list[dict[str, Any]], list[str]]:
        entries = self.entries(self.kind.folder(cache_root))
        explained = [entries.explain(item, record) for record in records
                     if run_id is None or record.get("run_id") == run_id
                     for item in missed_items(self.kind.section(record) or {})][:limit]
        name = self.kind.name
        return [], [f"{name}: {e['name']} missed: {e['causes'][-1]}" for e in explained if e["causes"]]

    def misses(self, record: dict[str, Any], section: dict[str, Any], misses: int, seen: Seen,
               room: int) -> list[tuple[str, int, list[dict[str, Any]]]]:
        name, root = self.kind.name, seen.cache_root
        if name not in seen.by_kind:  # the cache's entries, read at the first use
            seen.by_kind[name] = self.entries(None if root is None else self.kind.folder(root))
        items = missed_items(section)[:misses]
        explained = [seen.by_kind[name].explain(item, record) for item in items[:room]]
        out = [(self.missed_words, len(items), explained)]
        if misses - len(items):
            out.append(self.unnamed(record, misses - len(items), seen, room - len(explained)))
        return [cause for cause in out if cause[1]]


def compared(parts: dict[str, Any], others: list[dict[str, Any]], hints: dict[str, str]
             ) -> tuple[list[str], list[str]]:
    """The key parts (those ``hints`` names) in which ``parts`` differ from the closest of
    ``others`` (the one that differs in fewest), and a cause for each: its hint, with both values."""
    closest = min(others, key=lambda other: sum(other.get(f) != parts.get(f) for f in hints))
    changed = [f for f in hints if closest.get(f) != parts.get(f)]
    return changed, [f"{f}: {hints[f]} ({closest.get(f)!r} before, {parts.get(f)!r} now)" for f in changed]


def missed_items(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The items of a record section's ``missed`` (any JSON) that are mappings."""
    missed = section.get("missed")
    return [m for m in missed if isinstance(m, dict)] if isinstance(missed, list) else []


def _time(record: dict[str, Any]) -> float:
    return float(record.get("time") or 0.0)
