"""A new site's time to a passed verdict: after ``gpu-cache fetch`` of a validated pack, against
after warming itself, measured side by side in one run.

    python tests/benchmarks/registry_start.py [--model builtin|twelve] [--small] [--rounds N]
                                              [--registry-binary PATH] [--out DIR]

A real registry (Debian's ``docker-registry``, tests/registry.py; ``--registry-binary`` names a
carried one) runs on loopback. Site A warms and validates an empty root and publishes it. Then,
round after round and in alternating order, two new sites start from empty roots at paths of
their own: one runs ``gpu-cache warm`` then ``gpu-cache validate``, the other ``gpu-cache fetch
REF@DIGEST`` then ``gpu-cache validate``. Each site's time is until its verdict says passed
(zero misses, no new entries). ``--model builtin``: the built-in jax-transformer workload (4
layers, sequence lengths 32, 64, 128; ``--small``: 16 only); ``--model twelve``: a 12-layer JAX
transformer (d_model 1024, 16 heads, batch 8, lengths 256, 512, 1024), the H200 baseline's model
(``--small``: 2 layers of d_model 64 at length 16, to try the path on a CPU).
Writes ``DIR/registry_start_<device>.json`` (default DIR: tests/benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "scripts"), str(REPO / "tests")]

from gpu_cache.core import device, software  # noqa: E402
from registry import RegistryServer  # noqa: E402

TWELVE = {
    "command": "{python} -m gpu_cache.workloads.jax_transformer --layers 12 --d-model 1024 --heads 16 "
    "--batch 8 --shape {shape}",
    "shapes": [256, 512, 1024],
    "expects": ["jax"],
}
_LEAKY = ("GPU_CACHE_", "JAX_", "TRITON_", "TORCHINDUCTOR_", "CUDA_CACHE_", "XLA_")


def config_of(model: str, small: bool) -> dict[str, Any]:
    if model == "twelve":  # --small: the same path at sizes a CPU runs in seconds
        twelve = (
            dict(
                TWELVE,
                command=TWELVE["command"].replace(
                    "--layers 12 --d-model 1024 --heads 16 --batch 8",
                    "--layers 2 --d-model 64 --heads 4 --batch 2",
                ),
                shapes=[16],
            )
            if small
            else TWELVE
        )
        return {
            "workloads": {"twelve": twelve},
            "default_workloads": ["twelve"],
            "validate": {"measure_cold": False},
        }
    shapes = {"workloads": {"jax-transformer": {"shapes": [16]}}} if small else {}
    return {**shapes, "validate": {"measure_cold": False}}


def environ() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY) and k != "PYTHONPATH"}
    # this checkout first, then what the caller put there (carried wheels on the H200)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "scripts"), os.environ.get("PYTHONPATH")) if p)
    return out


def cli(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "gpu_cache", *args],
        env=environ(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(
            f"gpu-cache {' '.join(args[:2])} failed ({result.returncode}): {result.stderr[-2000:]}"
        )
    return seconds, result


def site(work: Path, name: str, config: str, first: list[str] | None) -> dict[str, Any]:
    """A new site: an empty root; ``first``: the fetch command's arguments (None: warm itself)."""
    root = work / name / "cache root"
    common = ["--cache-root", str(root)]
    if first is None:
        before, _ = cli(
            "warm",
            "--config-json",
            config,
            *common,
            "--output",
            str(work / f"{name}-warm.json"),
            "--log",
            str(work / f"{name}-warm.log"),
        )
    else:
        before, _ = cli("fetch", *first, *common)
    check, _ = cli(
        "validate",
        "--config-json",
        config,
        *common,
        "--output",
        str(work / f"{name}.json"),
        "--log",
        str(work / f"{name}-validate.log"),
    )
    verdict = json.loads((work / f"{name}.json").read_text())
    if not verdict["passed"] or verdict["misses"] or verdict["new_entries"]:
        raise SystemExit(f"site {name}: the verdict did not pass: {verdict['problems']}")
    return {
        "seconds": round(before + check, 3),
        "first_step_seconds": round(before, 3),
        "validate_seconds": round(check, 3),
        "hits": verdict["hits"],
        "misses": verdict["misses"],
        "new_entries": verdict["new_entries"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("builtin", "twelve"), default="builtin")
    parser.add_argument("--small", action="store_true", help="length 16 only (twelve: also 2 small layers)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--registry-binary", help="a docker-registry binary to run (default: on PATH)")
    parser.add_argument("--out", default=str(REPO / "tests" / "benchmarks" / "results"))
    args = parser.parse_args()
    if args.registry_binary:
        folder = Path(args.registry_binary).resolve().parent
        if Path(args.registry_binary).name != "docker-registry":
            raise SystemExit("--registry-binary must name a file called docker-registry")
        os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
    config = json.dumps(config_of(args.model, args.small))
    here = device.detect()
    work = Path(tempfile.mkdtemp(prefix="registry-start-"))
    try:
        with RegistryServer(work / "registry") as server:
            tag = f"{server.host}/lab/cache:bench"
            origin = site(work, "a", config, None)
            seconds, result = cli(
                "publish",
                tag,
                "--cache-root",
                str(work / "a" / "cache root"),
                "--verdict",
                str(work / "a.json"),
                "--json",
            )
            report = json.loads(result.stdout)
            pinned = f"{server.host}/lab/cache@{report['digest']}"
            rounds = []
            for number in range(args.rounds):
                order = ("warm", "fetch") if number % 2 == 0 else ("fetch", "warm")
                done = {
                    how: site(work, f"{how}{number}", config, None if how == "warm" else [pinned])
                    for how in order
                }
                rounds.append({"order": list(order), **done})
                print(
                    f"round {number + 1}: after warm {done['warm']['seconds']:.1f} s, after fetch "
                    f"{done['fetch']['seconds']:.1f} s (fetch {done['fetch']['first_step_seconds']:.1f} s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    warm = statistics.median(r["warm"]["seconds"] for r in rounds)
    fetched = statistics.median(r["fetch"]["seconds"] for r in rounds)
    layers = report["layers"]
    out = {
        "what": "a new site's time to a passed verdict: fetch + validate against warm + validate",
        "model": args.model,
        "small": args.small,
        "config": json.loads(config),
        "device": {"name": here.name, "gpu_type": here.gpu_type, "count": here.count},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "software": software.identity(),
        "site_a": origin,
        "publish_seconds": round(seconds, 3),
        "pack_bytes": sum(x["size"] for x in layers.values()),
        "entries": {k: x["entries"] for k, x in layers.items()},
        "rounds": rounds,
        "median_after_warm_seconds": round(warm, 3),
        "median_after_fetch_seconds": round(fetched, 3),
        "ratio_warm_over_fetch": round(warm / fetched, 2),
    }
    target = Path(args.out) / f"registry_start_{here.gpu_type}{'_small' if args.small else ''}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{here.name}: a new site reaches a passed verdict in {fetched:.1f} s after fetch, {warm:.1f} s "
        f"after "
        f"warming itself ({warm / fetched:.1f}x); pack {out['pack_bytes'] / 1e6:.2f} MB, "
        f"{sum(out['entries'].values())} entries; wrote {target}"
    )


if __name__ == "__main__":
    main()
