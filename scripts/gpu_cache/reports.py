"""The reports of gpu-cache's own commands, on the host: the validation verdict, the prune
report and the cache usage of recorded processes. One type each, shared by the command that
writes it and those that read it back (summary, plots); like the job side's reports
(:mod:`gpu_cache.core.reports`), each turns into its JSON (``as_dict``) and is read back from it
(``from_dict``, which says in one line what is wrong with a file that is not such a report).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gpu_cache import __version__
from gpu_cache.core import kinds
from gpu_cache.core.reports import Missed, RunResult, json_number, json_object, keys_by_kind, require_keys


@dataclass
class KindCounts:
    """Hits, misses and new entries of one cache kind in one validation pass."""

    hits: int = 0
    misses: int = 0
    new_entries: int = 0
    processes_observed: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> KindCounts:
        data = json_object(data, "a kind's counts")
        return cls(**{f.name: int(json_number(data.get(f.name, 0), "a kind's counts", f.name))
                      for f in fields(cls)})


@dataclass
class Verdict:
    """The validation verdict of one GPU type: ``results/gpu-cache/validate/{gpu_type}.json``."""

    gpu_type: str
    device: dict[str, Any]
    passed: bool
    cold_seconds: float | None
    warm_seconds: float
    problems: list[str]
    kinds: dict[str, KindCounts]
    notes: list[str] = field(default_factory=list)
    cache_warnings: list[str] = field(default_factory=list)
    missed: list[Missed] = field(default_factory=list)
    explain: list[dict[str, Any]] = field(default_factory=list)
    runs: list[RunResult] = field(default_factory=list)
    cold_runs: list[RunResult] = field(default_factory=list)
    cache_root: str | None = None
    job: dict[str, Any] = field(default_factory=dict)
    #: The software the validation ran with (the jobs' own where the type names its image).
    software: dict[str, Any] = field(default_factory=dict)
    #: The outputs proof (issue 40): the mode, the reference, each shape's outcome and figures,
    #: and the entries set aside (:mod:`gpu_cache.commands.outputs_proof`); empty: none made.
    outputs: dict[str, Any] = field(default_factory=dict)
    #: ``passed``; ``failed`` (it ran and something missed or differs); ``error`` (no
    #: workload run of the type ran to the end: they could not start, e.g. no jax in the
    #: software they ran with); ``unscheduled`` (an optional type whose jobs found no node).
    status: str = ""
    #: Why the type was not warmed for a cause the user can fix (SLURM refused its job for its
    #: memory, CPUs, time or GPUs, or it never started), with the key that fixes it: a failed
    #: verdict that fails the run (issue 49).
    not_warmed: str | None = None
    #: The gpu-cache release that made it (as a pack records it); "" in a verdict made before.
    gpu_cache_version: str = __version__
    #: The entries this run's warm passes set aside and compiled again, by kind: they were
    #: served, and no warm had compiled their bytes (gpu_cache.core.remake).
    remade: dict[str, list[str]] = field(default_factory=dict)
    #: What the check job warmed first, where its warm job was planned to run none and the passed
    #: verdict that planned it did not hold on its node: ``new_entries``, and ``why``.
    warmed_again: dict[str, Any] | None = None

    WHAT = "a validation verdict (validate/{gpu_type}.json)"
    STATUSES = ("passed", "failed", "error", "unscheduled")

    @property
    def outcome(self) -> str:
        """The status, also for a verdict written before it had one."""
        if self.status in self.STATUSES:
            return self.status
        return "passed" if self.passed else "failed"

    @property
    def hits(self) -> int:
        return sum(c.hits for c in self.kinds.values())

    @property
    def misses(self) -> int:
        return sum(c.misses for c in self.kinds.values())

    @property
    def new_entries(self) -> int:
        return sum(c.new_entries for c in self.kinds.values())

    @property
    def speedup(self) -> float | None:
        if self.cold_seconds and self.warm_seconds:
            return round(self.cold_seconds / self.warm_seconds, 2)
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_type": self.gpu_type, "device": self.device, "passed": self.passed,
            "status": self.outcome, "hits": self.hits, "misses": self.misses, "new_entries": self.new_entries,
            "cold_seconds": self.cold_seconds, "warm_seconds": self.warm_seconds,
            "speedup": self.speedup, "problems": self.problems, "notes": self.notes,
            # Everything the cache environment fell back from or adjusted (node-local folders,
            # read-only roots, refused folders, low space), also when it does not fail validation.
            "cache_warnings": self.cache_warnings,
            "missed": [asdict(m) for m in self.missed], "explain": self.explain,
            "runs": [r.as_dict() for r in self.runs],
            "cold_runs": [r.as_dict() for r in self.cold_runs],
            "cache_root": self.cache_root, "job": self.job, "software": self.software,
            "outputs": self.outputs, "not_warmed": self.not_warmed,
            "gpu_cache_version": self.gpu_cache_version, "remade": self.remade,
            "warmed_again": self.warmed_again,
            **{name: asdict(counts) for name, counts in self.kinds.items()},
        }

    @classmethod
    def from_dict(cls, data: Any) -> Verdict:
        """Raises: UsageError: ``data`` is not a verdict."""
        data = json_object(data, cls.WHAT)
        require_keys(data, cls.WHAT, "gpu_type", "passed", "warm_seconds")
        device = data.get("device") if isinstance(data.get("device"), dict) else {}
        cold = data.get("cold_seconds")
        lists = {name: data.get(name) if isinstance(data.get(name), list) else []
                 for name in ("problems", "notes", "cache_warnings", "explain", "runs", "cold_runs")}
        return cls(
            gpu_type=str(data["gpu_type"]), device=device, passed=data["passed"] is True,
            cold_seconds=None if cold is None else float(json_number(cold, cls.WHAT, "cold_seconds")),
            warm_seconds=float(json_number(data["warm_seconds"], cls.WHAT, "warm_seconds")),
            problems=[str(p) for p in lists["problems"]],
            kinds={kind.name: KindCounts.from_dict(data[kind.name]) for kind in kinds.OBSERVED
                   if isinstance(data.get(kind.name), dict)},
            notes=[str(n) for n in lists["notes"]],
            cache_warnings=[str(w) for w in lists["cache_warnings"]],
            explain=[e for e in lists["explain"] if isinstance(e, dict)],
            runs=[RunResult.from_dict(r) for r in lists["runs"]],
            cold_runs=[RunResult.from_dict(r) for r in lists["cold_runs"]],
            cache_root=data.get("cache_root"), job=data.get("job") or {},
            software=data.get("software") if isinstance(data.get("software"), dict) else {},
            outputs=data.get("outputs") if isinstance(data.get("outputs"), dict) else {},
            status=str(data.get("status") or ""),
            not_warmed=str(data["not_warmed"]) if data.get("not_warmed") else None,
            gpu_cache_version=str(data.get("gpu_cache_version") or ""),
            remade=keys_by_kind(data.get("remade")),
            warmed_again=data.get("warmed_again") if isinstance(data.get("warmed_again"), dict) else None,
        )


@dataclass
class KindPruneReport:
    """What pruning did (or, in a dry run, would do) to one cache kind."""

    entries_before: int = 0
    bytes_before: int = 0
    entries_removed: int = 0
    bytes_removed: int = 0
    bytes_after: int = 0
    dry_run: bool = False
    repaired: int = 0
    removed: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def entries_after(self) -> int:
        return self.entries_before - self.entries_removed

    def count_removed(self, key: str, name: str, size: int, last_use: float, reason: str) -> None:
        """Count one entry removed (or, in a dry run, to be removed)."""
        self.entries_removed += 1
        self.bytes_removed += size
        self.bytes_after -= size
        self.removed.append({"key": key, "name": name, "bytes": size, "last_use": last_use, "reason": reason})

    def as_dict(self) -> dict[str, Any]:
        """The fields as a mapping: what ``dataclasses.asdict`` gives, without its deep copy
        of every removed entry (a second per hundred thousand)."""
        return {item.name: getattr(self, item.name) for item in fields(self)}

    @classmethod
    def from_dict(cls, data: Any) -> KindPruneReport:
        data = json_object(data, "a kind's prune report")
        numbers = {name: int(json_number(data.get(name, 0), "a kind's prune report", name))
                   for name in ("entries_before", "bytes_before", "entries_removed",
                                "bytes_removed", "bytes_after", "repaired")}
        return cls(**numbers, dry_run=data.get("dry_run") is True)


@dataclass
class PruneReport:
    """What a prune did: ``results/gpu-cache/prune.json`` (each kind's report at the top level)."""

    cache_root: str | None
    dry_run: bool
    max_size: int
    max_age_seconds: float
    problems: list[str] = field(default_factory=list)
    kinds: dict[str, KindPruneReport] = field(default_factory=dict)
    #: Jobs whose software differs from what warmed their GPU type (stats.software_mismatches).
    software_mismatches: list[str] = field(default_factory=list)
    #: This node's local tier (issue 23): its folder (None: none here), its bound (all its
    #: kinds together), and what was pruned there per kind.
    tier_folder: str | None = None
    tier_max_size: int = 0
    tier: dict[str, KindPruneReport] = field(default_factory=dict)
    #: The outputs proof's references in the root's state folder (issue 40; None: not pruned),
    #: bounded by ``max_size`` as a kind is.
    references: KindPruneReport | None = None
    #: The markers of passed validations there (None: not pruned).
    markers: KindPruneReport | None = None

    WHAT = "a prune report (prune.json)"

    def as_dict(self) -> dict[str, Any]:
        return {"cache_root": self.cache_root, "dry_run": self.dry_run, "max_size": self.max_size,
                "max_age_seconds": self.max_age_seconds, "problems": self.problems,
                "software_mismatches": self.software_mismatches,
                **{name: report.as_dict() for name, report in self.kinds.items()},
                "tier": {"local": self.tier_folder, "max_size": self.tier_max_size,
                         "kinds": {name: report.as_dict() for name, report in self.tier.items()}},
                "references": None if self.references is None else {**self.references.as_dict(),
                                                                    "max_size": self.max_size},
                "markers": None if self.markers is None else self.markers.as_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> PruneReport:
        """Raises: UsageError: ``data`` is not a prune report."""
        data = json_object(data, cls.WHAT)
        require_keys(data, cls.WHAT, "dry_run")
        problems = data.get("problems") if isinstance(data.get("problems"), list) else []
        return cls(data.get("cache_root"), data["dry_run"] is True,
                   int(json_number(data.get("max_size", 0), cls.WHAT, "max_size")),
                   float(json_number(data.get("max_age_seconds", 0), cls.WHAT, "max_age_seconds")),
                   [str(p) for p in problems],
                   {name: KindPruneReport.from_dict(data[name]) for name in kinds.KINDS
                    if isinstance(data.get(name), dict)},
                   [str(m) for m in data.get("software_mismatches") or [] if isinstance(m, str)],
                   *_tier_part(data.get("tier")),
                   *(KindPruneReport.from_dict(data[part]) if isinstance(data.get(part), dict) else None
                     for part in ("references", "markers")))


def _tier_part(data: Any) -> tuple[str | None, int, dict[str, KindPruneReport]]:
    """The local tier's part of a prune report (absent in reports of earlier versions)."""
    if not isinstance(data, dict):
        return None, 0, {}
    folder = data.get("local") if isinstance(data.get("local"), str) else None
    by_kind = data.get("kinds") if isinstance(data.get("kinds"), dict) else {}
    return (folder, int(json_number(data.get("max_size", 0), PruneReport.WHAT, "tier.max_size")),
            {name: KindPruneReport.from_dict(by_kind[name]) for name in kinds.KINDS
             if isinstance(by_kind.get(name), dict)})


@dataclass
class Usage:
    """How some recorded processes (one rule's, one GPU type's) used the caches."""

    processes: int = 0
    hits: dict[str, int] = field(default_factory=dict)
    misses: dict[str, int] = field(default_factory=dict)
    saved_seconds: float = 0.0
    #: Seconds the processes waited for other processes' compiles (single-flight), and seconds
    #: they compiled entries themselves.
    waited_seconds: float = 0.0
    compiled_seconds: float = 0.0

    @property
    def total_hits(self) -> int:
        return sum(self.hits.values())

    @property
    def total_misses(self) -> int:
        return sum(self.misses.values())

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups, all kinds together; None when nothing was looked up."""
        lookups = self.total_hits + self.total_misses
        return self.total_hits / lookups if lookups else None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"processes": self.processes}
        for name in kinds.names_of(kinds.OBSERVED):
            out[f"{name}_hits"] = self.hits.get(name, 0)
            out[f"{name}_misses"] = self.misses.get(name, 0)
        out["saved_seconds"] = round(self.saved_seconds, 3)
        out["waited_seconds"] = round(self.waited_seconds, 3)
        out["compiled_seconds"] = round(self.compiled_seconds, 3)
        out["hit_rate"] = None if self.hit_rate is None else round(self.hit_rate, 4)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Usage:
        data = json_object(data, "usage counts")
        count = lambda key: int(json_number(data.get(key, 0), "usage counts", key))  # noqa: E731
        number = lambda key: float(json_number(data.get(key, 0.0), "usage counts", key))  # noqa: E731
        return cls(count("processes"),
                   {name: count(f"{name}_hits") for name in kinds.names_of(kinds.OBSERVED)},
                   {name: count(f"{name}_misses") for name in kinds.names_of(kinds.OBSERVED)},
                   number("saved_seconds"), number("waited_seconds"), number("compiled_seconds"))
