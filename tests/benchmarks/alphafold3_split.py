"""Where one AlphaFold 3 process's wall time goes (issue 50), for tests/benchmarks/alphafold3_gpu.py.

From what the driver printed (alphafold3_run.py: its phases, ``cache_work`` per phase, when it
started and ended) and the startup hook's record of the same process (matched by pid):

* ``start``: from the benchmark's start of the process to the driver's first line (Python, the
  startup hook); ``exit``: from the driver's result line to the process's end (the record, JAX's
  teardown);
* ``import``, ``parameters``, ``featurise``, ``trace``, ``lower``: paid in every process, each
  without the JAX compile steps inside it (``lower`` also without jax-triton's kernel compile
  step, which gpu-cache caches);
* ``waiting``: on another process's compile (single-flight: the record's ``wait_seconds`` of
  jax and jax_triton; ``waits`` names the longest, by key);
* ``compiling``: this process's own compiles (the record's ``own_compile_seconds`` of jax: the
  compile steps that missed, their waits taken out; jax-triton's ``compile_seconds``);
* ``loading``: entries read from the cache (the record's ``load_seconds`` of jax: the compile
  steps that hit, their waits taken out; jax-triton's hits);
* ``compile_other``: the driver's compile phase outside JAX's compile steps;
* ``running``: the first and second calls, without any compile step inside them.

The residue (wall minus the phases) says how much the split misses; it should stay within
``TOLERANCE`` of the wall.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from gpu_cache.core import hook_records

PHASES = ("start", "import", "parameters", "featurise", "trace", "lower", "waiting", "compiling",
          "loading", "compile_other", "running", "exit")
#: Paid in every process, hit or miss: what no compile cache reaches.
UNCACHED = ("import", "parameters", "featurise", "trace", "lower")
TOLERANCE = 0.05


def _section(record: dict[str, Any], kind: str) -> dict[str, Any]:
    section = record.get(kind)
    return section if isinstance(section, dict) else {}


def _flight(section: dict[str, Any]) -> dict[str, Any]:
    flight = section.get("single_flight")
    return flight if isinstance(flight, dict) else {}


def split(result: dict[str, Any], record: dict[str, Any], wall: float, spawned_at: float,
          ended_at: float) -> dict[str, Any]:
    """The split of one process (``result``: its driver's JSON line; ``record``: the hook's
    record of it; ``wall``: its wall seconds; ``spawned_at``, ``ended_at``: when the benchmark
    started it and saw it end, epoch seconds)."""
    sec = hook_records.seconds
    work = result.get("cache_work") or {}
    jax, kernels = _section(record, "jax"), _section(record, "jax_triton")
    kernel_step = sec(result.get("jax_triton"))
    kernel_wait = sec(_flight(kernels).get("wait_seconds"))
    kernel_compile = sec(kernels.get("compile_seconds"))
    phases = {"start": result["started_at"] - spawned_at}
    for name in UNCACHED:
        phases[name] = result[name] - sec(work.get(name))
    phases["lower"] -= kernel_step
    phases["waiting"] = sec(_flight(jax).get("wait_seconds")) + kernel_wait
    phases["compiling"] = sec(jax.get("own_compile_seconds")) + kernel_compile
    phases["loading"] = sec(jax.get("load_seconds")) + max(0.0, kernel_step - kernel_wait - kernel_compile)
    phases["compile_other"] = result["compile"] - sec(work.get("compile"))
    phases["running"] = sum(result[name] - sec(work.get(name)) for name in ("first_call", "second_call"))
    phases["exit"] = ended_at - result["ended_at"]
    residue = wall - sum(phases.values())
    waits = [dict(w, kind=kind) for kind, section in (("jax", jax), ("jax_triton", kernels))
             for w in _flight(section).get("waits") or [] if isinstance(w, dict)]
    return {"phases": {name: round(phases[name], 3) for name in PHASES}, "wall": wall,
            "residue": round(residue, 3), "residue_share": round(abs(residue) / wall, 4) if wall else 0.0,
            "within_tolerance": abs(residue) <= TOLERANCE * wall,
            "cache_work": round(sum(sec(v) for v in work.values()), 3),
            "compile_seconds": round(sec(jax.get("compile_seconds")), 3),
            "cuda_visible_devices": (record.get("env") or {}).get("CUDA_VISIBLE_DEVICES"),
            "waits": sorted(waits, key=lambda w: -sec(w.get("seconds")))}


def splits(runs: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """The split of each run (``pid``, ``spawned_at``, ``ended_at``, ``wall_seconds``, ``result``)
    whose record is among ``records``; None for a run without one (no hook, or it failed)."""
    by_pid = {record.get("pid"): record for record in records}
    out: list[dict[str, Any] | None] = []
    for run in runs:
        record, result = by_pid.get(run["pid"]), run.get("result") or {}
        if record is None or "ended_at" not in result or run.get("spawned_at") is None:
            out.append(None)
            continue
        out.append(split(result, record, run["wall_seconds"], run["spawned_at"], run["ended_at"]))
    return out


def table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """One line per process: its wall, each phase and the residue (share of the wall)."""
    short = {"compile_other": "cmp_other", "parameters": "params", "featurise": "featur."}
    lines = [f"{'process':18}{'wall':>8} " + " ".join(f"{short.get(p, p):>9}" for p in PHASES)
             + f"{'residue':>16}"]
    for name, part in rows:
        cells = " ".join(f"{part['phases'][p]:>9.2f}" for p in PHASES)
        share = f"({100 * part['residue_share']:.1f}%)"
        lines.append(f"{name:18}{part['wall']:>8.2f} {cells}{part['residue']:>9.2f} {share:>7}")
        lines += [f"{'':20}waited {w['seconds']} s on {w['kind']} {w['key'][:70]} ({w['outcome']})"
                  for w in part["waits"][:3]]
    return "\n".join(lines)
