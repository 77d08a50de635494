"""What single-flight cost the processes of one run, key by key, from the startup hook's records
(issue 50): for each JAX key some process waited for, its leader's own compile of it (the
seconds the leader's record keeps with the missed computation) against the longest wait on it.
Used by tests/benchmarks/alphafold3_gpu.py and tests/benchmarks/two_nodes.py."""

from __future__ import annotations

from typing import Any


def _part(mapping: dict[str, Any], name: str) -> dict[str, Any]:
    value = mapping.get(name)
    return value if isinstance(value, dict) else {}


def flight_costs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per JAX key some process waited for: its leader's own compile of it (the seconds kept with
    the missed computation in the leader's record) against the longest wait on it. A wait longer
    than the compile it waited for is single-flight's own cost (``over``): polling, a late look,
    waits in turn; a shorter one means the waiter came later than the leader."""
    compiled: dict[str, float] = {}
    waited: dict[str, float] = {}
    for record in records:
        jax = _part(record, "jax")
        for missed in jax.get("missed") or []:
            if isinstance(missed, dict) and isinstance(missed.get("seconds"), (int, float)):
                compiled[str(missed.get("key"))[:200]] = float(missed["seconds"])
        for wait in _part(jax, "single_flight").get("waits") or []:
            if isinstance(wait, dict) and isinstance(wait.get("seconds"), (int, float)):
                key = str(wait.get("key"))
                waited[key] = max(waited.get(key, 0.0), float(wait["seconds"]))
    rows = [{"key": key, "leader_compile": compiled[key], "longest_wait": seconds,
             "over": round(seconds - compiled[key], 3)} for key, seconds in waited.items() if key in compiled]
    return sorted(rows, key=lambda row: -row["longest_wait"])
