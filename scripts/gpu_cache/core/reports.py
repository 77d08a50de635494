"""The reports gpu-cache writes and reads back: one type each, shared by producer and readers.

Each type turns into the JSON the workflow's outputs hold (``as_dict``) and is read back
from it (``from_dict``, which says in one line what is wrong with a file that is not such
a report). Derived figures (totals, speedup, hit rate) are computed here, once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gpu_cache.core import kinds
from gpu_cache.core.errors import UsageError


def _mapping(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UsageError(f"not {what}: expected a JSON object, got {type(data).__name__}")
    return data


def _require(data: dict[str, Any], what: str, *names: str) -> None:
    missing = [name for name in names if name not in data]
    if missing:
        raise UsageError(f"not {what}: it lacks {', '.join(missing)}")


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any, what: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise UsageError(f"not {what}: {key} is {value!r}, not a number")
    return value


@dataclass(frozen=True)
class RunResult:
    """One run of one workload command: wall seconds and exit code (``None``: timed out);
    ``error``: the last line a failed run printed (usually why, e.g. ``No module named 'jax'``)."""

    workload: str
    shape: Any
    seconds: float
    returncode: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def failure(self) -> str | None:
        """A problem line when the run failed (with its last line of output), else None."""
        if self.ok:
            return None
        how = "timed out" if self.returncode is None else f"exited with code {self.returncode}"
        why = f": {self.error}" if self.error else ""
        return f"workload {self.workload} shape {self.shape} {how}{why}"

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "shape": self.shape, "seconds": round(self.seconds, 3),
                "returncode": self.returncode, "error": self.error}

    @classmethod
    def from_dict(cls, data: Any) -> RunResult:
        data = _mapping(data, "a workload run")
        return cls(str(data.get("workload", "?")), data.get("shape"),
                   float(_number(data.get("seconds", 0.0), "a workload run", "seconds")),
                   data.get("returncode"), _text_or_none(data.get("error")))


@dataclass
class KindCounts:
    """Hits, misses and new entries of one cache kind in one validation pass."""

    hits: int = 0
    misses: int = 0
    new_entries: int = 0
    processes_observed: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> KindCounts:
        data = _mapping(data, "a kind's counts")
        return cls(**{f.name: int(_number(data.get(f.name, 0), "a kind's counts", f.name))
                      for f in fields(cls)})


@dataclass(frozen=True)
class Missed:
    """One computation that missed the cache: its kind, name and key."""

    kind: str
    name: str
    key: str


@dataclass
class KindTotals:
    """What the startup hook's records of some processes say about one kind."""

    processes: int = 0
    hits: int = 0
    misses: int = 0
    compile_seconds: float = 0.0
    saved_seconds: float = 0.0
    missed: list[Missed] = field(default_factory=list)
    hit_keys: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any) -> KindTotals:
        data = _mapping(data, "a kind's recorded totals")
        missed = data.get("missed") if isinstance(data.get("missed"), list) else []
        number = lambda key: _number(data.get(key, 0), "a kind's recorded totals", key)  # noqa: E731
        return cls(int(number("processes")), int(number("hits")), int(number("misses")),
                   float(number("compile_seconds")), float(number("saved_seconds")),
                   [Missed(str(m.get("kind", "?")), str(m.get("name", "?")), str(m.get("key", "")))
                    for m in missed if isinstance(m, dict)],
                   [k for k in data.get("hit_keys") or [] if isinstance(k, str)])


@dataclass
class TierTotals:
    """What the node-local tier did for one kind, summed over the records of some processes
    (issue 23; the hook's ``<kind>.tier`` part): entries copied in from the shared root
    (``fetched``), promoted to it, promotions that failed (the entry stays local), and the
    seconds the tier's own copies took."""

    processes: int = 0
    fetched: int = 0
    fetched_bytes: int = 0
    promoted: int = 0
    promoted_bytes: int = 0
    promote_failed: int = 0
    seconds: float = 0.0
    off: list[str] = field(default_factory=list)  # why the tier was off, per distinct reason

    @classmethod
    def from_dict(cls, data: Any) -> TierTotals:
        data = _mapping(data, "a kind's tier totals")
        number = lambda key: _number(data.get(key, 0), "a kind's tier totals", key)  # noqa: E731
        return cls(*(int(number(name)) for name in TIER_COUNTS), float(number("seconds")),
                   [w for w in data.get("off") or [] if isinstance(w, str)])


#: The tier's counts in a record (and in :class:`TierTotals`), besides ``seconds``.
TIER_COUNTS = ("processes", "fetched", "fetched_bytes", "promoted", "promoted_bytes", "promote_failed")


@dataclass
class PhaseResult:
    """One pass over a GPU type's workloads (warm, cold or validate), as the workload runner
    saw it in the jobs' own software: ``warm/{gpu_type}.json`` is the warm pass.

    ``new_keys``: entries that appeared per observed kind; ``recorded``: what the startup
    hook's records of this pass (its ``run_id``) say per kind; ``software``: the runner's
    interpreter and packages (the workloads' own, since they run with it); ``broken``: JAX
    entries written now that are empty or truncated.
    """

    phase: str
    gpu_type: str
    run_id: str
    seconds: float = 0.0
    runs: list[RunResult] = field(default_factory=list)
    new_keys: dict[str, list[str]] = field(default_factory=dict)
    recorded: dict[str, KindTotals] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    cache_root: str | None = None
    broken: list[str] = field(default_factory=list)
    #: What the cache environment fell back from or adjusted, and the kinds that run without
    #: their cache and why (both filled in on the host, where the environment is resolved).
    cache_warnings: list[str] = field(default_factory=list)
    cache_problems: list[str] = field(default_factory=list)
    #: The kinds the workloads compile for: a pass that saw no request for one is suspect.
    expects: list[str] = field(default_factory=list)
    #: What the pass depends on (runner.fingerprint): measurements and verdicts are reused by it.
    fingerprint: str | None = None
    #: Why the pass did not run (a warm pass whose inputs' last validation passed).
    skipped: str | None = None
    #: The stored pass this one reuses (a cold measurement of the same inputs).
    reused: str | None = None
    #: Why this pass ran no workload: its job could not run on a node of its (optional) type.
    unscheduled: str | None = None

    WHAT = "a workload runner's result"

    def failures(self) -> list[str]:
        return [line for line in (run.failure() for run in self.runs) if line]

    @property
    def problems(self) -> list[str]:
        return self.cache_problems + self.failures() + self.broken

    @property
    def new_entries(self) -> dict[str, int]:
        return {kind: len(keys) for kind, keys in self.new_keys.items()}

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["seconds"] = round(self.seconds, 3)
        out["runs"] = [r.as_dict() for r in self.runs]
        out["new_entries"] = self.new_entries
        out["problems"] = self.problems
        return out

    @classmethod
    def from_dict(cls, data: Any) -> PhaseResult:
        """Raises: UsageError: ``data`` is not a runner's result."""
        data = _mapping(data, cls.WHAT)
        _require(data, cls.WHAT, "phase", "gpu_type", "run_id", "runs")
        recorded = data.get("recorded") if isinstance(data.get("recorded"), dict) else {}
        new_keys = data.get("new_keys") if isinstance(data.get("new_keys"), dict) else {}
        runs = data["runs"] if isinstance(data["runs"], list) else []
        return cls(
            phase=str(data["phase"]), gpu_type=str(data["gpu_type"]), run_id=str(data["run_id"]),
            seconds=float(_number(data.get("seconds", 0.0), cls.WHAT, "seconds")),
            runs=[RunResult.from_dict(r) for r in runs],
            new_keys={str(k): [str(key) for key in v] for k, v in new_keys.items() if isinstance(v, list)},
            recorded={str(k): KindTotals.from_dict(v) for k, v in recorded.items()},
            device=data.get("device") if isinstance(data.get("device"), dict) else {},
            software=data.get("software") if isinstance(data.get("software"), dict) else {},
            job=data.get("job") if isinstance(data.get("job"), dict) else {},
            cache_root=data.get("cache_root") if isinstance(data.get("cache_root"), str) else None,
            broken=[str(b) for b in data.get("broken") or [] if isinstance(b, str)],
            cache_warnings=[str(w) for w in data.get("cache_warnings") or [] if isinstance(w, str)],
            cache_problems=[str(p) for p in data.get("cache_problems") or [] if isinstance(p, str)],
            expects=[str(k) for k in data.get("expects") or [] if isinstance(k, str)],
            fingerprint=_text_or_none(data.get("fingerprint")),
            skipped=_text_or_none(data.get("skipped")),
            reused=_text_or_none(data.get("reused")),
            unscheduled=_text_or_none(data.get("unscheduled")),
        )


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
    #: ``passed``; ``failed`` (it ran and something missed or differs); ``error`` (no
    #: workload run of the type ran to the end: they could not start, e.g. no jax in the
    #: software they ran with); ``unscheduled`` (an optional type whose jobs found no node).
    status: str = ""

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
            **{name: asdict(counts) for name, counts in self.kinds.items()},
        }

    @classmethod
    def from_dict(cls, data: Any) -> Verdict:
        """Raises: UsageError: ``data`` is not a verdict."""
        data = _mapping(data, cls.WHAT)
        _require(data, cls.WHAT, "gpu_type", "passed", "warm_seconds")
        device = data.get("device") if isinstance(data.get("device"), dict) else {}
        cold = data.get("cold_seconds")
        lists = {name: data.get(name) if isinstance(data.get(name), list) else []
                 for name in ("problems", "notes", "cache_warnings", "explain", "runs", "cold_runs")}
        return cls(
            gpu_type=str(data["gpu_type"]), device=device, passed=data["passed"] is True,
            cold_seconds=None if cold is None else float(_number(cold, cls.WHAT, "cold_seconds")),
            warm_seconds=float(_number(data["warm_seconds"], cls.WHAT, "warm_seconds")),
            problems=[str(p) for p in lists["problems"]],
            kinds={name: KindCounts.from_dict(data[name]) for name in kinds.OBSERVED
                   if isinstance(data.get(name), dict)},
            notes=[str(n) for n in lists["notes"]],
            cache_warnings=[str(w) for w in lists["cache_warnings"]],
            explain=[e for e in lists["explain"] if isinstance(e, dict)],
            runs=[RunResult.from_dict(r) for r in lists["runs"]],
            cold_runs=[RunResult.from_dict(r) for r in lists["cold_runs"]],
            cache_root=data.get("cache_root"), job=data.get("job") or {},
            software=data.get("software") if isinstance(data.get("software"), dict) else {},
            status=str(data.get("status") or ""),
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

    def as_dict(self) -> dict[str, Any]:
        """The fields as a mapping: what ``dataclasses.asdict`` gives, without its deep copy
        of every removed entry (a second per hundred thousand)."""
        return {item.name: getattr(self, item.name) for item in fields(self)}

    @classmethod
    def from_dict(cls, data: Any) -> KindPruneReport:
        data = _mapping(data, "a kind's prune report")
        numbers = {name: int(_number(data.get(name, 0), "a kind's prune report", name))
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

    WHAT = "a prune report (prune.json)"

    def as_dict(self) -> dict[str, Any]:
        return {"cache_root": self.cache_root, "dry_run": self.dry_run, "max_size": self.max_size,
                "max_age_seconds": self.max_age_seconds, "problems": self.problems,
                "software_mismatches": self.software_mismatches,
                **{name: report.as_dict() for name, report in self.kinds.items()},
                "tier": {"local": self.tier_folder, "max_size": self.tier_max_size,
                         "kinds": {name: report.as_dict() for name, report in self.tier.items()}}}

    @classmethod
    def from_dict(cls, data: Any) -> PruneReport:
        """Raises: UsageError: ``data`` is not a prune report."""
        data = _mapping(data, cls.WHAT)
        _require(data, cls.WHAT, "dry_run")
        problems = data.get("problems") if isinstance(data.get("problems"), list) else []
        return cls(data.get("cache_root"), data["dry_run"] is True,
                   int(_number(data.get("max_size", 0), cls.WHAT, "max_size")),
                   float(_number(data.get("max_age_seconds", 0), cls.WHAT, "max_age_seconds")),
                   [str(p) for p in problems],
                   {name: KindPruneReport.from_dict(data[name]) for name in kinds.KINDS
                    if isinstance(data.get(name), dict)},
                   [str(m) for m in data.get("software_mismatches") or [] if isinstance(m, str)],
                   *_tier_part(data.get("tier")))


def _tier_part(data: Any) -> tuple[str | None, int, dict[str, KindPruneReport]]:
    """The local tier's part of a prune report (absent in reports of earlier versions)."""
    if not isinstance(data, dict):
        return None, 0, {}
    folder = data.get("local") if isinstance(data.get("local"), str) else None
    by_kind = data.get("kinds") if isinstance(data.get("kinds"), dict) else {}
    return (folder, int(_number(data.get("max_size", 0), PruneReport.WHAT, "tier.max_size")),
            {name: KindPruneReport.from_dict(by_kind[name]) for name in kinds.KINDS
             if isinstance(by_kind.get(name), dict)})


@dataclass
class Usage:
    """How some recorded processes (one rule's, one GPU type's) used the caches."""

    processes: int = 0
    hits: dict[str, int] = field(default_factory=dict)
    misses: dict[str, int] = field(default_factory=dict)
    saved_seconds: float = 0.0

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
        for name in kinds.OBSERVED:
            out[f"{name}_hits"] = self.hits.get(name, 0)
            out[f"{name}_misses"] = self.misses.get(name, 0)
        out["saved_seconds"] = round(self.saved_seconds, 3)
        out["hit_rate"] = None if self.hit_rate is None else round(self.hit_rate, 4)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Usage:
        data = _mapping(data, "usage counts")
        count = lambda key: int(_number(data.get(key, 0), "usage counts", key))  # noqa: E731
        return cls(count("processes"),
                   {name: count(f"{name}_hits") for name in kinds.OBSERVED},
                   {name: count(f"{name}_misses") for name in kinds.OBSERVED},
                   float(_number(data.get("saved_seconds", 0.0), "usage counts", "saved_seconds")))
