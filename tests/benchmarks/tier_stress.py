"""The crash stress of triton-lang/triton#11512 on two nodes, plain vs through the node-local tier
(issue 23, figure a).

On the two nodes of tests/harness/nodes.py (each its own namespaces, its own ``/tmp``, its own sshfs mount
of one share at the same path), each round starts ``--procs`` fresh processes on EACH node on a
fresh cache folder on the share; they compile the same ``--keys`` Triton kernel variants (ahead of
time for sm_90, cubins from the wheel's ptxas), each variant after a barrier of all processes of
the round (#11512's reproducer: same keys, at the same instant). ``--jax-procs`` JAX processes per
node then jit ``--jax-keys`` functions the same way (jax-ml/jax#22718: the cache used in parallel).
Set-ups (tests/harness/tier_jobs.py):

- ``plain``: the tools' own caches straight on the share (``TRITON_CACHE_DIR`` /
  ``JAX_COMPILATION_CACHE_DIR`` there), no gpu-cache;
- ``shared``: ``gpu-cache env`` for a cache root on the share with the tier off (as before issue 23:
  single-flight, the caches straight on the share);
- ``tier``: ``gpu-cache env`` for a cache root on the share: the caches in the node's local folder,
  entries promoted to the root (``--by-hand``: TIER.md's variables added where ``gpu-cache env``
  turns no tier on).

Printed side by side per set-up: compiles tried, compiles that raised (by exception type), processes
that crashed, JAX's cache warnings (JAX turns cache errors into warnings), complete and broken
entries on the share afterwards, and seconds (the rounds' wall, processes started to all ended).
One JSON object on stdout (``--out`` writes it too).

    sudo python tests/benchmarks/tier_stress.py --procs 8 --keys 8 --rounds 12 --jax-procs 4 \\
        --jax-keys 4 --jax-rounds 3 --setups plain,tier --out tests/benchmarks/results/tier_stress.json

Needs root, sshd, sshfs, /dev/fuse and ip (``.ci/install-sshfs.sh``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "harness"), str(HERE.parent.parent / "scripts")]

from timing import publish, table  # noqa: E402

from nodes import TwoNodes  # noqa: E402
from tier_jobs import stress_round, worker  # noqa: E402

CONFIG = {"single_flight": {"timeout": "5m"}}


def summary(kind: str, setup: str, rounds: list[dict], procs: int, keys: int) -> dict:
    jobs = [d for r in rounds for d in r["done"]]
    failures = Counter(f.split(":", 1)[0] for d in jobs for f in d["failed"])
    examples = sorted({f for d in jobs for f in d["failed"]})[:5]
    flights = [f for r in rounds for f in r["flights"]]
    return {
        "kind": kind, "setup": setup, "rounds": len(rounds), "processes": 2 * procs * len(rounds),
        "compiles": 2 * procs * keys * len(rounds),
        "failed": sum(len(d["failed"]) for d in jobs),
        "failed_by_type": dict(failures), "failed_examples": examples,
        "crashed_processes": sum(len(r["crashed"]) for r in rounds),
        "crash_examples": [c for r in rounds for c in r["crashed"]][:3],
        "cache_warnings": sum(len(d["cache_warnings"]) for d in jobs),
        "warning_examples": sorted({w for d in jobs for w in d["cache_warnings"]})[:3],
        "misses": sum(d["misses"] for d in jobs), "hits": sum(d["hits"] for d in jobs),
        "rounds_with_a_failure": sum(1 for r in rounds
                                     if r["crashed"] or any(d["failed"] for d in r["done"])),
        "entries_complete": sum(r["complete"] for r in rounds),
        "entries_broken": sum(r["broken"] for r in rounds),
        "wall_seconds": round(sum(r["wall"] for r in rounds), 1),
        "compile_seconds_max": round(max((d["compile_seconds"] for d in jobs), default=0), 2),
        # from the hook's records: processes whose single-flight was off, leases passed over
        "single_flight_off": sum(1 for f in flights if f["state"] != "on"),
        "single_flight_off_examples": sorted({f["state"] for f in flights if f["state"] != "on"})[:3],
        "leases_passed": sum(f.get("leases_passed", 0) for f in flights),
        "gave_up": sum(f.get("gave_up", 0) for f in flights),
    }


#: The columns printed while the benchmark runs.
COLUMNS = ("kind", "setup", "processes", "compiles", "misses", "failed", "crashed_processes",
           "cache_warnings", "entries_complete", "entries_broken", "single_flight_off", "wall_seconds")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=4, help="Triton processes per node and round")
    parser.add_argument("--keys", type=int, default=8, help="Triton kernel variants per process")
    parser.add_argument("--rounds", type=int, default=10, help="Triton rounds per set-up")
    parser.add_argument("--jax-procs", type=int, default=3, help="JAX processes per node and round")
    parser.add_argument("--jax-keys", type=int, default=4, help="jitted functions per JAX process")
    parser.add_argument("--jax-rounds", type=int, default=3, help="JAX rounds per set-up (0: no JAX)")
    parser.add_argument("--setups", default="plain,shared,tier")
    parser.add_argument("--by-hand", action="store_true",
                        help="set TIER.md's variables where gpu-cache env turns no tier on")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report: dict = {"procs_per_node": args.procs, "keys": args.keys, "jax_procs_per_node": args.jax_procs,
                    "jax_keys": args.jax_keys, "results": []}
    with TwoNodes() as nodes:
        (nodes.workdir / "stress").mkdir()
        program = worker(nodes.workdir)
        config = nodes.workdir / "config.json"
        config.write_text(json.dumps(CONFIG))
        plan = [("triton", args.procs, args.keys, args.rounds),
                ("jax", args.jax_procs, args.jax_keys, args.jax_rounds)]
        for kind, procs, keys, rounds in plan:
            for setup in filter(None, args.setups.split(",")):
                done = []
                for rnd in range(rounds):
                    done.append(stress_round(nodes, program, config, kind, setup, rnd, procs, keys,
                                             args.by_hand))
                    print(f"{done[-1]['tag']}: {done[-1]['wall']:.1f} s, "
                          f"{sum(len(d['failed']) for d in done[-1]['done'])} failed, "
                          f"{len(done[-1]['crashed'])} crashed", file=sys.stderr, flush=True)
                if done:
                    report["results"].append(summary(kind, setup, done, procs, keys))
    print(table(report["results"], COLUMNS, 16), file=sys.stderr)
    publish(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
