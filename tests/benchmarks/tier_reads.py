"""A warm job's cache reads, and its metadata operations on the shared folder, straight from the
network folder vs through the node-local tier (issue 23, figures b and c).

On the two nodes of tests/harness/nodes.py (each its own ``/tmp``, its own sshfs mount of one share), for
Triton (``--keys`` kernels, ahead of time for sm_90) and JAX (``--jax-keys`` jitted functions), each
set-up gets its own cache root on the share, warmed by one job on node A; then jobs on node B, where
every lookup hits, are timed (the worker's seconds from its first lookup to its last result:
the cache reads; and the whole process):

- ``plain``: the tool's own cache folder straight on the share, no gpu-cache;
- ``shared``: ``gpu-cache env`` with the tier off (``local_tier.mode: off``): the caches on the share;
- ``tier-fetch``: ``gpu-cache env``, tier on, node B's local folder empty: every entry is copied in
  from the share (the first job of a node);
- ``tier-local``: the next job on node B: every entry from the local folder.

Then one more such job per set-up runs under ``strace -f -y -e trace=%file,fstat,fstatfs,getdents64``
and the system calls that name a path under the share (or an open file there) are counted, by call.
Printed side by side; one JSON object on stdout (``--out`` writes it too).

    sudo python tests/benchmarks/tier_reads.py --keys 32 --jax-keys 8 --repeat 3 \\
        --out tests/benchmarks/results/tier_reads.json

Needs root, sshd, sshfs, /dev/fuse, ip and strace.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "harness"), str(HERE.parent.parent / "scripts")]

from timing import publish, table  # noqa: E402

from nodes import TwoNodes  # noqa: E402
from tier_jobs import job_env, local_folder, worker, worker_argv  # noqa: E402

SETUPS = ("plain", "shared", "tier-fetch", "tier-local")
TRACED = "trace=%file,fstat,fstatfs,getdents64"
CALL = re.compile(r"^\d+\s+(\w+)\(")


def run_job(node, argv: list[str], env: dict[str, str], work: Path, name: str) -> tuple[dict, float]:
    """One job on ``node``: its JSON line and its wall seconds; raises if it failed."""
    out, err = work / f"{name}.out", work / f"{name}.err"
    started = time.monotonic()
    with open(out, "w") as stdout, open(err, "w") as stderr:
        code = node.popen(argv, env=env, stdout=stdout, stderr=stderr, cwd=str(work)).wait(timeout=900)
    wall = time.monotonic() - started
    lines = out.read_text().strip().splitlines()
    if code != 0 or not lines:
        raise RuntimeError(f"{name} failed ({code}): {err.read_text()[-2000:]}")
    result = json.loads(lines[-1])
    if result["failed"]:
        raise RuntimeError(f"{name}: {result['failed'][:3]}")
    return result, wall


def share_calls(trace: Path, share: Path) -> tuple[Counter, Counter]:
    """System calls in an strace log that name a path under ``share`` (``-y`` shows open files'
    paths): by call, and by folder of the cache root (``jax``, ``triton``, ``records``,
    ``locks``...). A call split by another thread's (``resumed``) is counted once."""
    prefix = f"{share}/"
    calls: Counter = Counter()
    folders: Counter = Counter()
    for line in trace.read_text(errors="replace").splitlines():
        match = CALL.match(line)
        if match and prefix in line:
            calls[match.group(1)] += 1
            parts = line.split(prefix, 1)[1].split("/")
            folders[parts[1].split('"')[0].split(">")[0] if len(parts) > 1 else "(the root)"] += 1
    return calls, folders


def measure(nodes: TwoNodes, program: Path, kind: str, keys: int, repeat: int, by_hand: bool) -> list[dict]:
    config = nodes.workdir / "config.json"
    config.write_text(json.dumps({"single_flight": {"timeout": "5m"}}))
    rows = []
    for setup in ("plain", "shared", "tier"):
        root = nodes.shared / f"reads-{kind}-{setup}"
        work = nodes.workdir / "reads" / f"{kind}-{setup}"
        work.mkdir(parents=True)
        sync = work / "sync"
        def env(node, setup=setup, root=root):
            return job_env(node, setup, root, config, kind, by_hand=by_hand)

        argv = worker_argv(program, kind, keys, sync, 0, 1)
        warm, _ = run_job(nodes.a, argv, env(nodes.a), work, "warm-a")
        names = ["tier-fetch", "tier-local"] if setup == "tier" else [setup]
        times: dict[str, list[tuple[float, float, int]]] = {n: [] for n in names}
        for i in range(repeat):
            if setup == "tier":  # node B's first job: its local folder empty
                nodes.b.run(["rm", "-rf", str(local_folder(root))], check=True)
            for name in names:
                done, wall = run_job(nodes.b, argv, env(nodes.b), work, f"{name}-{i}")
                times[name].append((done["compile_seconds"], wall, done["hits"]))
        traces = {}
        for name in names:
            if name == "tier-fetch":
                nodes.b.run(["rm", "-rf", str(local_folder(root))], check=True)
            trace = work / f"{name}.strace"
            run_job(nodes.b, ["strace", "-f", "-y", "-qq", "-e", TRACED, "-o", str(trace), *argv],
                    env(nodes.b), work, f"{name}-strace")
            traces[name] = share_calls(trace, nodes.shared)
        for name in names:
            reads = [t[0] for t in times[name]]
            walls = [t[1] for t in times[name]]
            rows.append({"kind": kind, "setup": name, "keys": keys, "warm_misses": warm["misses"],
                         "hits": [t[2] for t in times[name]],
                         "read_seconds": round(statistics.median(reads), 3),
                         "read_seconds_all": [round(r, 3) for r in reads],
                         "job_seconds": round(statistics.median(walls), 2),
                         "share_calls": sum(traces[name][0].values()),
                         "share_calls_by_name": dict(traces[name][0].most_common()),
                         "share_calls_by_folder": dict(traces[name][1].most_common())})
        shutil.rmtree(sync, ignore_errors=True)
    return rows


#: The columns printed while the benchmark runs.
COLUMNS = ("kind", "setup", "keys", "hits", "read_seconds", "job_seconds", "share_calls")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=32, help="Triton kernels per job")
    parser.add_argument("--jax-keys", type=int, default=8, help="jitted functions per JAX job (0: no JAX)")
    parser.add_argument("--repeat", type=int, default=3, help="timed jobs per set-up (the median is shown)")
    parser.add_argument("--by-hand", action="store_true",
                        help="set TIER.md's variables where gpu-cache env turns no tier on")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not shutil.which("strace"):
        print("tier_reads: needs strace", file=sys.stderr)
        return 2
    report: dict = {"rows": []}
    with TwoNodes() as nodes:
        program = worker(nodes.workdir)
        for kind, keys in (("triton", args.keys), ("jax", args.jax_keys)):
            if keys:
                report["rows"] += measure(nodes, program, kind, keys, args.repeat, args.by_hand)
                print(table(report["rows"], COLUMNS), file=sys.stderr, flush=True)
    publish(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
