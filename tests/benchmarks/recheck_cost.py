"""Benchmark: what reading verified JAX entries again (damage that keeps the size, #21) costs
a prune, against a checkout without it, on one machine at one time.

    git archive <base> scripts | tar -x -C /tmp/base
    python tests/benchmarks/recheck_cost.py --baseline /tmp/base/scripts
        [--size entries:100000] [--rounds 9] [--work DIR]
        [--out tests/benchmarks/results/recheck_cost.json]

Builds two alike cache roots with stats_scale.build (every kind, real JAX entries compiled
here), one per checkout (a verification record is each checkout's own), verifies each with a
first ``prune --dry-run``, then times, round after round, a bare walk and each checkout's
``prune --dry-run`` and ``stats --json`` on its root: interleaved, so that both see the same
load. Medians of wall and CPU seconds, their ratios to the walk, and how far this checkout's
dry runs moved the cursor of what they read again (the share of the JAX entries read again by
each, and so how many dry runs read every entry once) go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import stats_scale


def _cursor(root: Path) -> int:
    """Where the next verifying scan of ``root``'s JAX folder starts reading entries again
    (this checkout's verification record)."""
    sys.path.insert(0, str(stats_scale.SCRIPTS))
    from gpu_cache.core import verified

    return verified.Record.load(root / "jax").cursor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout's scripts/ folder")
    parser.add_argument("--size", default="entries:100000")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--work", type=Path, help="folder for the roots (default: a temporary one)")
    parser.add_argument("--out", type=Path,
                        default=stats_scale.REPO / "tests" / "benchmarks" / "results" / "recheck_cost.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-cache-recheck-"))
    work.mkdir(parents=True, exist_ok=True)
    trees = {"baseline": args.baseline.resolve(), "this": stats_scale.SCRIPTS}
    templates = (stats_scale.real_jax_entries(work), stats_scale.real_library(work))
    roots = {}
    for name in trees:
        roots[name] = work / f"root-{name}"
        shutil.rmtree(roots[name], ignore_errors=True)
        stats_scale.build(roots[name], stats_scale.counts_for(args.size), *templates)
    environ = stats_scale.environ()
    dry = ("prune", "--dry-run", "--json", "--max-age", "80d", "--max-size", "1T")

    def cli(name: str, *command: str) -> tuple[list[str], dict[str, str]]:
        return ([sys.executable, "-m", "gpu_cache", *command, "--cache-root", str(roots[name])],
                environ | {"PYTHONPATH": str(trees[name])})

    first = {name: stats_scale.run(*cli(name, *dry))[:2] for name in trees}
    cursor, moved = _cursor(roots["this"]), 0
    samples: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for name in trees:
            runs = {"walk": ([sys.executable, "-c", stats_scale.WALK, str(roots[name])], environ),
                    f"{name}_prune_dry_run": cli(name, *dry),
                    f"{name}_stats_json": cli(name, "stats", "--json")}
            for what, (command, env) in runs.items():
                samples.setdefault(what, []).append(stats_scale.run(command, env)[:2])
        moved += (_cursor(roots["this"]) - cursor) % (1 << 64)  # (one dry run: at most one lap)
        cursor = _cursor(roots["this"])
        print({what: [round(x, 2) for x in values[-1]] for what, values in samples.items()}, flush=True)
    share = moved / (1 << 64) / args.rounds
    median = {what: (statistics.median(s[0] for s in values), statistics.median(s[1] for s in values))
              for what, values in samples.items()}
    walk_wall, walk_cpu = median["walk"]
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "size": args.size,
        "rounds": args.rounds, "load_average_at_end": os.getloadavg(),
        "share_of_jax_entries_read_again_per_dry_run": round(share, 4),
        "dry_runs_to_read_every_jax_entry_again": round(1 / share, 1) if share else None,
        "first_dry_run_wall_cpu": {name: [round(x, 3) for x in v] for name, v in first.items()},
        "seconds": {what: round(wall, 3) for what, (wall, _cpu) in median.items()},
        "cpu_seconds": {what: round(cpu, 3) for what, (_wall, cpu) in median.items()},
        "ratio_to_walk": {what: round(wall / walk_wall, 2) for what, (wall, _cpu) in median.items()
                          if what != "walk"},
        "cpu_ratio_to_walk": {what: round(cpu / walk_cpu, 2) for what, (_wall, cpu) in median.items()
                              if what != "walk"},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
