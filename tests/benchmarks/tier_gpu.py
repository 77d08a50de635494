"""The node-local tier on a GPU (issue 23, figure e): its own cost, and XLA's kept autotune results.

    PYTHONPATH=scripts python3 tests/benchmarks/tier_gpu.py --out DIR [--quick --allow-cpu]

Every case runs in fresh processes, side by side in one run; the shared root and each "node's"
local folder are folders of their own on this machine (the H200 reaches no network filesystem:
the network read path is measured over sshfs by tests/benchmarks/tier_nodes.py).

1. ``xla``: XLA's per-fusion autotune results, kept in the local tier and promoted to the root.
   A jitted program of several bf16 GEMMs with fused epilogues (XLA autotunes each GEMM fusion
   on the GPU). ``cold``: empty root, empty local folder. ``miss, autotune kept``: the same root
   with its JAX entries deleted (the autotune results stay) seen from a new node (an empty local
   folder): every computation compiles again, and reads its autotune results. ``miss, nothing
   kept``: a new root and a new node: compiles and autotunes again. The second's compile seconds
   over the third's is what the kept results save on a compile miss.
2. ``jax`` and ``fla``: the tier's own cost for the 12-layer JAX transformer and a
   flash-linear-attention call. ``straight, warm``: the tier off, a warm root. ``tier, new node``:
   a warm root and an empty local folder (every entry copied in). ``tier, warm node``: the same
   local folder again. ``tier, cold``: an empty root (every entry promoted). The records' ``tier``
   counters give the seconds spent fetching and promoting.

Writes DIR/gpu_tier.json and prints it. Without an NVIDIA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_benchmark as bench
from gpu_benchmark import FLA, REPO, jax_command, machine, run_one

from gpu_cache.config.settings import settings_from
from gpu_cache.core import device, hook_records
from gpu_cache.jobenv import env

AUTOTUNE_DIR = "xla_gpu_per_fusion_autotune_cache_dir"

GEMMS = r'''
import json, sys, time
import jax, jax.numpy as jnp
quick = sys.argv[1:] == ["--quick"]
shapes = [(256, 512, 384)] if quick else [
    (1024, 4096, 1024), (2048, 1024, 4096), (4096, 4096, 512), (512, 8192, 2048),
    (3072, 768, 3072), (1536, 6144, 1536), (8192, 512, 1024), (768, 2304, 768)]
def step(m, k, n):
    def f(x, w, b):
        return jax.nn.gelu(x @ w + b) * 0.5
    return jax.jit(f)
started = time.perf_counter()
for m, k, n in shapes:
    x = jnp.ones((m, k), jnp.bfloat16)
    w = jnp.ones((k, n), jnp.bfloat16)
    b = jnp.ones((n,), jnp.bfloat16)
    step(m, k, n)(x, w, b).block_until_ready()
print(json.dumps({"seconds": round(time.perf_counter() - started, 3), "gemms": len(shapes)}))
'''


def new_node(local: Path) -> Path:
    """``local`` emptied, as a new node sees it: its folder moved aside. The path stays the same
    on every node (jax <= 0.11 hashes XLA's autotune folder path into every key)."""
    if local.exists():
        local.rename(local.with_name(f"{local.name}-{bench.uuid.uuid4().hex[:8]}"))
    return local


def tier_environ(root: Path, local: Path | None) -> dict[str, str]:
    """gpu-cache's job environment on ``root``, through the tier in ``local`` (None: tier off)."""
    mode = {"mode": "on", "folder": str(local)} if local is not None else {"mode": "off"}
    environ = env.job_environ(env.resolve(settings_from({"local_tier": mode}, cache_root=str(root))))
    environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    parts = [str(REPO / "scripts"), *environ.get("PYTHONPATH", "").split(":")]
    environ["PYTHONPATH"] = ":".join(p for p in parts if p)
    environ["GPU_CACHE_RUN_ID"] = bench.uuid.uuid4().hex
    return environ


def tier_counters(records: Path, run_id: str) -> dict[str, dict[str, float]]:
    """The records' ``tier`` counters of one run, summed per kind."""
    sums: dict[str, dict[str, float]] = {}
    for record in hook_records.read(records, run_id):
        for kind, part in record.items():
            tier = part.get("tier") if isinstance(part, dict) else None
            for name, value in (tier or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    into = sums.setdefault(kind, {})
                    into[name] = round(into.get(name, 0) + value, 3)
    return sums


def case(command: list[str], environ: dict[str, str]) -> dict[str, Any]:
    run = run_one(command, environ)
    run["tier"] = tier_counters(Path(environ["GPU_CACHE_RECORDS"]), environ["GPU_CACHE_RUN_ID"])
    return run


def autotune_files(folder: Path) -> int:
    """XLA's per-fusion autotune results anywhere under ``folder`` (a root or a local tier)."""
    return sum(1 for where in folder.rglob(AUTOTUNE_DIR) for p in where.rglob("*") if p.is_file())


def section_xla(scratch: Path, quick: bool) -> dict[str, Any]:
    program = scratch / "gemms.py"
    program.write_text(GEMMS)
    command = [sys.executable, str(program), *(["--quick"] if quick else [])]
    root, other, local = scratch / "root", scratch / "other-root", scratch / "local"
    out: dict[str, Any] = {"cold": case(command, tier_environ(root, local))}
    out["autotune_files"] = {"local": autotune_files(local), "shared": autotune_files(root)}
    for entry in (root / "jax").glob("*-cache"):
        entry.unlink()
    out["miss, autotune kept"] = case(command, tier_environ(root, new_node(local)))
    out["miss, nothing kept"] = case(command, tier_environ(other, new_node(local)))

    def compile_seconds(run: dict[str, Any]) -> float:
        return float(run.get("cache", {}).get("jax", {}).get("compile_seconds") or 0.0)

    kept, plain = compile_seconds(out["miss, autotune kept"]), compile_seconds(out["miss, nothing kept"])
    out["compile_seconds_kept_over_not_kept"] = round(kept / plain, 3) if plain else None
    return out


def tier_cost(command: list[str], scratch: Path) -> dict[str, Any]:
    straight = scratch / "straight-root"
    case(command, tier_environ(straight, None))
    root, local = scratch / "root", scratch / "local"
    out = {"straight, warm": case(command, tier_environ(straight, None)),
           "tier, cold": case(command, tier_environ(root, local)),
           "tier, new node": case(command, tier_environ(root, new_node(local))),
           "tier, warm node": case(command, tier_environ(root, local))}
    base = out["straight, warm"]["wall_seconds"]
    for name in ("tier, new node", "tier, warm node"):
        out[f"{name} over straight"] = round(out[name]["wall_seconds"] / base, 3) if base else None
    return out


def section_jax(scratch: Path, quick: bool) -> dict[str, Any]:
    return tier_cost(jax_command(quick, batch=2), scratch)


def section_fla(scratch: Path, quick: bool) -> dict[str, Any]:
    return tier_cost([*FLA, "--tokens", "2048"], scratch)


SECTIONS = {"xla": section_xla, "jax": section_jax, "fla": section_fla}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for gpu_tier.json")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (to test the script)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    if device.detect().gpu_type == "cpu" and not args.allow_cpu:
        print("tier_gpu: no NVIDIA GPU visible; skipped (nothing measured)")
        return 0
    results: dict[str, Any] = {"machine": machine()}
    for name in args.sections.split(","):
        with tempfile.TemporaryDirectory(prefix=f"gpu-tier-{name}-") as scratch:
            started = time.perf_counter()
            try:
                results[name] = SECTIONS[name](Path(scratch), args.quick)
            except Exception as exc:  # noqa: BLE001 - one broken section must not lose the others
                results[name] = {"error": repr(exc)}
            results[name]["seconds"] = round(time.perf_counter() - started, 1)
        print(f"== {name}\n{json.dumps(results[name], indent=1)[:4000]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_tier.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
