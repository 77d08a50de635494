"""GPU benchmark: warm start, fan-out, end to end and overheads, measured side by side.

    python tests/benchmarks/gpu_benchmark.py --out DIR [--sections jax,triton,fla,fanout,e2e,overhead]

Every case runs in fresh processes. "no cache" switches JAX's cache off and gives Triton an
empty folder; "cold" is gpu-cache's environment on an empty cache root; "warm" is the same
root again. Each section writes DIR/gpu_<section>.json (figures, machine, versions) as soon
as it is done, and prints a summary line per case. Without an NVIDIA GPU it prints why and
exits 0, so CI machines skip it; `--allow-cpu --quick` runs the logic on a CPU with tiny sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from gpu_cache import device, env, records  # noqa: E402
from gpu_cache.doctor import KEY_PACKAGES, _version  # noqa: E402
from gpu_cache.settings import settings_from  # noqa: E402

FLA = [sys.executable, str(REPO / "tests" / "benchmarks" / "fla_workload.py")]


def jax_command(quick: bool) -> list[str]:
    size = (["--layers", "2", "--d-model", "64", "--heads", "4", "--batch", "2", "--shape", "16,32,64"]
            if quick else ["--layers", "12", "--d-model", "1024", "--heads", "16", "--batch", "8",
                           "--shape", "256,512,1024"])
    return [sys.executable, "-m", "gpu_cache.workloads.jax_transformer", *size]


def cache_environ(root: Path | None, scratch: Path) -> dict[str, str]:
    """gpu-cache's job environment on ``root``; ``None``: every cache off or empty."""
    if root is None:
        environ = env.job_environ(env.resolve(settings_from({}, cache_root="none")))
        environ["TRITON_CACHE_DIR"] = str(scratch / f"empty-{uuid.uuid4().hex[:8]}")
        environ["CUDA_CACHE_DISABLE"] = "1"
    else:
        environ = env.job_environ(env.resolve(settings_from({}, cache_root=str(root))))
    parts = [str(REPO / "scripts"), *environ.get("PYTHONPATH", "").split(os.pathsep)]
    environ["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    environ["GPU_CACHE_RUN_ID"] = uuid.uuid4().hex
    return environ


def start(command: list[str], environ: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(command, env=environ, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str], started: float) -> dict[str, Any]:
    """Wait for one process: wall and CPU seconds (its own and its waited-for children's)."""
    _pid, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    out = process.stdout.read() if process.stdout else ""
    err = process.stderr.read() if process.stderr else ""
    line = next((text for text in reversed(out.splitlines()) if text.startswith("{")), "{}")
    return {"wall_seconds": round(wall, 3), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "returncode": process.returncode, "result": json.loads(line),
            "stderr_tail": err[-800:] if process.returncode else ""}


def run_one(command: list[str], environ: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    run = finish(start(command, environ, cwd), time.perf_counter())
    root = environ.get("GPU_CACHE_RECORDS")
    if root:
        run["cache"] = records.totals(list(records.read(Path(root), environ["GPU_CACHE_RUN_ID"])))
        for kind in run["cache"].values():
            kind["missed"] = len(kind["missed"])
    return run


def run_many(command: list[str], environs: list[dict[str, str]]) -> dict[str, Any]:
    """Start the processes together; wall is until the last one ends."""
    started = time.perf_counter()
    processes = [start(command, environ) for environ in environs]
    runs = [finish(p, started) for p in processes]
    return {"wall_seconds": round(time.perf_counter() - started, 3),
            "cpu_seconds": round(sum(r["cpu_seconds"] for r in runs), 2),
            "all_ok": all(r["returncode"] == 0 for r in runs),
            "worker_wall_seconds": [r["wall_seconds"] for r in runs],
            "failures": [r["stderr_tail"] for r in runs if r["returncode"]]}


def three_cases(command: list[str], scratch: Path) -> dict[str, Any]:
    root = scratch / "cache"
    cases = {"no_cache": run_one(command, cache_environ(None, scratch)),
             "cold_cache": run_one(command, cache_environ(root, scratch)),
             "warm_cache": run_one(command, cache_environ(root, scratch))}
    cases["speedup_warm_vs_no_cache"] = round(
        cases["no_cache"]["wall_seconds"] / cases["warm_cache"]["wall_seconds"], 2)
    return cases


def section_jax(scratch: Path, quick: bool) -> dict[str, Any]:
    return three_cases(jax_command(quick), scratch)


def section_triton(scratch: Path, quick: bool) -> dict[str, Any]:
    shapes = ["1000"] if quick else ["1000", "4096"]
    out = {}
    for shape in shapes:
        command = [sys.executable, "-m", "gpu_cache.workloads.triton_kernels", "--shape", shape]
        out[f"shape_{shape}"] = three_cases(command, scratch / shape)
    return out


def section_fla(scratch: Path, quick: bool) -> dict[str, Any]:
    return three_cases([*FLA, "--tokens", "2048"], scratch)


def section_fanout(scratch: Path, quick: bool, workers: int = 8) -> dict[str, Any]:
    command = [*FLA, "--tokens", "2048"]
    storm_root = scratch / "storm"
    storm = run_many(command, [cache_environ(storm_root, scratch) for _ in range(workers)])
    fan_root = scratch / "fanout"
    warm_started = time.perf_counter()
    warm = run_one(command, cache_environ(fan_root, scratch))
    fan = run_many(command, [cache_environ(fan_root, scratch) for _ in range(workers)])
    return {
        "workers": workers, "workload": "fla chunk_gated_delta_rule forward, 2048 tokens",
        "storm": storm,
        "warm_then_fan_out": {"warm_job": warm, "fan_out": fan,
                              "wall_seconds": round(time.perf_counter() - warm_started, 3),
                              "cpu_seconds": round(warm["cpu_seconds"] + fan["cpu_seconds"], 2)},
    }


def section_e2e(scratch: Path, quick: bool) -> dict[str, Any]:
    gpu_type = device.detect().gpu_type
    config = {
        "gpu_cache_snakefile": str(REPO / "workflow" / "Snakefile"),
        # Two lengths, four jobs: on a GPU each JAX process pays seconds of CUDA start-up alone.
        "samples": {f"s{i}": {"gpu_type": gpu_type, "tokens": t} for i, t in enumerate([128, 512, 128, 512])},
        "gpu_cache": {"workloads": {"predict": {"command": "{python} predict.py --tokens {shape}",
                                                "shapes": [128, 512]}},
                      "gpu_types": {gpu_type: {"workloads": ["predict"],
                                                "resources": {"mem_mb": 8000, "runtime": 30}}},
                      "validate": {"measure_cold": False}},
    }
    root = scratch / "cache"
    out = {}
    for run in ("caching_off", "first_run", "second_run"):
        work = scratch / run
        shutil.copytree(REPO / "tests" / "example_host", work,
                        ignore=shutil.ignore_patterns(".snakemake", "results", "logs", "predictions"))
        (work / "config" / "config.yaml").write_text(json.dumps(config))
        environ = dict(os.environ, GPU_CACHE_ROOT="none" if run == "caching_off" else str(root))
        command = [sys.executable, "-m", "snakemake", "--profile", str(REPO / "profiles" / "gpu-cache"),
                   "--cores", "4"]
        result = run_one(command, environ, cwd=work)
        predictions = [json.loads(p.read_text()) for p in sorted((work / "predictions").glob("*.json"))]
        result["prediction_cache"] = [p["cache"] for p in predictions]
        verdict = work / "results" / "gpu-cache" / "validate" / f"{gpu_type}.json"
        result["validation"] = json.loads(verdict.read_text()) if verdict.exists() else None
        out[run] = result
    return out


def section_overhead(scratch: Path, quick: bool, repeats: int = 5) -> dict[str, Any]:
    """What gpu-cache adds to a job: the startup hook, and resolving the environment."""
    root = scratch / "cache"
    hooked = cache_environ(root, scratch)
    plain = dict(hooked)
    plain.pop("GPU_CACHE_RECORDS")
    # The same PYTHONPATH without the hook's folder (carried packages stay reachable).
    plain["PYTHONPATH"] = os.pathsep.join(p for p in hooked["PYTHONPATH"].split(os.pathsep)
                                          if p != str(env.HOOK_DIR))
    timings: dict[str, list[float]] = {}
    programs = {"python_pass": [sys.executable, "-c", "pass"],
                "import_jax_and_jit": [sys.executable, "-c",
                                       "import jax, jax.numpy as j; jax.jit(j.sin)(1.0)"]}
    for _ in range(repeats):
        for name, program in programs.items():
            for label, environ in (("without_hook", plain), ("with_hook", hooked)):
                started = time.perf_counter()
                subprocess.run(program, env=environ, check=True, capture_output=True)
                timings.setdefault(f"{name}_{label}", []).append(time.perf_counter() - started)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpu_cache", "env", "--cache-root", str(root)],
                       env=plain, check=True, capture_output=True)
        timings.setdefault("gpu_cache_env", []).append(time.perf_counter() - started)
    medians = {k: round(sorted(v)[len(v) // 2], 4) for k, v in timings.items()}
    return {"repeats": repeats, "median_seconds": medians}


SECTIONS = {"jax": section_jax, "triton": section_triton, "fla": section_fla,
            "fanout": section_fanout, "e2e": section_e2e, "overhead": section_overhead}


def machine() -> dict[str, Any]:
    return {"device": device.detect().as_dict(), "platform": platform.platform(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "versions": {p: _version(p) for p in (*KEY_PACKAGES, "fla-core", "snakemake")},
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the JSON results")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (to test the script)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if device.detect().gpu_type == "cpu" and not args.allow_cpu:
        print("gpu_benchmark: no NVIDIA GPU visible; skipped (nothing measured)")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.sections.split(","):
        with tempfile.TemporaryDirectory(prefix=f"gpu-bench-{name}-") as scratch:
            started = time.perf_counter()
            try:
                result = SECTIONS[name](Path(scratch), args.quick)
            except Exception as exc:  # noqa: BLE001 - one broken section must not lose the others' figures
                result = {"error": repr(exc)}
            result = {"section": name, "machine": machine(),
                      "seconds": round(time.perf_counter() - started, 1), **result}
        (out / f"gpu_{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"== {name} ({result['seconds']} s)")
        print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1)[:3000], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
