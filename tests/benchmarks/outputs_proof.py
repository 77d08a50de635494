"""The outputs proof (issue 40) measured side by side: what it adds to validate's time, how
many built-in workloads are bit-identical cold vs warm, the run-to-run spread of those that
are not, and whether a well-formed but wrong entry of each kind is caught.

    python tests/benchmarks/outputs_proof.py --out DIR [--workloads jax-transformer,torch-compile,
        triton-kernels,jax-triton] [--repeats 3] [--attacks jax,triton,jax_triton,ptxas,inductor]
        [--af3-model-dir DIR [--af3-script PATH]] [--quick] [--allow-cpu]

Timing, per workload in a fresh cache root: warm once, validate once with the proof (its cold
pass compiles every program fresh and keeps the outputs), then validate ``--repeats`` times
with ``validate.outputs: off`` and with ``tolerant`` in turn. The cold pass is reused then, so
each of those runs the validate pass alone: the proof's cost is the difference of the two
passes' medians (the second run of each program in the same process, writing, reading and
comparing the outputs), as a share of the validate pass without it.

Attacks, per kind, in a fresh root: warm, validate, plant a wrong entry
(tests/harness/wrong_entries.py), validate (it must fail, name the entry and set it aside), warm
and validate again (it must pass). Without a GPU, Triton and jax-triton compare the binaries and
modules a GPU would run (nothing runs) and ptxas has no entries (jaxlib runs ptxas at a kernel's
first launch).

Writes DIR/outputs_proof.json and prints one line per workload and attack. Without an NVIDIA
GPU it exits 0 unless ``--allow-cpu``; ``--quick`` uses tiny shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "scripts"), str(REPO / "tests" / "harness")]

from gpu_cache.core import device  # noqa: E402
from wrong_entries import (  # noqa: E402
    HUNDRED,
    PLUS_ONE,
    TWO_GRAPHS,
    entries_of,
    plant_jax,
    ptxas_entries_of,
    swap_inductor_graph,
    swap_jax_triton_ptx,
    swap_ptxas_output,
    tear_triton,
    triton_groups,
)

#: The built-in workloads and their shapes: as shipped, and tiny (--quick).
SHAPES = {"jax-transformer": ([32, 64, 128], [16]), "torch-compile": ([32, 64], [16]),
          "triton-kernels": ([1000, 4096], [1000]), "jax-triton": ([256, 512], [256]),
          "alphafold3": ([256], [256])}
QUICK_ARGS = {"torch-compile": ["--blocks", "1", "--d-model", "32", "--heads", "2"]}
#: jaxlib's CUDA plugin, which jax-triton imports where no GPU jax is installed (.ci/run's).
PLUGIN = REPO / ".ci-cache" / "jax-cuda12-plugin"


def environ() -> dict[str, str]:
    """This environment without gpu-cache's and the tools' cache variables (the CLI sets its
    own; PYTHONPATH: this checkout's package, and without a GPU jaxlib's CUDA plugin for
    jax-triton's lowering). No test helper: the GPU image has no pytest."""
    gpu = device.detect().gpu_type != "cpu"
    extra = [str(PLUGIN)] if (PLUGIN / "jax_cuda12_plugin").is_dir() and not gpu else []
    leaky = ("GPU_CACHE_", "JAX_", "TRITON_", "TORCHINDUCTOR_", "CUDA_CACHE_", "XLA_")
    kept = {k: v for k, v in os.environ.items() if not k.startswith(leaky) and k != "PYTHONPATH"}
    before = os.environ.get("PYTHONPATH", "")  # carried wheels (--target folders) stay reachable
    return {**kept, "PYTHONPATH": os.pathsep.join(p for p in [str(REPO / "scripts"), *extra, before] if p)}


def cli(command: str, root: Path, config: dict[str, Any], work: Path) -> tuple[dict[str, Any], float]:
    """One ``gpu-cache`` command on ``root``: its JSON output and wall seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gpu_cache", command, "--config-json", json.dumps(config),
                           "--cache-root", str(root), "--log", str(work / "log"),
                           "--output", str(work / f"{command}.json")],
                          env=environ(), capture_output=True, text=True, timeout=7200)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"gpu-cache {command} exited {done.returncode}: {done.stderr[-1500:]}")
    return json.loads((work / f"{command}.json").read_text()), seconds


def workload_config(name: str, quick: bool, af3: dict[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"shapes": SHAPES[name][1 if quick else 0]}
    if quick and name in QUICK_ARGS:
        entry["args"] = QUICK_ARGS[name]
    if name == "alphafold3":
        entry.update(af3)
    return {"workloads": {name: entry}, "default_workloads": [name]}


def timing(name: str, quick: bool, repeats: int, af3: dict[str, str], scratch: Path) -> dict[str, Any]:
    """Validate with the proof off and on, in turn: the validate pass's seconds, the shapes'
    outcomes and figures."""
    root, base = scratch / "root", workload_config(name, quick, af3)
    cli("warm", root, base, scratch)
    first, _ = cli("validate", root, {**base, "validate": {"outputs": "tolerant"}}, scratch)
    passes: dict[str, list[float]] = {"off": [], "tolerant": []}
    walls: dict[str, list[float]] = {"off": [], "tolerant": []}
    shapes: list[dict[str, Any]] = []
    for _ in range(repeats):
        for mode in passes:
            verdict, wall = cli("validate", root, {**base, "validate": {"outputs": mode}}, scratch)
            passes[mode].append(verdict["warm_seconds"])
            walls[mode].append(round(wall, 3))
            shapes += verdict["outputs"].get("shapes", []) if mode == "tolerant" else []
    off, on = statistics.median(passes["off"]), statistics.median(passes["tolerant"])
    outcomes = sorted({s["outcome"] for s in shapes})
    spread = [{k: s.get(k) for k in ("shape", "outcome", "max_abs", "max_rel", "noise")}
              for s in shapes if s["outcome"] != "identical"]
    return {"cold_seconds": first["cold_seconds"], "validate_off": passes["off"],
            "validate_tolerant": passes["tolerant"], "cli_wall_off": walls["off"],
            "cli_wall_tolerant": walls["tolerant"], "added_seconds": round(on - off, 3),
            "added_share": round((on - off) / off, 4) if off else None,
            "bit_identical": outcomes == ["identical"], "outcomes": outcomes, "not_identical": spread,
            "first_passed": first["passed"], "problems": first["problems"][:5]}


def attack(kind: str, quick: bool, scratch: Path) -> dict[str, Any]:
    """Plant one wrong entry of ``kind`` in a warmed root: is it caught, named, set aside, and
    does the next warm and validation pass?"""
    root = scratch / "root"
    config, plant = ATTACKS[kind](scratch, quick)
    cli("warm", root, config, scratch)
    before, _ = cli("validate", root, config, scratch)
    key = plant(root, scratch)
    if key is None:
        return {"skipped": "no entry of this kind to plant (made only on a GPU)"}
    caught, _ = cli("validate", root, config, scratch)
    named = any(key in p for p in caught["problems"] if p.startswith(("outputs differ", "NaN where")))
    aside = any(k.endswith(key) for k in caught["outputs"].get("set_aside", {}).get(kind, []))
    cli("warm", root, config, scratch)
    after, _ = cli("validate", root, config, scratch)
    return {"entry": key, "passed_before": before["passed"], "failed": not caught["passed"],
            "named": named, "set_aside": aside, "next_passed": after["passed"],
            "problems": caught["problems"][:3]}


def _jax(scratch: Path, quick: bool) -> tuple[dict[str, Any], Callable[[Path, Path], str | None]]:
    (scratch / "plus.py").write_text(PLUS_ONE)
    command = f"{{python}} {scratch / 'plus.py'} {scratch}/out.npy"
    config = {"workloads": {"plus": {"command": command, "outputs": f"{scratch}/out.npy"}},
              "default_workloads": ["plus"]}
    return config, lambda root, at: plant_jax(root / "jax", "jit_plus_one", HUNDRED, "jit_hundred",
                                              at / "donor", environ())


def _triton(scratch: Path, quick: bool) -> tuple[dict[str, Any], Callable[[Path, Path], str | None]]:
    def plant(root: Path, _at: Path) -> str | None:
        groups = triton_groups(root, "tiled_matmul_kernel")
        return tear_triton(groups[0], groups[1]) if len(groups) > 1 else None

    return workload_config("triton-kernels", True, {}), plant


def _jax_triton(scratch: Path, quick: bool) -> tuple[dict[str, Any], Callable[[Path, Path], str | None]]:
    def plant(root: Path, _at: Path) -> str | None:
        found = entries_of(root / "jax_triton", "matmul_kernel")
        return swap_jax_triton_ptx(found[0], found[1]) if len(found) > 1 else None

    return workload_config("jax-triton", True, {}), plant


def _ptxas(scratch: Path, quick: bool) -> tuple[dict[str, Any], Callable[[Path, Path], str | None]]:
    def plant(root: Path, _at: Path) -> str | None:
        found = ptxas_entries_of(root / "ptxas", "matmul")
        return swap_ptxas_output(found[0], found[1]) if len(found) > 1 else None

    return workload_config("jax-triton", True, {}), plant


def _inductor(scratch: Path, quick: bool) -> tuple[dict[str, Any], Callable[[Path, Path], str | None]]:
    (scratch / "graphs.py").write_text(TWO_GRAPHS)
    command = f"{{python}} {scratch / 'graphs.py'} {scratch}/out.npz"
    config = {"workloads": {"graphs": {"command": command, "outputs": f"{scratch}/out.npz"}},
              "default_workloads": ["graphs"]}
    return config, lambda root, _at: swap_inductor_graph(root / "inductor")


ATTACKS = {"jax": _jax, "triton": _triton, "jax_triton": _jax_triton, "ptxas": _ptxas, "inductor": _inductor}


def described(found: dict[str, Any]) -> str:
    """One workload's line: the validate pass with and without the proof, and the outcome."""
    identical = ("bit-identical" if found["bit_identical"]
                 else f"{found['outcomes']} {found['not_identical'][:2]}")
    return (f"validate pass {statistics.median(found['validate_off']):.2f} s without the proof, "
            f"{statistics.median(found['validate_tolerant']):.2f} s with it "
            f"(+{found['added_seconds']:.2f} s, {100 * (found['added_share'] or 0):.1f}%); "
            f"cold vs warm: {identical}")


def machine() -> dict[str, Any]:
    from gpu_cache.commands.doctor import KEY_PACKAGES, installed_version

    return {"device": device.detect().as_dict(), "platform": platform.platform(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "versions": {p: installed_version(p) for p in KEY_PACKAGES},
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def guarded(what: str, run: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """``run`` in a scratch folder; its error as the result (one broken case keeps the others)."""
    with tempfile.TemporaryDirectory(prefix=f"outputs-proof-{what}-") as scratch:
        started = time.perf_counter()
        try:
            found = run(Path(scratch))
        except Exception as exc:  # noqa: BLE001 - reported with the figures, not raised
            found = {"error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
        return {**found, "seconds": round(time.perf_counter() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for outputs_proof.json")
    parser.add_argument("--workloads", default="jax-transformer,torch-compile,triton-kernels,jax-triton")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--repeats", type=int, default=3, help="validations per mode (default 3)")
    parser.add_argument("--af3-model-dir", help="AlphaFold 3's weights: adds the alphafold3 workload")
    parser.add_argument("--af3-script", help="its run_alphafold.py (default: found in the image)")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (to test the script)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes")
    args = parser.parse_args()
    names = [n for n in args.workloads.split(",") if n] + (["alphafold3"] if args.af3_model_dir else [])
    unknown = (set(names) - set(SHAPES)) | (set(args.attacks.split(",")) - set(ATTACKS) - {""})
    if unknown:
        parser.error(f"unknown workloads or attacks: {', '.join(sorted(unknown))}")
    if device.detect().gpu_type == "cpu" and not args.allow_cpu:
        print("outputs_proof: no NVIDIA GPU visible; skipped (nothing measured)")
        return 0
    af3 = {k: v for k, v in (("model_dir", args.af3_model_dir), ("script", args.af3_script)) if v}
    result: dict[str, Any] = {"machine": machine(), "repeats": args.repeats, "quick": args.quick,
                              "workloads": {}, "attacks": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        found = result["workloads"][name] = guarded(
            name, lambda s, n=name: timing(n, args.quick, args.repeats, af3, s))
        print(f"{name}: {found.get('error') or described(found)}", flush=True)
        (out / "outputs_proof.json").write_text(json.dumps(result, indent=1) + "\n")
    for kind in (k for k in args.attacks.split(",") if k):
        found = result["attacks"][kind] = guarded(kind, lambda s, k=kind: attack(k, args.quick, s))
        shown = {k: v for k, v in found.items() if k != "problems"}
        print(f"attack {kind}: {json.dumps(shown)}", flush=True)
        (out / "outputs_proof.json").write_text(json.dumps(result, indent=1) + "\n")
    timed = [w for w in result["workloads"].values() if "error" not in w]
    if timed:
        print(f"bit-identical cold vs warm: {sum(w['bit_identical'] for w in timed)} of {len(timed)} "
              f"workloads; the proof adds {100 * max(w['added_share'] or 0 for w in timed):.1f}% at most")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
