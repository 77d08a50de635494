"""Single-flight across nodes, measured on two nodes made on this machine (issue 22 item 3).

Each node is a process tree in its own mount, UTS and PID namespace with its own sshfs mount of
one export at the same path (tests/harness/flight_nodes.py over tests/harness/sshfs_mount.py's loopback sshd).
On each node ``--jobs`` JAX processes start at one instant and jit the same ``--keys`` chains
(one cache key each) on an empty cache root on the share, in three set-ups:

- ``cluster``: through ``gpu-cache env`` (single-flight's cluster mode on sshfs: flock within a
  node, a lease per key across nodes);
- ``node``: the same, with ``GPU_CACHE_LOCK_MODE=node`` (flock only: single-flight per node, as
  before leases);
- ``none``: no gpu-cache: JAX's own persistent cache on the share, set by hand
  (``JAX_COMPILATION_CACHE_DIR``, ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``), no hook;
- ``alone``: one job on node A through ``gpu-cache env``: what the fan-out would cost without
  anyone to share with (the reference for single-flight's own cost, issue 50).

It prints, per set-up and round, the compiles (JAX's compile requests that did not load the
entry, summed over all processes; per key from the hook's records where gpu-cache ran), the
wall seconds (the slowest process, from the common start) and the CPU seconds (all processes,
from the start); where gpu-cache ran, per key waited for, the longest wait against its leader's
own compile of it (``flight_costs``: a wait longer than that compile is single-flight's own
cost: the lease poll, waits in turn). Then the leader faults: node A's only job holds a key's lease and is
SIGKILLed or SIGSTOPped mid-compile while node B's job waits: the seconds until B goes on
(makes the next lease). One JSON object on stdout (``--out`` writes it too).

    sudo python tests/benchmarks/two_nodes.py --jobs 3 --keys 6 --length 20 --rounds 2 \\
        --out tests/benchmarks/results/two_nodes.json

Needs root, sshd, sshfs and /dev/fuse (``.ci/install-sshfs.sh``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "harness"), str(HERE.parent.parent / "scripts")]

from flight_costs import flight_costs  # noqa: E402
from timing import publish  # noqa: E402

from flight_nodes import Node, go, job_commands, leader_fault, wait_ready  # noqa: E402
from helpers import clean_environ  # noqa: E402
from sshfs_mount import SshfsMount  # noqa: E402

#: The tier off: these nodes share this machine's /tmp, so a node-local tier (on by default on
#: sshfs) would be one tier for both nodes and for every run (tests/test_flight_across_nodes.py).
CONFIG = {"single_flight": {"timeout": "5m"}, "local_tier": {"mode": "off"}}


def one_run(share: SshfsMount, work: Path, point: Path, setup: str, jobs: int, keys: int,
            length: int) -> dict:
    """Both nodes, ``jobs`` jobs each, on a fresh root (or, for ``none``, a fresh JAX folder)."""
    shutil.rmtree(work / "sync", ignore_errors=True)
    shutil.rmtree(share.server_dir / "cache", ignore_errors=True)
    root = point / "cache"
    if setup == "none":
        options = {"root": None, "override": {"JAX_COMPILATION_CACHE_DIR": str(root / "jax"),
                                              "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}}
    else:
        options = {"root": root, "config": CONFIG,
                   "override": {"GPU_CACHE_LOCK_MODE": "node"} if setup == "node" else {}}
    nodes, names = [], ("node-a", "node-b")
    if setup == "alone":
        names, jobs = ("node-a",), 1
    try:
        for name in names:
            nodes.append(Node(work, share, name, point, job_commands(work, name, jobs, keys, length),
                              clean_environ(),
                              **options))
        wait_ready(work, len(names) * jobs, nodes)
        go(work)
        results = [node.result() for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    done = []
    for result in results:
        for run in result["runs"]:
            if run["returncode"] != 0:
                raise RuntimeError(f"a job failed on {result['name']}: {run['stderr'][-2000:]}")
            done.append(json.loads(run["stdout"].strip().splitlines()[-1]))
    if len({json.dumps(d["values"]) for d in done}) != 1:
        raise RuntimeError("the jobs computed different results")
    per_key, modes = Counter(), set()
    records = [json.loads(path.read_text())
               for path in sorted((share.server_dir / "cache" / "records").glob("*.json"))]
    for record in records:
        section = record.get("jax", {})
        modes.add(section.get("single_flight", {}).get("mode"))
        for miss in section.get("missed", []):
            per_key[miss["key"]] += 1
    out = {"setup": setup, "compiles": sum(d["compiled"] for d in done), "keys": keys,
           "wall_seconds": max(d["seconds"] for d in done),
           "cpu_seconds": round(sum(d["cpu_seconds"] for d in done), 1),
           "single_flight": sorted(m for m in modes if m) or "off"}
    if per_key:
        out["compiles_per_key"] = sorted(per_key.values())
        out["flight_costs"] = flight_costs(records)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3, help="JAX processes per node")
    parser.add_argument("--keys", type=int, default=6, help="jitted functions (cache keys) per process")
    parser.add_argument("--length", type=int, default=3,
                        help="the first chain's length (key k: length + k steps; longer compiles longer)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each set-up")
    parser.add_argument("--setups", default="cluster,node,none,alone")
    parser.add_argument("--faults", default="SIGKILL,SIGSTOP")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpu-cache-two-nodes-"))
    report: dict = {"jobs_per_node": args.jobs, "keys": args.keys, "length": args.length, "runs": [],
                    "faults": []}
    try:
        with SshfsMount(base / "sshfs") as share:
            work = base / "work"
            work.mkdir()
            for _round in range(args.rounds):
                for setup in filter(None, args.setups.split(",")):
                    run = one_run(share, work, base / "share", setup, args.jobs, args.keys, args.length)
                    print(json.dumps(run), file=sys.stderr, flush=True)
                    report["runs"].append(run)
            for fault in filter(None, args.faults.split(",")):
                shutil.rmtree(work / "sync", ignore_errors=True)
                shutil.rmtree(share.server_dir / "cache", ignore_errors=True)
                seen = leader_fault(work, share, fault, (base / "a" / "share", base / "b" / "share"),
                                    clean_environ(), CONFIG)
                (done_b,) = [json.loads(r["stdout"].strip().splitlines()[-1]) for r in seen["b"]["runs"]]
                fault_report = {"fault": fault, "b_went_on_after_seconds": seen["went_on"],
                                "b_seconds": done_b["seconds"], "b_compiled": done_b["compiled"],
                                "lease_alive_before": seen["lease_alive_before"]}
                print(json.dumps(fault_report), file=sys.stderr, flush=True)
                report["faults"].append(fault_report)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    publish(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
