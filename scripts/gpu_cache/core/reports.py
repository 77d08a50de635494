"""The reports gpu-cache writes and reads back: one type each, shared by producer and readers.

Each type turns into the JSON the workflow's outputs hold (``as_dict``) and is read back
from it (``from_dict``, which says in one line what is wrong with a file that is not such
a report). Derived figures (totals, speedup, hit rate) are computed here, once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_cache.core.errors import UsageError


def json_object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UsageError(f"not {what}: expected a JSON object, got {type(data).__name__}")
    return data


def require_keys(data: dict[str, Any], what: str, *names: str) -> None:
    missing = [name for name in names if name not in data]
    if missing:
        raise UsageError(f"not {what}: it lacks {', '.join(missing)}")


def text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def json_number(value: Any, what: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise UsageError(f"not {what}: {key} is {value!r}, not a number")
    return value


def keys_by_kind(value: Any) -> dict[str, list[str]]:
    """A report's keys by kind, each a text (anything else left out)."""
    if not isinstance(value, dict):
        return {}
    return {str(kind): [k for k in keys if isinstance(k, str)] for kind, keys in value.items()
            if isinstance(keys, list)}


@dataclass(frozen=True)
class RunResult:
    """One run of one workload command: wall seconds and exit code (``None``: timed out);
    ``error``: the last line a failed run printed (usually why, e.g. ``No module named 'jax'``);
    ``outputs``: what its outputs were, the entries the cache served it, and how they compare
    with its shape's reference (:mod:`gpu_cache.core.references`; None: not collected)."""

    workload: str
    shape: Any
    seconds: float
    returncode: int | None
    error: str | None = None
    outputs: dict[str, Any] | None = None

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
                "returncode": self.returncode, "error": self.error, "outputs": self.outputs}

    @classmethod
    def from_dict(cls, data: Any) -> RunResult:
        data = json_object(data, "a workload run")
        return cls(str(data.get("workload", "?")), data.get("shape"),
                   float(json_number(data.get("seconds", 0.0), "a workload run", "seconds")),
                   data.get("returncode"), text_or_none(data.get("error")),
                   data.get("outputs") if isinstance(data.get("outputs"), dict) else None)


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
        data = json_object(data, "a kind's recorded totals")
        missed = data.get("missed") if isinstance(data.get("missed"), list) else []
        number = lambda key: json_number(data.get(key, 0), "a kind's recorded totals", key)  # noqa: E731
        return cls(int(number("processes")), int(number("hits")), int(number("misses")),
                   float(number("compile_seconds")), float(number("saved_seconds")),
                   [Missed(str(m.get("kind", "?")), str(m.get("name", "?")), str(m.get("key", "")))
                    for m in missed if isinstance(m, dict)],
                   [k for k in data.get("hit_keys") or [] if isinstance(k, str)])


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
    #: The plan's own part of it (runner.plan_key: the type, its runs, its image), which the
    #: host can tell before a job runs: a passed verdict kept under it lets the next warm job be
    #: planned without a GPU (the check job then confirms it on the node).
    plan_key: str | None = None
    #: Why the pass did not run (a warm pass whose inputs' last validation passed).
    skipped: str | None = None
    #: The stored pass this one reuses (a cold measurement of the same inputs).
    reused: str | None = None
    #: Why this pass ran no workload: its job could not run on a node of its (optional) type.
    unscheduled: str | None = None
    #: Seconds the outputs proof took after the runs (keeping or comparing the references).
    proof_seconds: float = 0.0
    #: The entries a warm pass set aside and compiled again, by kind: its runs were served them,
    #: and no warm had compiled their bytes (gpu_cache.core.remake).
    remade: dict[str, list[str]] = field(default_factory=dict)
    #: Why a warm pass ran although a validation of the same plan passed on this root: what
    #: differs from it (the software, naming the package, or the device), or its entries gone.
    why_warmed: str | None = None

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
        data = json_object(data, cls.WHAT)
        require_keys(data, cls.WHAT, "phase", "gpu_type", "run_id", "runs")
        recorded = data.get("recorded") if isinstance(data.get("recorded"), dict) else {}
        new_keys = data.get("new_keys") if isinstance(data.get("new_keys"), dict) else {}
        runs = data["runs"] if isinstance(data["runs"], list) else []
        return cls(
            phase=str(data["phase"]), gpu_type=str(data["gpu_type"]), run_id=str(data["run_id"]),
            seconds=float(json_number(data.get("seconds", 0.0), cls.WHAT, "seconds")),
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
            fingerprint=text_or_none(data.get("fingerprint")),
            plan_key=text_or_none(data.get("plan_key")),
            skipped=text_or_none(data.get("skipped")),
            reused=text_or_none(data.get("reused")),
            unscheduled=text_or_none(data.get("unscheduled")),
            proof_seconds=float(json_number(data.get("proof_seconds", 0.0), cls.WHAT, "proof_seconds")),
            remade=keys_by_kind(data.get("remade")),
            why_warmed=text_or_none(data.get("why_warmed")),
        )

