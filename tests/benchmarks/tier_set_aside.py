"""What the node-local tier's set-aside check costs a warm job (issue 40, docs/outputs.md): once
per process and kind, before the tier serves anything of the kind, it compares the root's
set-aside list with this node's mark of it.

Side by side, for cache roots with the tier on (plain folders on this machine):

- the check itself (``Tier.enabled`` of a fresh tier, the first call of the kind), median over
  ``--checks`` calls in one process: ``none`` (no list in the root: one ``stat`` that finds
  nothing), ``applied`` (a list of ``--records`` set-asides this node applied: a ``stat`` on the
  share and one of the local mark), ``new`` (a list this node has not applied: it reads the list
  and walks the local kind folder of ``--entries`` entries);
- a warm JAX job through the tier (every lookup a local hit), the process's wall seconds, median
  of ``--repeat``: with no list, and with the applied list (two roots, their jobs taking turns);
- the system calls of one such job that name the list or a mark (``strace``, where installed).

    python tests/benchmarks/tier_set_aside.py --repeat 9 --records 200 --entries 2000 \\
        --out tests/benchmarks/results/cpu_tier_set_aside.json

No GPU, root or mounts needed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "harness"), str(HERE.parent.parent / "scripts")]

from timing import publish, run, table  # noqa: E402

from gpu_cache.core import names, set_aside  # noqa: E402
from helpers import HOOK, TINY, clean_environ  # noqa: E402

#: ``--checks`` first calls of ``enabled("jax")``, each of a fresh tier; the median in µs.
#: ``new`` removes the marks first, so that each call reads the list and walks the folder.
CHECKS = ("import os, statistics, sys, time, gpu_cache_hook.tier\n"
          "local, shared, n, fresh = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == 'new'\n"
          "took = []\n"
          "for _ in range(n):\n"
          "    if fresh:\n"
          "        for name in os.listdir(local):\n"
          "            if name.startswith('.gpu-cache-set-aside.'):\n"
          "                os.unlink(os.path.join(local, name))\n"
          "    tier = gpu_cache_hook.tier.Tier(local, shared, 0, None)\n"
          "    started = time.perf_counter()\n"
          "    tier.enabled('jax')\n"
          "    took.append(time.perf_counter() - started)\n"
          "print(round(statistics.median(took) * 1e6, 1))\n")


def environ(root: Path, local: Path) -> dict[str, str]:
    """What ``gpu-cache env`` exports with the tier on (set by hand here)."""
    return clean_environ(PYTHONPATH=str(HOOK), GPU_CACHE_TIER=str(local), GPU_CACHE_SHARED=str(root),
                         JAX_COMPILATION_CACHE_DIR=str(local / "jax"),
                         JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def check_micros(root: Path, local: Path, checks: int, which: str) -> float:
    done = subprocess.run([sys.executable, "-c", CHECKS, str(local), str(root), str(checks), which],
                          env=environ(root, local), capture_output=True, text=True, check=True)
    return float(done.stdout)


def warm_jobs(job: list[str], envs: dict[str, dict[str, str]], repeat: int) -> dict[str, float]:
    """The median wall seconds of ``repeat`` warm jobs per set-up, the set-ups taking turns
    (a shared machine's load then weighs on each alike)."""
    walls: dict[str, list[float]] = {name: [] for name in envs}
    for _ in range(repeat):
        for name, env in envs.items():
            walls[name].append(run(job, env)[0])
    return {name: round(statistics.median(found), 3) for name, found in walls.items()}


def traced_calls(job: list[str], env: dict[str, str], work: Path) -> int | None:
    """The system calls of one warm job that name the set-aside list or a mark."""
    if shutil.which("strace") is None:
        return None
    log = work / "strace.log"
    subprocess.run(["strace", "-f", "-o", str(log), "-e", "trace=%file,%desc", *job], env=env,
                   capture_output=True, check=True)
    named = (f"/{names.STATE_FOLDER}/{names.SET_ASIDE_PREFIX}", f"/{names.SET_ASIDE_SEEN}")
    return sum(1 for line in log.read_text(errors="replace").splitlines()
               if any(n in line for n in named) and "resumed>" not in line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9, help="warm jobs per set-up (median)")
    parser.add_argument("--checks", type=int, default=2000, help="checks per kind of check (median)")
    parser.add_argument("--records", type=int, default=200, help="set-asides in the list")
    parser.add_argument("--entries", type=int, default=2000, help="entries in the local kind folder")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-cache-bench-") as scratch:
        work = Path(scratch)
        (work / "tiny.py").write_text(TINY)
        job = [sys.executable, str(work / "tiny.py")]
        tiers = {name: (work / name / "root", work / name / "local") for name in ("none", "applied")}
        for root, local in tiers.values():
            (root / "jax").mkdir(parents=True)
            run(job, environ(root, local))  # compiles and promotes: later jobs hit the local copies
            for n in range(args.entries):
                (local / "jax" / f"jit_filler-{n:064x}-cache").write_bytes(b"x")
        root, local = tiers["applied"]
        for n in range(args.records):
            set_aside.tell_tiers(root, "jax", [f"jit_gone-{n:064x}"])
        report = {"none": {}, "applied": {},
                  "new": {"check_us": check_micros(root, local, max(1, args.checks // 100), "new")}}
        run(job, environ(root, local))  # applies the list on this node
        walls = warm_jobs(job, {name: environ(*tiers[name]) for name in tiers}, args.repeat)
        for name, (root, local) in tiers.items():
            report[name] = {"check_us": check_micros(root, local, args.checks, name),
                            "warm_job_s": walls[name], "calls": traced_calls(job, environ(root, local), work)}
            assert len(os.listdir(local / "jax")) >= args.entries  # nothing of the node's was set aside
    head = ("list in the root", "check_us", "warm_job_s", "calls")
    rows = [{head[0]: name, **{k: report[name].get(k, "-") for k in head[1:]}}
            for name in ("none", "applied", "new")]
    print(table(rows, head, width=18), file=sys.stderr)
    publish({"args": vars(args) | {"out": str(args.out) if args.out else None}, **report}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
