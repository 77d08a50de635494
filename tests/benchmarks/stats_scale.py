"""Benchmark: `gpu-cache stats` and `gpu-cache prune --dry-run` on a big synthetic cache.

    python tests/benchmarks/stats_scale.py [--entries 100000] [--triton-share 0.3]
        [--records 5000] [--out FILE]

Builds, in a temporary folder, a cache root with ``entries`` entries: JAX-style
``<name>-<sha256>-cache`` files and Triton-style key directories (``<base32 key>/`` with
``<kernel>.{source,ttir,cubin,json}`` and a ``__grp__<kernel>.json`` manifest listing them
by absolute path), spread over 90 days of last use, plus ``records`` stats-hook records.
Then times each command as a real CLI process (what a user waits for) and prints the figures;
``--out`` also writes them as JSON with the machine and versions.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def build(root: Path, entries: int, triton_share: float, records: int) -> None:
    """Write the synthetic cache under ``root``."""
    jax_dir, triton_dir, record_dir = root / "jax", root / "triton", root / "records"
    for folder in (jax_dir, triton_dir, record_dir):
        folder.mkdir(parents=True)
    now = time.time()
    n_triton = int(entries * triton_share)
    for i in range(entries - n_triton):
        digest = hashlib.sha256(str(i).encode()).hexdigest()
        path = jax_dir / f"jit_fn{i % 200}-{digest}-cache"
        path.write_bytes(b"x" * (200 + i % 5000))
        when = now - (i % 90) * 86400.0
        os.utime(path, (when, when))
    for i in range(n_triton):
        key = base64.b32encode(hashlib.sha256(f"t{i}".encode()).digest()).decode()[:52]
        folder = triton_dir / key
        folder.mkdir()
        kernel = f"kernel_{i % 100}"
        children = {}
        for suffix, size in ((".source", 300), (".ttir", 800), (".cubin", 4000), (".json", 400)):
            (folder / f"{kernel}{suffix}").write_bytes(b"y" * size)
            children[f"{kernel}{suffix}"] = str(folder / f"{kernel}{suffix}")
        (folder / f"__grp__{kernel}.json").write_text(json.dumps({"child_paths": children}))
        when = now - (i % 90) * 86400.0
        os.utime(folder, (when, when))
    for i in range(records):
        record = {"version": 1, "time": now - i, "host": f"node{i % 8}", "pid": i,
                  "rule": f"rule{i % 12}", "gpu_type": ("h200", "a100")[i % 2], "run_id": None,
                  "jax": {"requests": 20, "hits": 18, "misses": 2, "compile_seconds": 3.0,
                          "saved_seconds": 25.0, "missed": [], "key_parts": {}}}
        (record_dir / f"{i}-node-{i}.json").write_text(json.dumps(record))


def timed(*args: str) -> float:
    """Seconds one ``python -m gpu_cache ARGS`` process takes; raises if it fails."""
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gpu_cache", *args], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"gpu-cache {' '.join(args)} failed: {done.stderr[-500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--triton-share", type=float, default=0.3)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-cache-scale-") as temp:
        root = Path(temp) / "cache"
        started = time.perf_counter()
        build(root, args.entries, args.triton_share, args.records)
        build_seconds = time.perf_counter() - started
        common = ("--cache-root", str(root))
        figures = {
            "stats_json_s": timed("stats", "--json", *common),
            "stats_s": timed("stats", *common),
            "prune_dry_run_s": timed("prune", "--dry-run", "--max-age", "30d", "--max-size", "100M",
                                     "--json", *common),
        }
    result = {"entries": args.entries, "triton_share": args.triton_share, "records": args.records,
              "build_s": round(build_seconds, 1), **{k: round(v, 2) for k, v in figures.items()},
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
              "python": platform.python_version()}
    for name, value in result.items():
        print(f"{name:>16}: {value}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
