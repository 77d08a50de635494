"""Benchmark: the node-local tier's own cost on the job side (issue 23), on this machine's CPU.

    python tests/benchmarks/tier_cost.py [--entries 40] [--repeats 15] [--sshfs] [--out FILE]

Every figure comes from real processes with the startup hook on (records on, as the profile
exports them), the variables of the tier set by hand as ``gpu-cache env`` exports them:

- startup: ``sitecustomize``'s import time (``python -X importtime -c pass``), tier off vs on
  (interleaved, medians), and what the tier adds when a process imports jax (its pieces, the
  process's tier, the look for XLA's autotune files), timed inside the process;
- JAX: a program that compiles ``--entries`` small functions (one entry each). ``tier, cold``:
  an empty root, every entry promoted; ``tier, new node``: the same local path emptied, every
  entry copied in (fetched); ``tier, warm node``: the local tier full; ``straight``: the tier
  off, the cache in the shared folder, cold then warm. The records give the tier's own seconds,
  per entry;
- Triton: the built-in triton-kernels workload (5 kernels, ahead of time for sm_90), the same
  four cases.

``--sshfs`` puts the shared roots on a real sshfs mount of this machine (tests/harness/sshfs_mount.py;
needs root) instead of a local folder: the network read and write path. Prints a table and
writes the figures as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from timing import run  # tests/benchmarks/timing.py

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "harness"))  # tests/harness/sshfs_mount.py, for --sshfs
HOOK = REPO / "scripts" / "gpu_cache" / "_hook"
FILLER = ("import jax, jax.numpy as jnp, numpy as np, sys\n"
          "for i in range(int(sys.argv[1])):\n"
          "    jax.jit(lambda x, i=i: jnp.tanh(x @ x.T) * (i + 1))(np.ones((64, 64), np.float32))"
          ".block_until_ready()\n")
TRITON = [sys.executable, "-m", "gpu_cache.workloads.triton_kernels", "--shape", "64", "--mode", "aot"]


def environ(root: Path, local: Path | None, records: Path) -> dict[str, str]:
    """A job's environment: the hook with records; the tier in ``local`` (None: off, the
    caches straight in ``root``)."""
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_CACHE_", "JAX_", "TRITON_", "PYTHON", "XLA_"))}
    where = local if local is not None else root
    env.update({"PYTHONPATH": f"{HOOK}:{REPO / 'scripts'}", "GPU_CACHE_RECORDS": str(records),
                "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(where / "jax"),
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "TRITON_CACHE_DIR": str(where / "triton"),
                "TRITON_DEFAULT_FP_FUSION": "1", "GPU_CACHE_RUN_ID": uuid.uuid4().hex})
    if local is not None:
        env.update({"GPU_CACHE_TIER": str(local), "GPU_CACHE_SHARED": str(root),
                    "GPU_CACHE_TIER_MAX_BYTES": str(20 << 30),
                    "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "xla_gpu_per_fusion_autotune_cache_dir"})
    return env


def tier_of(records: Path, run_id: str, kind: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for path in records.glob("*.json"):
        record = json.loads(path.read_text())
        if record.get("run_id") != run_id:
            continue
        section = record.get(kind) or {}
        for name, value in (section.get("tier") or {}).items():
            if isinstance(value, (int, float)):
                sums[name] = sums.get(name, 0) + value
        for name in ("hits", "misses"):
            sums[name] = sums.get(name, 0) + (section.get(name) or 0)
    return sums


def case(command: list[str], env: dict[str, str], kind: str) -> dict[str, Any]:
    wall, cpu, _out = run(command, env)
    tier = tier_of(Path(env["GPU_CACHE_RECORDS"]), env["GPU_CACHE_RUN_ID"], kind)
    out: dict[str, Any] = {"wall": round(wall, 3), "cpu": round(cpu, 3),
                           "hits": int(tier.get("hits", 0)), "misses": int(tier.get("misses", 0))}
    moved = tier.get("fetched", 0) + tier.get("promoted", 0)
    if "seconds" in tier:
        out.update({"fetched": int(tier["fetched"]), "promoted": int(tier["promoted"]),
                    "bytes": int(tier["fetched_bytes"] + tier["promoted_bytes"]),
                    "tier_seconds": round(tier["seconds"], 4),
                    "ms_per_entry": round(1000 * tier["seconds"] / moved, 3) if moved else None})
    return out


def cases(command: list[str], kind: str, shared_base: Path | None, scratch: Path) -> dict[str, Any]:
    records = scratch / "records"
    records.mkdir(parents=True, exist_ok=True)
    base = shared_base or scratch
    root, straight = base / f"root-{uuid.uuid4().hex[:8]}", base / f"straight-{uuid.uuid4().hex[:8]}"
    local = scratch / "local"
    for folder in (root, straight):
        for name in ("jax", "triton"):
            (folder / name).mkdir(parents=True)
    try:
        out = {"straight, cold": case(command, environ(straight, None, records), kind),
               "straight, warm": case(command, environ(straight, None, records), kind),
               "tier, cold": case(command, environ(root, local, records), kind)}
        shutil.rmtree(local)  # a new node: the same fixed path, empty
        out["tier, new node"] = case(command, environ(root, local, records), kind)
        out["tier, warm node"] = case(command, environ(root, local, records), kind)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(straight, ignore_errors=True)
    return out


#: What the tier adds when a process imports jax, timed inside one process (the machine's load
#: moves a whole process's wall time by far more): loading its pieces, making the process's
#: tier, and looking for XLA's autotune files in the shared root.
AT_IMPORT = (
    "import sys, time\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "started = time.perf_counter()\n"
    "import gpu_cache_hook.tier.bound, gpu_cache_hook.tier\n"
    "tier = gpu_cache_hook.tier.get()\n"
    "tier.fetch_tree('jax', gpu_cache_hook.tier.XLA_AUTOTUNE)\n"
    "print((time.perf_counter() - started) * 1000)\n")


def startup(repeats: int, scratch: Path, shared: Path | None) -> dict[str, Any]:
    """``sitecustomize``'s import time (``python -X importtime -c pass``), tier off and on,
    and what the tier adds at ``import jax`` (the shared root in ``shared``, else local):
    medians in ms."""
    root, local, records = (shared or scratch) / "s-root", scratch / "s-local", scratch / "s-records"
    (root / "jax").mkdir(parents=True)
    samples: dict[str, list[float]] = {"tier off": [], "tier on": []}
    for _ in range(repeats):  # interleaved: load on the machine moves both alike
        for name, where in (("tier off", None), ("tier on", local)):
            done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"],
                                  env=environ(root, where, records), capture_output=True, text=True)
            line = next(x for x in done.stderr.splitlines() if x.split("|")[-1].strip() == "sitecustomize")
            samples[name].append(int(line.split("|")[1]) / 1000)
    out: dict[str, Any] = {"sitecustomize": {k: round(statistics.median(v), 3) for k, v in samples.items()}}
    at_import = [float(run([sys.executable, "-c", AT_IMPORT, str(HOOK)], environ(root, local, records))[2])
                 for _ in range(repeats)]
    out["tier at import jax"] = {"tier off": 0.0, "tier on": round(statistics.median(at_import), 3)}
    for row in out.values():
        row["added_ms"] = round(row["tier on"] - row["tier off"], 3)
    return out


def measure(args: argparse.Namespace, scratch: Path, shared: Path | None) -> dict[str, Any]:
    filler = scratch / "filler.py"
    filler.write_text(FILLER)
    return {"shared": "sshfs" if shared is not None else "local folder",
            "startup_ms": startup(args.repeats, scratch, shared),
            "jax": cases([sys.executable, str(filler), str(args.entries)], "jax", shared, scratch / "j"),
            "triton": cases(TRITON, "triton", shared, scratch / "t")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--sshfs", action="store_true", help="the shared roots on an sshfs mount")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tier-cost-") as scratch:
        scratch_path = Path(scratch)
        with contextlib.ExitStack() as stack:
            shared = None
            if args.sshfs:
                from sshfs_mount import SshfsMount  # tests/harness/sshfs_mount.py

                shared = stack.enter_context(SshfsMount(scratch_path / "sshfs")).mount_point
            results = measure(args, scratch_path, shared)
    print(f"{'startup (median ms)':28} {'tier off':>9} {'tier on':>9} {'added':>7}")
    for name, row in results["startup_ms"].items():
        print(f"{name:28} {row['tier off']:9} {row['tier on']:9} {row['added_ms']:7}")
    for kind in ("jax", "triton"):
        title = f"{kind} ({results['shared']})"
        print(f"\n{title:18} {'wall s':>7} {'hits':>5} {'miss':>5} {'fetch':>6} {'prom.':>6} {'bytes':>9} "
              f"{'tier s':>7} {'ms/entry':>8}")
        for name, row in results[kind].items():
            print(f"{name:18} {row['wall']:7} {row['hits']:5} {row['misses']:5} {row.get('fetched', ''):>6} "
                  f"{row.get('promoted', ''):>6} {row.get('bytes', ''):>9} {row.get('tier_seconds', ''):>7} "
                  f"{row.get('ms_per_entry') or '':>8}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
