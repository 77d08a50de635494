"""The interface of a cache kind, and what every kind does alike (docs/kinds.md).

A kind subclasses :class:`Kind` (usually through one of the layouts of
:mod:`gpu_cache.core.kinds.layouts`), sets the class attributes that say what it is, implements
``_entries`` and ``_remove``, and overrides the other methods where it differs from the
default. Generic code calls only the public methods: :meth:`Kind.scan` applies the trust rule
(and, for sealed kinds, the integrity check) to every kind's entries alike.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_cache._hook.gpu_cache_hook.names import Facts, pieces
from gpu_cache.core import hook_records, names, owners, safe_io, verified
from gpu_cache.core.kinds import integrity
from gpu_cache.core.reports import KindTotals

if TYPE_CHECKING:
    from gpu_cache.core.kinds.carrying import Carry
    from gpu_cache.core.kinds.explaining import Explain


class ReadOnlyUse(Enum):
    """How a kind uses a cache folder that it can read but not write."""

    READ = "read"  # the tool reads it as is and only warns when a write fails (JAX)
    SEED = "seed"  # read through gpu-cache's seed cache manager; new entries node-local (Triton)
    FALLBACK = "fallback"  # the tool fails when it cannot write: use a node-local folder


@dataclass
class Entry:
    """One whole cache entry. ``problem`` is set for a broken one (pruning removes it).
    ``removable``: False for what gpu-cache counts but never removes (a CUDA cache whose
    layout it does not recognise). ``path``: the entry's file or folder (of a file pair, its
    main file), which the trust rule judges; None where the entry has none of its own."""

    kind: str
    key: str
    name: str
    size: int
    last_use: float
    problem: str | None
    source: object  # the kind's own record of the entry, for removal
    removable: bool = True
    path: str | None = None


#: A write probe of ``gpu-cache env`` dated further than this from now, either way, is an entry
#: like any other (prune bounds it): one older was left by a killed process, and one dated ahead
#: is none that env is making (a network filesystem's clock, or by hand; never counted nor
#: pruned, 601 of 801 MB of them stayed under a 1 KB bound).
PROBE_STALE = 3600.0


def _fresh_probe(entry: Entry) -> bool:
    """Whether ``entry`` is a write probe ``gpu-cache env`` may still be using
    (:func:`gpu_cache.jobenv.fs`'s ``.gpu-cache-probe-*``, made, renamed and removed at once):
    its name, and a date within :data:`PROBE_STALE` of now."""
    name = os.path.basename(entry.path) if entry.path else entry.key
    if not name.startswith(names.PROBE_PREFIX):
        return False
    try:
        written = os.lstat(entry.path).st_mtime if entry.path else entry.last_use
    except OSError:
        return True  # gone already: it was one
    return abs(time.time() - written) < PROBE_STALE


@dataclass
class Exported:
    """What a kind's folder brings to the jobs' environment besides its own variable:
    ``values`` to set, and ``adjusted``: a setting gpu-cache changed to keep the cache safe."""

    values: dict[str, str]
    adjusted: str | None = None


class Kind:
    """One kind of compile cache, kept in ``<cache root>/<name>``.

    ``switch_off``: the variable and value that run the tool without any cache when its
    folder cannot be used (None: the tool always writes somewhere, so it gets a node-local
    folder). ``last_use``: where the inventory reads an entry's last use, for the README and
    stats. ``exported``: env points the kind's variable at its folder and doctor probes it.
    ``enabled_by``: the boolean setting that turns an opt-in kind on. ``recorded``: the hook
    records its hits and misses without an import of its own to watch (ptxas: the shim's calls).
    What the job side does with the kind (the modules the startup hook watches, its layout in
    the node-local tier, the folders judged on each node, its software) its hook piece declares:
    :attr:`piece` (``tiered``, ``observed``). ``needs_hook``: its variable set, jobs need the startup
    hook (it is the hook that serves the kind). ``inner_folders``: glob patterns, below the
    kind's folder, of the folders the tool itself makes and writes into; env and doctor judge
    each that exists as a kind folder (whoever may add to one plants what the tool loads);
    :meth:`inner` lists them.
    Integrity (docs/kinds.md): ``own_check``: its inventory checks entries with the kind's own
    format check, keeping what it verified in the folder's verification record
    (:mod:`gpu_cache.core.verified`); ``sealed``: a verifying scan seals each whole entry's
    files there and finds the same-size damage of one sealed before
    (:mod:`gpu_cache.core.kinds.integrity`); neither: ``unsealed_why`` says why not.
    Facets, objects a kind has where they apply (None where not): ``carry``, how ``gpu-cache
    pack``/``unpack`` carry its entries to another machine (:mod:`.carrying`); ``explain``, how
    ``doctor --explain`` and ``validate`` explain its misses (:mod:`.explaining`). A kind makes
    them as it is made: ``KIND = _Jax(carry=JaxCarry, explain=JaxExplain)``.
    """

    name: str = ""
    env_var: str = ""
    read_only: ReadOnlyUse = ReadOnlyUse.FALLBACK
    switch_off: tuple[str, str] | None = None
    last_use: str = ""
    exported: bool = True
    enabled_by: str | None = None
    recorded: bool = False
    needs_hook: bool = False
    inner_folders: tuple[str, ...] = ()
    #: A hit only reads the entry (its tool marks nothing): the access times of its files
    #: count in its last use, and gpu-cache's own reads never move them.
    read_is_use: bool = False
    own_check: bool = False
    sealed: bool = False
    unsealed_why: str = ""
    #: The words after "<name> " in the problem of a kind whose folder cannot be used.
    off_words: str = "runs without its persistent cache"
    #: How long after a pass its tool's last writes may still be under way: the workload
    #: runner waits that long before it checks what the pass wrote (:meth:`new_since`).
    write_grace: float = 0.0
    #: The startup hook records the folder the tool really used (``cache_dir`` in its section):
    #: stats and explain name a process that used one outside the cache root.
    records_folder: bool = False
    #: The field of its record section that counts hits.
    hits_field: str = "hits"
    #: The field of its record section holding the seconds the process spent compiling entries
    #: itself (not waiting for another process's compile, not loading hits); None where the
    #: hook cannot tell them apart.
    own_compile_field: str | None = "compile_seconds"
    carry: Carry | None = None
    explain: Explain | None = None

    def __init__(self, carry: Callable[[Kind], Carry] | None = None,
                 explain: Callable[[Kind], Explain] | None = None) -> None:
        self.carry = carry(self) if carry is not None else None
        self.explain = explain(self) if explain is not None else None

    def __repr__(self) -> str:
        return f"<cache kind {self.name}>"

    # --- where ---------------------------------------------------------------------------

    def folder(self, cache_root: Path) -> Path:
        """This kind's folder under ``cache_root`` (or a node-local tier)."""
        return cache_root / self.name

    def enabled(self, settings: object) -> bool:
        """Whether ``settings`` (a :class:`gpu_cache.config.settings.Settings`) export this kind."""
        return self.exported and (self.enabled_by is None or bool(getattr(settings, self.enabled_by)))

    def inner(self, folder: Path) -> list[Path]:
        """The names below ``folder`` (its kind folder) that env and doctor judge as kind
        folders: those :attr:`inner_folders` matches, shallow first."""
        return [inner for pattern in self.inner_folders for inner in sorted(folder.glob(pattern))]

    @property
    def verifies(self) -> bool:
        """Whether a verifying scan checks its entries (and keeps a verification record)."""
        return self.own_check or self.sealed

    @property
    def piece(self) -> Facts:
        """The kind's job-side facts: what its piece of the startup hook declares in its first
        lines (``_hook/gpu_cache_hook/kinds/<name>``; none where it has no piece)."""
        return _declared().get(self.name) or Facts(self.name)

    @property
    def observed(self) -> bool:
        """Whether the startup hook records this kind's hits and misses: its piece watches the
        tool's modules, or the hook records them otherwise (:attr:`recorded`)."""
        return bool(self.piece.watches) or self.recorded

    @property
    def tiered(self) -> bool:
        """Whether, with the node-local tier on (issue 23), jobs work in ``<local tier>/<name>``,
        fed from and promoted to ``<cache root>/<name>`` by the startup hook: its piece
        declares a layout in the tier."""
        return bool(self.piece.tier)

    # --- the inventory -------------------------------------------------------------------

    def scan(self, folder: Path, grace_seconds: float = 3600.0, verify_after: float | None = None,
             record: verified.Record | None = None) -> list[Entry]:
        """Every entry in ``folder``. Temporary files younger than the grace period are left
        out (a writer may own them); ``verify_after``: verify the entries written after that
        time (the kind's own check). ``record``: what earlier scans read or verified, skipped
        now; the caller saves it. Every entry that another user may have written is broken
        (the trust rule, :func:`gpu_cache.core.owners.written_by_others`): no kind serves,
        counts whole or carries one. A verifying scan of a sealed kind also seals its whole
        entries, or finds their damage (:mod:`gpu_cache.core.kinds.integrity`)."""
        with no_cyclic_gc():
            found = self._entries(folder, grace_seconds, verify_after, record)
            # gpu-cache's own files, no entries: its record of what was verified, and the write
            # probe of gpu-cache env while a job starts (a validation beside it counted one as a
            # new entry: a false FAILED)
            found = [entry for entry in found if entry.key != verified.NAME and not _fresh_probe(entry)]
            if found:
                _judge(folder, found)
            if found and self.sealed and verify_after is not None and record is not None:
                integrity.check(folder, found, self.files, record, grace_seconds)
        return found

    def _entries(self, folder: Path, grace_seconds: float, verify_after: float | None,
                 record: verified.Record | None) -> list[Entry]:
        raise NotImplementedError

    def remove(self, folder: Path, entry: Entry) -> None:
        """Remove one whole entry so that no reader sees part of it.

        Raises:
            OSError: the entry could not be removed.
        """
        self._remove(folder, entry)

    def _remove(self, folder: Path, entry: Entry) -> None:
        raise NotImplementedError

    def files(self, entry: Entry) -> list[str]:
        """The files or folders that hold an entry's bytes, which its seal covers."""
        return [entry.path] if entry.path is not None else []

    def volatile(self, file_name: str) -> bool:
        """Whether a file of an entry changes whenever a job uses it (JAX's ``-atime``): a stable
        pack and an entry's digest leave it out, so the same entries give the same bytes."""
        return False

    def repair(self, folder: Path, found: list[Entry]) -> tuple[int, list[str]]:
        """Repair what needs no removal (prune, not in a dry run): how many things were
        repaired, and a line for each that could not be."""
        return 0, []

    def present(self, folder: Path, key: str) -> bool:
        """Whether the entry ``key`` (a key the startup hook recorded a hit of) is in ``folder``:
        what the next warm step checks before it trusts a passed verdict."""
        return False

    def warm_steps(self, records: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
        """The steps a warm pass runs before its workloads, from what the ``records`` of the
        job's records folder say: (name, command template, timeout seconds) each."""
        return []

    def new_since(self, folder: Path, since: float) -> list[Entry]:
        """The broken entries among those written since ``since`` that the kind's own check
        finds right after a pass (a full disk, a killed writer); none for a kind whose tool
        writes entries whole."""
        return []

    # --- doctor ----------------------------------------------------------------------------

    def doctor_report(self, exports_values: dict[str, str]) -> dict[str, Any] | None:
        """What ``gpu-cache doctor`` says of this kind beyond its folder's check, for the jobs
        of ``exports_values`` (their exported variables); None: nothing."""
        return None

    def doctor_lines(self, report: dict[str, Any]) -> list[str]:
        """Doctor's lines for :meth:`doctor_report`."""
        return []

    # --- the jobs' environment -------------------------------------------------------------

    def exports(self, folder: Path, settings: Any, network_fs: str | None, tier: bool) -> Exported:
        """The variables that come with the kind's folder ``folder``: ``network_fs``, the type of
        a network filesystem the folder is on, where it is the cache root's; ``tier``: the jobs
        work in a node-local tier."""
        return Exported({})

    def seed_exports(self, folder: Path) -> dict[str, str]:
        """For a kind that reads a read-only folder as a seed (``ReadOnlyUse.SEED``): the
        variables that make its jobs read ``folder`` so."""
        return {}

    # --- what the records and the entries say ------------------------------------------------

    def section(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The record's section for this kind, when it has a valid one."""
        section = record.get(self.name)
        return section if isinstance(section, dict) else None

    def totals(self, found: list[dict[str, Any]]) -> KindTotals | None:
        """Hits, misses and compile seconds of this kind summed over the records ``found``, with
        the computations they name as missed; None where the kind is not observed and no record
        holds a section of it."""
        sections = [s for s in (self.section(r) for r in found) if s is not None]
        if not (self.observed or sections):
            return None
        count, seconds = hook_records.count, hook_records.seconds
        return KindTotals(
            processes=len(sections),
            hits=sum(count(s.get(self.hits_field)) for s in sections),
            misses=sum(count(s.get("misses")) for s in sections),
            compile_seconds=round(sum(seconds(s.get("compile_seconds")) for s in sections), 3),
            saved_seconds=round(sum(seconds(s.get("saved_seconds")) for s in sections), 3),
            missed=[m for s in sections for m in hook_records.missed_of(s, self.name)],
            hit_keys=sorted({k for s in sections for k in s.get("hit_keys") or [] if isinstance(k, str)}),
        )

    def compiled(self, keys: list[str]) -> list[str]:
        """Of new entries' keys, those that are each one compile (validate counts them as misses)."""
        return keys

    def missed_name(self, key: str) -> str:
        """The name of the computation of a new entry's key, where no record named it."""
        return key

    def stats_extra(self, found: list[Entry]) -> dict[str, Any]:
        """What ``gpu-cache stats`` shows for this kind beyond the generic counts."""
        return {}

    def used_folder(self, record: dict[str, Any]) -> str | None:
        """The cache folder a recorded process really used, where its hook records one
        (:attr:`records_folder`)."""
        section = self.section(record) if self.records_folder else None
        folder = section.get("cache_dir") if section else None
        return folder if isinstance(folder, str) and folder else None

    def outside_fix(self, own_flag: bool) -> str:
        """How to bring back a process that used a folder outside the cache root: ``own_flag``:
        its program chose that folder (rather than an exported variable)."""
        return f"its {self.env_var} was set outside gpu-cache: unset it"

    def validation_problems(self, totals: Any) -> list[str]:
        """Problems of a validation pass that only this kind can word (``totals``: its
        :class:`gpu_cache.core.reports.KindTotals`, or None)."""
        return []


@functools.lru_cache(maxsize=1)
def _declared() -> dict[str, Facts]:
    """What each kind's piece of the startup hook declares, by kind: read once, from the hook's
    folder (one listing, and the head of each piece)."""
    return {facts.kind: facts for facts in pieces()}


def tier_name(root: Path | str) -> str:
    """The name of the cache root ``root``'s folder in any node-local tier base."""
    return hashlib.sha256(os.fsencode(os.path.normpath(root))).hexdigest()[:16]


def in_tier(folder: str, root: Path | str, name: str) -> bool:
    """Whether ``folder`` is the folder of the kind ``name`` in a node-local tier of ``root``
    (``<any tier base>/<tier_name(root)>/<name>``): a job's cache folder that is the root's."""
    path = Path(os.path.normpath(folder))
    return path.name == name and path.parent.name == tier_name(root)


def texts(value: Any) -> list[str]:
    """The text items of ``value`` where it is a list (from a record: any JSON)."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _judge(folder: Path, found: list[Entry]) -> None:
    """What is at each entry's path, for every kind alike: a link, FIFO, socket or device where
    an entry should be is broken (never followed nor opened; prune removes the name itself), and
    so is an entry another user may have written (the trust rule); neither is ever served,
    counted whole or carried."""
    try:
        team = owners.team_of(os.stat(folder))
    except OSError:
        team = None
    for entry in found:
        if entry.path is None:
            continue
        try:
            info = os.lstat(entry.path)
        except OSError:
            continue
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            what = safe_io.describe(info.st_mode)
            entry.problem = f"{what} where an entry should be (never followed nor opened)"
            continue
        if entry.problem is not None:
            continue
        why = owners.written_by_others(info, team, where=entry.path) or _file_written_by_others(
            entry, info, team)
        if why is not None:
            entry.problem = f"not trusted: {why} (another user may have written it)"


def _file_written_by_others(entry: Entry, info: os.stat_result, team: int | None) -> str | None:
    """Why another user may have written a file of ``entry`` besides its own (``info``: of its
    path), or None: every file of an entry is read (a numba data file is a pickle, a file in a
    Triton key folder is loaded), not only the one its path names."""
    for top in entry.kind.files(entry):
        if top == entry.path and not stat.S_ISDIR(info.st_mode):
            continue  # judged already
        for path, file_info in integrity.files_of(top):
            why = owners.written_by_others(file_info, team, where=path)
            if why is not None:
                return f"{os.path.basename(path)} is {why}"
    return None


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
