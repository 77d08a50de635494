"""The outputs proof (issues 40 and 47) measured side by side: for each built-in workload (and
AlphaFold 3 at one bucket), whether validate reproduces the writer's outputs bit for bit, the
writer's own run-to-run spread, how far a fresh compile lies; what the proof adds to warm and to
validate; and whether a well-formed but wrong entry of each kind is caught.

    python tests/benchmarks/outputs_proof.py --out DIR [--workloads jax-transformer,torch-compile,
        triton-kernels,jax-triton] [--repeats 3] [--warm-repeats 1] [--attacks jax,dense,precision,
        triton,jax_triton,ptxas,inductor] [--af3 [--af3-bucket 256] [--af3-args ARGS]
        [--af3-python PY]] [--quick] [--allow-cpu]

Per workload, in fresh cache roots: warm with ``validate.outputs: off`` and with the proof (each
program runs twice and the writer's outputs are kept with the bytes of the entries its processes
compiled) in turn, ``--warm-repeats`` times each; the added warm time is the difference of the
medians of the passes (runs and the proof's own keeping). Then validate the last root warmed
with the proof once with the cold pass (a fresh compile: the figure), and ``--repeats`` times
with ``off`` and ``identical`` in turn (the cold pass reused): the added validate time is the
difference of the two passes' medians (the second run of each program, reading, digesting and
comparing). The report gives each shape's outcome against its writer (identical, within
run-to-run noise, ...), the writer's spread, the figures, and the fresh compile's figure.
Target (issue 47): at most 10% added to either.

Attacks, per kind, in a fresh root: warm, validate, plant a wrong entry (tests/harness/
wrong_entries.py), validate (it must fail, name the entry and set it aside), warm and validate
again (it must pass). ``dense``: a dense layer's executable without its bias under the layer's
key (0.7% of the magnitude); ``precision``: the same layer compiled with
``jax_default_matmul_precision=highest`` under the default's key (XLA on a CPU computes the same
bits for every precision: there it is no wrong entry, and passes). Without a GPU, Triton and
jax-triton compare the binaries and modules a GPU would run, and ptxas has no entries.

``--af3`` adds the ``alphafold3`` workload at ``--af3-bucket`` on random weights, driving
tests/fixtures/af3_run_alphafold.py (the wheel's real network; ``--af3-args`` are its flags, by
default the full network with tokamax's XLA GLU: see tests/benchmarks/alphafold3_gpu.py for the
carry, whose site must be on PYTHONPATH).

Writes DIR/outputs_proof.json and prints one line per workload and attack. Without an NVIDIA
GPU it exits 0 unless ``--allow-cpu``; ``--quick`` uses tiny shapes.

On the H200 (its image has jax 0.11.2, triton 3.6.0 and torch, not jsonschema, which gpu-cache's
config check imports, nor jax-triton): ``bash tests/benchmarks/jax_triton_wheels.sh`` builds
``.whl/`` here (jax-triton 0.3.1 and jsonschema's closure), and ``bash
tests/benchmarks/alphafold3_wheels.sh`` builds ``.carry/af3/`` (49 MiB, jsonschema's closure in
it). Each call below fits the 600 s a command may take; carry ``.whl`` for the first four:

    pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
      export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 &&
      python3 tests/benchmarks/outputs_proof.py --out $OUT --workloads jax-transformer,triton-kernels \
        --attacks "" --repeats 3 --warm-repeats 2
    (the same, then) ... --workloads jax-triton,torch-compile --attacks "" --repeats 3 --warm-repeats 1
    (the same, then) ... --workloads "" --attacks jax,dense,precision,ptxas
    (the same, then) ... --workloads "" --attacks triton,jax_triton,inductor

and for AlphaFold 3 at bucket 256, carry ``.carry/af3``:

    pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .carry/af3/wheels/*.whl && cp .carry/af3/dictionary/* /tmp/site/alphafold3/constants/converters/ &&
      cp -r .carry/af3/stub/xprof /tmp/site/ && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 &&
      python3 tests/benchmarks/outputs_proof.py --out $OUT --workloads "" --attacks "" --af3 \
        --af3-bucket 256 --repeats 3 --warm-repeats 2
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
    DENSE,
    DENSE_HIGHEST,
    DENSE_WITHOUT_BIAS,
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
          "alphafold3": ([256], [16])}
QUICK_ARGS = {"torch-compile": ["--blocks", "1", "--d-model", "32", "--heads", "2"],
              "alphafold3": ["--num_recycles=1", "--num_diffusion_samples=1", "--num_sampling_steps=2",
                             "--flash_attention_implementation=xla", "--no_preinit"]}
#: AlphaFold 3's flags on a GPU: the whole network, tokamax's XLA GLU (its Triton GLU does not
#: lower on the H100/H200 image's Triton 3.6: tests/benchmarks/alphafold3_gpu.py).
AF3_ARGS = ["--glu=xla"]
AF3_SCRIPT = REPO / "tests" / "fixtures" / "af3_run_alphafold.py"
#: jaxlib's CUDA plugin, which jax-triton imports where no GPU jax is installed (.ci/run's).
PLUGIN = REPO / ".ci-cache" / "jax-cuda12-plugin"


def environ(plugin: bool = True) -> dict[str, str]:
    """This environment without gpu-cache's and the tools' cache variables (the CLI sets its
    own; PYTHONPATH: this checkout's package, and without a GPU jaxlib's CUDA plugin for
    jax-triton's lowering, where ``plugin``: it is this Python's, not AlphaFold 3's). No test
    helper: the GPU image has no pytest."""
    gpu = device.detect().gpu_type != "cpu"
    extra = [str(PLUGIN)] if (PLUGIN / "jax_cuda12_plugin").is_dir() and not gpu and plugin else []
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
                          env=environ(plugin="alphafold3" not in config["workloads"]), capture_output=True,
                          text=True, timeout=7200)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"gpu-cache {command} exited {done.returncode}: {done.stderr[-1500:]}")
    return json.loads((work / f"{command}.json").read_text()), seconds


def workload_config(name: str, quick: bool, af3: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"shapes": SHAPES[name][1 if quick else 0]}
    if quick and name in QUICK_ARGS:
        entry["args"] = QUICK_ARGS[name]
    python = {}
    if name == "alphafold3":
        entry.update({k: v for k, v in af3.items() if k != "python"})
        python = {"python": af3["python"]} if af3.get("python") else {}
    return {"workloads": {name: entry}, "default_workloads": [name], **python}


def _mode(base: dict[str, Any], outputs: str, **validate: Any) -> dict[str, Any]:
    return {**base, "validate": {"outputs": outputs, **validate}}


def _share(on: float, off: float) -> float | None:
    return round((on - off) / off, 4) if off else None


def warms(base: dict[str, Any], repeats: int, scratch: Path) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Warm fresh roots without and with the proof in turn, ``repeats`` times each: the last
    warm with the proof (its root is ``scratch/on``) and each pass's seconds (its runs and the
    proof's own keeping)."""
    seconds: dict[str, list[float]] = {"off": [], "identical": []}
    last: dict[str, Any] = {}
    for n in range(repeats):
        for mode in seconds:
            root = scratch / ("on" if mode == "identical" and n == repeats - 1 else f"{mode}-{n}")
            last, _wall = cli("warm", root, _mode(base, mode), scratch)
            seconds[mode].append(round(last["seconds"] + last.get("proof_seconds", 0.0), 3))
    return last, seconds


def timing(name: str, quick: bool, repeats: int, warm_repeats: int, af3: dict[str, Any],
           scratch: Path) -> dict[str, Any]:
    """Warm without and with the proof (fresh roots), then validate with the cold figure once
    and with the proof off and on in turn: the passes' seconds, the shapes' outcomes and figures."""
    base = workload_config(name, quick, af3)
    warm_on, warm = warms(base, warm_repeats, scratch)
    kept = [r["outputs"].get("reference") for r in warm_on["runs"] if r.get("outputs")]
    root = scratch / "on"
    first, _ = cli("validate", root, _mode(base, "identical"), scratch)
    passes: dict[str, list[float]] = {"off": [], "identical": []}
    walls: dict[str, list[float]] = {"off": [], "identical": []}
    proof: list[float] = []
    for _ in range(repeats):
        for mode in passes:
            verdict, wall = cli("validate", root, _mode(base, mode), scratch)
            passes[mode].append(verdict["warm_seconds"] + (verdict["outputs"].get("seconds") or 0.0))
            walls[mode].append(round(wall, 3))
            proof += [verdict["outputs"].get("seconds") or 0.0] if mode == "identical" else []
    off, on = statistics.median(passes["off"]), statistics.median(passes["identical"])
    warm_off, warm_on_seconds = statistics.median(warm["off"]), statistics.median(warm["identical"])
    figures = ("shape", "outcome", "entries", "max_abs", "max_rel", "spread", "noise", "fresh_compile", "why")
    shapes = first["outputs"].get("shapes", [])
    return {"warm_off": warm_off, "warm_on": warm_on_seconds, "warm_passes": warm,
            "warm_proof_seconds": warm_on.get("proof_seconds"),
            "warm_added_share": _share(warm_on_seconds, warm_off), "references_kept": kept,
            "cold_seconds": first["cold_seconds"],
            "validate_off": passes["off"], "validate_identical": passes["identical"],
            "validate_proof_seconds": proof, "cli_wall": walls,
            "validate_added_seconds": round(on - off, 3), "validate_added_share": _share(on, off),
            "writer_vs_validate": [{k: shape.get(k) for k in figures} for shape in shapes],
            "bit_identical": bool(shapes) and all(s["outcome"] == "identical" for s in shapes),
            "fresh_compile": first["outputs"].get("fresh_compile"), "first_passed": first["passed"],
            "problems": first["problems"][:5]}


def attack(kind: str, quick: bool, scratch: Path) -> dict[str, Any]:
    """Plant one wrong entry of ``kind`` in a warmed root: is it caught, named, set aside, and
    does the next warm and validation pass?"""
    root = scratch / "root"
    config, plant = ATTACKS[kind](scratch, quick)
    config = {**config, "validate": {"measure_cold": False}}
    cli("warm", root, config, scratch)
    before, _ = cli("validate", root, config, scratch)
    key = plant(root, scratch)
    if key is None:
        return {"skipped": "no entry of this kind to plant (made only on a GPU)"}
    caught, _ = cli("validate", root, config, scratch)
    named = any(key in p for p in caught["problems"] if p.startswith(("outputs differ", "NaN where")))
    store = "jax" if kind in ("dense", "precision") else kind
    aside = any(k.endswith(key) for k in caught["outputs"].get("set_aside", {}).get(store, []))
    cli("warm", root, config, scratch)
    after, _ = cli("validate", root, config, scratch)
    shapes = [{k: s.get(k) for k in ("shape", "outcome", "entries", "max_abs", "max_rel")}
              for s in caught["outputs"].get("shapes", [])]
    return {"entry": key, "passed_before": before["passed"], "failed": not caught["passed"],
            "named": named, "set_aside": aside, "next_passed": after["passed"], "shapes": shapes,
            "problems": caught["problems"][:3]}


def _user(scratch: Path, name: str, program: str, suffix: str = ".npy") -> dict[str, Any]:
    (scratch / f"{name}.py").write_text(program)
    command = f"{{python}} {scratch / name}.py {scratch}/out{suffix}"
    return {"workloads": {name: {"command": command, "outputs": f"{scratch}/out{suffix}"}},
            "default_workloads": [name]}


def _jax(scratch: Path, quick: bool) -> tuple[dict[str, Any], Callable[[Path, Path], str | None]]:
    return _user(scratch, "plus", PLUS_ONE), lambda root, at: plant_jax(
        root / "jax", "jit_plus_one", HUNDRED, "jit_hundred", at / "donor", environ())


def _dense(scratch: Path, quick: bool) -> tuple[dict[str, Any], Callable[[Path, Path], str | None]]:
    return _user(scratch, "dense", DENSE), lambda root, at: plant_jax(
        root / "jax", "jit_dense", DENSE_WITHOUT_BIAS, "jit_dense_without_bias", at / "donor", environ())


def _precision(scratch: Path, quick: bool) -> tuple[dict[str, Any], Callable[[Path, Path], str | None]]:
    return _user(scratch, "dense", DENSE), lambda root, at: plant_jax(
        root / "jax", "jit_dense", DENSE_HIGHEST, "jit_dense", at / "donor", environ())


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
    config = _user(scratch, "graphs", TWO_GRAPHS, ".npz")
    return config, lambda root, _at: swap_inductor_graph(root / "inductor")


ATTACKS = {"jax": _jax, "dense": _dense, "precision": _precision, "triton": _triton,
           "jax_triton": _jax_triton, "ptxas": _ptxas, "inductor": _inductor}


def described(found: dict[str, Any]) -> str:
    """One workload's line: the passes with and without the proof, and the outcome."""
    shapes = found["writer_vs_validate"]
    outcome = "bit-identical" if found["bit_identical"] else "; ".join(
        f"{s['shape']}: {s['outcome']} (max_abs {s['max_abs']}, spread {s['spread']})" for s in shapes)
    fresh = found.get("fresh_compile") or {}
    validate = [statistics.median(found[f"validate_{mode}"]) for mode in ("off", "identical")]
    return (f"warm {found['warm_off']:.2f} s without the proof, {found['warm_on']:.2f} s with it "
            f"({100 * (found['warm_added_share'] or 0):+.1f}%); "
            f"validate {validate[0]:.2f} s, {validate[1]:.2f} s "
            f"({100 * (found['validate_added_share'] or 0):+.1f}%); writer vs validate: {outcome}; "
            f"fresh compile: {fresh.get('identical')} of {fresh.get('shapes')} bit-identical, "
            f"max_rel {fresh.get('max_rel')}")


def machine() -> dict[str, Any]:
    from gpu_cache.core import software

    return {"device": device.detect().as_dict(), "platform": platform.platform(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "versions": software.identity(),
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
    parser.add_argument("--warm-repeats", type=int, default=1,
                        help="warms of fresh roots per mode (default 1: a warm compiles everything)")
    parser.add_argument("--af3", action="store_true", help="add the alphafold3 workload (random weights)")
    parser.add_argument("--af3-bucket", type=int, help="its one bucket (default 256; --quick: 16)")
    parser.add_argument("--af3-args", help=f"its flags, space-separated (default: {' '.join(AF3_ARGS)})")
    parser.add_argument("--af3-python", help="the Python that has AlphaFold 3 (default: the config's python)")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (to test the script)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes")
    args = parser.parse_args()
    names = [n for n in args.workloads.split(",") if n] + (["alphafold3"] if args.af3 else [])
    unknown = (set(names) - set(SHAPES)) | (set(args.attacks.split(",")) - set(ATTACKS) - {""})
    if unknown:
        parser.error(f"unknown workloads or attacks: {', '.join(sorted(unknown))}")
    if device.detect().gpu_type == "cpu" and not args.allow_cpu:
        print("outputs_proof: no NVIDIA GPU visible; skipped (nothing measured)")
        return 0
    if args.af3_bucket:
        SHAPES["alphafold3"] = ([args.af3_bucket], [args.af3_bucket])
    af3: dict[str, Any] = {"script": str(AF3_SCRIPT), "python": args.af3_python}
    if args.af3_args is not None or not args.quick:
        af3["args"] = (args.af3_args or " ".join(AF3_ARGS)).split()
    result: dict[str, Any] = {"machine": machine(), "repeats": args.repeats, "quick": args.quick,
                              "workloads": {}, "attacks": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        found = result["workloads"][name] = guarded(
            name, lambda s, n=name: timing(n, args.quick, args.repeats, args.warm_repeats, af3, s))
        print(f"{name}: {found.get('error') or described(found)}", flush=True)
        (out / "outputs_proof.json").write_text(json.dumps(result, indent=1) + "\n")
    for kind in (k for k in args.attacks.split(",") if k):
        found = result["attacks"][kind] = guarded(kind, lambda s, k=kind: attack(k, args.quick, s))
        shown = {k: v for k, v in found.items() if k != "problems"}
        print(f"attack {kind}: {json.dumps(shown)}", flush=True)
        (out / "outputs_proof.json").write_text(json.dumps(result, indent=1) + "\n")
    timed = [w for w in result["workloads"].values() if "error" not in w]
    if timed:
        warm = 100 * max(w["warm_added_share"] or 0 for w in timed)
        validate = 100 * max(w["validate_added_share"] or 0 for w in timed)
        print(f"writer vs validate bit-identical: {sum(w['bit_identical'] for w in timed)} of {len(timed)} "
              f"workloads; the proof adds at most {warm:.1f}% to warm and {validate:.1f}% to validate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
