"""ptxas shim benchmark (issue 34): what the shim saves and costs, measured side by side.

    python tests/benchmarks/ptxas_gpu.py [--out DIR] [--sections micro,xla,jaxlib]
                                         [--jax-triton-wheel WHEEL] [--allow-cpu --quick]

* ``micro``: one ptxas call at a time, on PTX that this machine's Triton writes for sm_90a (a
  vector add, about the size of XLA's small kernels; two matmuls): the real ptxas; the shim on a
  miss (an empty cache: it runs the real one and keeps the result); the shim on a hit; and a bare
  ``python -I -S`` start, the floor of any hit.
* ``xla``: XLA's own ptxas calls: a JAX transformer in fresh processes with JAX's cache off, so
  XLA compiles (and runs ptxas) in every one: plain; XLA sent through the shim (its CUDA root
  replaced by a shim root, or the shim first on PATH where JAX has no CUDA root with ptxas),
  on an empty and on a warm ptxas cache; and XLA's own ``xla_gpu_kernel_cache_file``, empty
  and warm. The shim's tally counts XLA's ptxas calls and their real seconds.
* ``jaxlib``: jaxlib's ptxas calls: a jax-triton program (``ptxas_jax_triton.py``, 6 matmul
  kernels) in fresh processes under ``gpu-cache env`` with JAX's cache warm: without the shim
  (``GPU_CACHE_PTXAS=""``), with it on an empty and on a warm ptxas cache. Skipped where
  jax_triton cannot be imported; ``--jax-triton-wheel`` installs one into a scratch folder first.

Each section writes its figures into ``DIR/ptxas_<device>.json`` (default
tests/benchmarks/results) as soon as it is done. ``--allow-cpu --quick`` runs the logic on a CPU
(XLA runs no ptxas there, and jaxlib only lowers: their sections then show the harness works).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from gpu_cache.config.settings import settings_from  # noqa: E402
from gpu_cache.core import device, hook_records, names  # noqa: E402
from gpu_cache.jobenv import env  # noqa: E402
from gpu_cache.jobenv import ptxas as ptxas_lookup  # noqa: E402

SHIM = ptxas_lookup.shim_module()
HERE = Path(__file__).resolve().parent
PTX_MAKER = REPO / "tests" / "harness" / "ptxas_fixtures.py"


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2)


def timed(command: list[str], environ: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def pick_real(ptx: Path, scratch: Path) -> tuple[Path, str]:
    """The ptxas the jobs would run (as the hook finds it), else Triton's own, whichever reads
    this Triton's PTX: ``(a folder whose ptxas is it, its path)``."""
    import triton

    found, _where = SHIM.find_real(os.environ.get("PATH", ""), sys.path)
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for candidate in [found, bundled / "ptxas", bundled / "ptxas-blackwell"]:
        if not candidate or not Path(candidate).is_file():
            continue
        done = subprocess.run([str(candidate), str(ptx), "-o", str(scratch / "probe.cubin"), "-arch=sm_90a"],
                              capture_output=True)
        if done.returncode == 0:
            folder = scratch / "real-bin"
            folder.mkdir(exist_ok=True)
            (folder / "ptxas").unlink(missing_ok=True)
            (folder / "ptxas").symlink_to(candidate)
            return folder, str(candidate)
    raise SystemExit("no ptxas here reads the PTX this Triton writes")


def shim_environ(cache: Path, real_dir: Path, tally: Path | None = None) -> dict[str, str]:
    cache.mkdir(parents=True, exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CACHE_")}
    environ["PATH"] = os.pathsep.join([str(SHIM.SHIM_DIR), str(real_dir), environ.get("PATH", "")])
    environ[names.PTXAS_VAR] = str(cache)
    environ[names.PTXAS_PYTHON_VAR] = sys.executable
    if tally is not None:
        environ[names.PTXAS_TALLY_VAR] = str(tally)
    return environ


def micro(scratch: Path, reps: int) -> dict[str, Any]:
    """One ptxas call at a time: real, shim miss, shim hit, bare Python start."""
    sys.path[:0] = [str(REPO / "tests" / "harness")]
    from ptxas_fixtures import make_ptx

    made = make_ptx(scratch / "ptx", big=True)
    files = {"add": made["add"], "mm64": made["mm"], "mm64_spilling": made["spill"], "mm128": made["mm128"]}
    real_dir, real = pick_real(made["add"], scratch)
    cache = scratch / "micro" / "ptxas"
    environ = shim_environ(cache, real_dir)
    first = timed(["ptxas", str(made["add87"]), "-o", str(scratch / "first.cubin"), "-arch=sm_90a"], environ)
    out: dict[str, Any] = {"real_ptxas": real, "python_start_ms": median_ms(
        [timed([sys.executable, "-I", "-S", "-c", "pass"]) for _ in range(reps)]),
        "first_call_ever_ms": round(first * 1000, 2), "calls": {},
        "hook_sitecustomize_us": hook_install_us(scratch, reps)}
    for name, path in files.items():
        call = [str(path), "-o", str(scratch / "out.cubin"), "-arch=sm_90a", "--warn-on-spills"]
        real_s, misses, hits = [], [], []
        for _ in range(reps):
            real_s.append(timed([real, *call]))
            for entry in cache.glob("*.ptxas"):
                entry.unlink()
            misses.append(timed(["ptxas", *call], environ))
            hits.append(timed(["ptxas", *call], environ))
        out["calls"][name] = {"ptx_bytes": path.stat().st_size, "real_ms": median_ms(real_s),
                              "shim_miss_ms": median_ms(misses), "shim_hit_ms": median_ms(hits),
                              "hit_saves_ms": round(median_ms(real_s) - median_ms(hits), 2),
                              "miss_costs_ms": round(median_ms(misses) - median_ms(real_s), 2)}
    return out


def hook_install_us(scratch: Path, reps: int) -> dict[str, float]:
    """What the hook's ``sitecustomize`` import takes (``python -X importtime``, microseconds,
    median), with the ptxas cache exported (the shim installed at start) and without."""
    out = {}
    root = scratch / "hook-root"
    for case, folder in (("without GPU_CACHE_PTXAS", ""), ("with GPU_CACHE_PTXAS", str(root / "ptxas"))):
        (root / "ptxas").mkdir(parents=True, exist_ok=True)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CACHE_")}
        environ.update(PYTHONPATH=str(REPO / "scripts" / "gpu_cache" / "_hook"), GPU_CACHE_PTXAS=folder,
                       GPU_CACHE_RECORDS=str(root / "records"))
        samples = []
        for _ in range(reps):
            done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=environ,
                                  capture_output=True, text=True, check=True)
            line = next(x for x in done.stderr.splitlines() if x.split("|")[-1].strip() == "sitecustomize")
            samples.append(float(line.split("|")[1]))
        out[case] = statistics.median(samples)
    return out


def shim_root(real_root: Path, folder: Path, front: Path) -> Path:
    """A CUDA root whose ``bin/ptxas`` is the shim and everything else links to ``real_root``
    (XLA finds libdevice in ``nvvm/``, nvlink and fatbinary in ``bin/``)."""
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    for item in real_root.iterdir():
        if item.name != "bin":
            (folder / item.name).symlink_to(item.resolve())
    for item in (real_root / "bin").iterdir():
        if item.name != "ptxas":
            (folder / "bin" / item.name).symlink_to(item.resolve())
    launcher = folder / "bin" / "ptxas"
    launcher.write_text(f'#!/bin/sh\nexec "{front}" "$@"\n')
    launcher.chmod(0o755)
    return folder


def tally_totals(tally: Path) -> dict[str, Any]:
    """What the shim's tally says: calls by outcome, the real ptxas seconds of the misses, the
    seconds the hits took."""
    lines = [line.split("\t") for line in tally.read_text().splitlines()] if tally.exists() else []
    misses = [float(f[3]) for f in lines if f[0] == "miss"]
    hits = [float(f[3]) for f in lines if f[0] == "hit"]
    return {"misses": len(misses), "hits": len(hits), "passed": sum(1 for f in lines if f[0] == "pass"),
            "real_seconds": round(sum(misses), 3), "hit_seconds": round(sum(hits), 3),
            "median_real_ms": median_ms(misses) if misses else None,
            "median_hit_ms": median_ms(hits) if hits else None}


def run_process(command: list[str], environ: dict[str, str]) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    line = next((t for t in reversed(done.stdout.splitlines()) if t.startswith("{")), "{}")
    return {"wall_seconds": round(wall, 3), "returncode": done.returncode, "result": json.loads(line),
            "stderr_tail": done.stderr[-600:] if done.returncode else ""}


def transformer(quick: bool) -> list[str]:
    size = (["--layers", "2", "--d-model", "64", "--heads", "4", "--batch", "2", "--shape", "32"] if quick
            else ["--layers", "4", "--d-model", "512", "--heads", "8", "--batch", "4", "--shape", "256"])
    return [sys.executable, "-m", "gpu_cache.workloads.jax_transformer", *size]


def plain_environ(**extra: str) -> dict[str, str]:
    """A process without gpu-cache: JAX's persistent cache off, so XLA compiles every time."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPU_CACHE_", "JAX_COMPILATION", "JAX_PERSISTENT"))}
    environ.update(PYTHONPATH=str(REPO / "scripts"), JAX_ENABLE_COMPILATION_CACHE="false",
                   XLA_PYTHON_CLIENT_PREALLOCATE="false")
    environ.update(extra)
    return environ


def xla_route(scratch: Path) -> tuple[dict[str, str], str]:
    """How to send XLA's own calls through the shim: its CUDA root replaced by a shim root where
    JAX's CUDA root holds ptxas (XLA takes that one before PATH), else the shim first on PATH."""
    root, where = ptxas_lookup.jax_cuda_root(dict(os.environ))
    if root and (Path(root) / "bin" / "ptxas").exists():
        made = shim_root(Path(root), scratch / "shim-root", Path(SHIM.FRONT))
        return ({"CUDA_ROOT": str(made), names.PTXAS_REAL_VAR: str(Path(root) / "bin" / "ptxas")},
                f"CUDA_ROOT: a shim root over {root} ({where})")
    path = os.pathsep.join([str(SHIM.SHIM_DIR), os.environ.get("PATH", "")])
    return {"PATH": path}, f"the shim first on PATH ({where}: XLA looks on PATH)"


def xla_section(scratch: Path, quick: bool) -> dict[str, Any]:
    """XLA's own ptxas calls, with JAX's cache off: plain, through the shim, XLA's kernel cache."""
    command = transformer(quick)
    route, described = xla_route(scratch)
    cache = scratch / "xla-ptxas" / "ptxas"
    cache.mkdir(parents=True)
    kernel_file = scratch / "xla-kernel-cache" / "xla_gpu_kernel_cache_file"
    kernel_file.parent.mkdir()
    cases: dict[str, list[dict[str, Any]]] = {}
    # XLA reads its kernel cache file only where it splits modules for parallel compilation
    split = "--xla_gpu_enable_llvm_module_compilation_parallelism=true"
    kernels = {"XLA_FLAGS": f"{split} --xla_gpu_kernel_cache_file={kernel_file}"}
    plan = [("plain", 2, {}), ("shim, empty ptxas cache", 1, route), ("shim, warm ptxas cache", 2, route),
            ("plain, modules split", 1, {"XLA_FLAGS": split}), ("kernel cache file, empty", 1, kernels),
            ("kernel cache file, warm", 2, kernels)]
    for case, times, extra in plan:
        for n in range(times):
            tally = scratch / f"tally-{len(cases)}-{n}"
            environ = plain_environ(**extra)
            if "shim" in case:
                environ.update({names.PTXAS_VAR: str(cache), names.PTXAS_PYTHON_VAR: sys.executable,
                                names.PTXAS_TALLY_VAR: str(tally)})
            run = run_process(command, environ)
            run["ptxas"] = tally_totals(tally) if "shim" in case else None
            cases.setdefault(case, []).append(run)
            print(f"  xla: {case}: {run['wall_seconds']} s wall, ptxas {run['ptxas']}", flush=True)
    walls = {case: statistics.median(r["wall_seconds"] for r in runs) for case, runs in cases.items()}
    base = walls["plain"]
    return {"route": described, "command": command, "cases": cases,
            "ratios_to_plain": {case: round(wall / base, 3) for case, wall in walls.items()}}


def jax_triton_path(scratch: Path, wheel: str | None) -> tuple[str | None, str | None]:
    """``(a folder to put on PYTHONPATH or "", None)`` where jax_triton imports, else (None, why)."""
    extra = ""
    if wheel:
        site = scratch / "jax-triton-site"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(site), wheel], check=True)
        extra = str(site)
    probe = subprocess.run([sys.executable, "-c", "import jax_triton"], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (extra, os.environ.get(
                               "PYTHONPATH", "")) if p)))
    if probe.returncode != 0:
        return None, f"jax_triton does not import: {probe.stderr.strip().splitlines()[-1:]}"
    return extra, None


def jaxlib_section(scratch: Path, quick: bool, on_gpu: bool, wheel: str | None) -> dict[str, Any]:
    """jaxlib's ptxas calls: the jax-triton program under gpu-cache env, JAX's cache warm."""
    extra, why = jax_triton_path(scratch, wheel)
    if extra is None:
        return {"skipped": why}
    root = scratch / "jaxlib-root"
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CACHE_")}
    base["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    command = [sys.executable, str(HERE / "ptxas_jax_triton.py"), "--kernels", "2" if quick else "6",
               "--size", "256" if quick else "1024", *([] if on_gpu else ["--lower-only"])]
    cases: dict[str, list[dict[str, Any]]] = {}
    plan = [("warm-up (fills JAX's cache)", 1, True), ("no shim", 2, False),
            ("shim, empty ptxas cache", 1, True), ("shim, warm ptxas cache", 2, True)]
    for case, times, shim_on in plan:
        if case.startswith("shim, empty"):
            for entry in (root / "ptxas").glob("*.ptxas"):
                entry.unlink()
        for _ in range(times):
            environ = dict(base) if shim_on else dict(base, GPU_CACHE_PTXAS="")
            environ = env.job_environ(env.resolve(settings_from({}, cache_root=str(root)), environ), environ)
            environ["PYTHONPATH"] = os.pathsep.join(p for p in (environ["PYTHONPATH"], str(REPO / "scripts"),
                                                                 extra) if p)
            environ["GPU_CACHE_RUN_ID"] = run_id = os.urandom(8).hex()
            run = run_process(command, environ)
            found = list(hook_records.read(hook_records.records_dir(root), run_id))
            run["ptxas"] = next((r.get("ptxas") for r in found if r.get("ptxas")), None)
            if run["ptxas"]:
                run["ptxas"] = {k: run["ptxas"].get(k) for k in ("state", "real", "hits", "misses",
                                                                 "compile_seconds", "saved_seconds")}
            cases.setdefault(case, []).append(run)
            print(f"  jaxlib: {case}: {run['wall_seconds']} s wall, {run['result']}, ptxas {run['ptxas']}",
                  flush=True)
    walls = {case: statistics.median(r["wall_seconds"] for r in runs) for case, runs in cases.items()}
    return {"command": command, "cases": cases,
            "ratios_to_no_shim": {c: round(w / walls["no shim"], 3) for c, w in walls.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--sections", default="micro,xla,jaxlib")
    parser.add_argument("--jax-triton-wheel", default=None, help="a jax-triton wheel to install first")
    parser.add_argument("--allow-cpu", action="store_true", help="run without an NVIDIA GPU")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few repetitions")
    args = parser.parse_args()
    found = device.detect()
    on_gpu = found.gpu_type != "cpu"
    if not on_gpu and not args.allow_cpu:
        print("ptxas benchmark: no NVIDIA GPU here (--allow-cpu --quick runs the logic on a CPU)")
        return 0
    report: dict[str, Any] = {"device": found.as_dict(), "python": sys.version.split()[0],
                              "doctor": ptxas_lookup.report({}, dict(os.environ)), "quick": args.quick}
    out = Path(args.out) / f"ptxas_{found.gpu_type}.json"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-cache-ptxas-bench-") as scratch:
        for section in args.sections.split(","):
            print(f"ptxas benchmark: {section}", flush=True)
            where = Path(scratch) / section
            where.mkdir()
            if section == "micro":
                report["micro"] = micro(where, 5 if args.quick else 15)
            elif section == "xla":
                report["xla"] = xla_section(where, args.quick)
            elif section == "jaxlib":
                report["jaxlib"] = jaxlib_section(where, args.quick, on_gpu, args.jax_triton_wheel)
            report["seconds"] = round(time.perf_counter() - started, 1)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1) + "\n")
    summary(report)
    print(f"ptxas benchmark: {report['seconds']} s; figures in {out}")
    return 0


def summary(report: dict[str, Any]) -> None:
    """The figures side by side, one line each."""
    if "micro" in report:
        m = report["micro"]
        print(f"micro ({m['real_ptxas']}; python -I -S start {m['python_start_ms']} ms; first call of a "
              f"ptxas file {m['first_call_ever_ms']} ms; the hook's sitecustomize, microseconds: "
              f"{m['hook_sitecustomize_us']}):")
        for name, c in m["calls"].items():
            print(f"  {name:>14} ({c['ptx_bytes']} B): real {c['real_ms']} ms, shim miss "
                  f"{c['shim_miss_ms']} ms (+{c['miss_costs_ms']}), shim hit {c['shim_hit_ms']} ms "
                  f"(saves {c['hit_saves_ms']})")
    xla = report.get("xla") or {}
    for case in ("shim, empty ptxas cache", "shim, warm ptxas cache"):
        for run in xla.get("cases", {}).get(case, [])[:1]:
            p = run["ptxas"]
            print(f"xla ptxas calls, {case}: {p['misses']} misses (real median {p['median_real_ms']} ms, "
                  f"{p['real_seconds']} s), {p['hits']} hits (median {p['median_hit_ms']} ms)")
    for case, runs in (report.get("jaxlib") or {}).get("cases", {}).items():
        first = [r["result"].get("first_call_seconds") for r in runs]
        counts = [(r["ptxas"]["hits"], r["ptxas"]["misses"]) if r["ptxas"] else None for r in runs]
        print(f"jaxlib, {case}: first call {first} s, ptxas (hits, misses) {counts}")
    for section, key in (("xla", "ratios_to_plain"), ("jaxlib", "ratios_to_no_shim")):
        part = report.get(section)
        if part and key in part:
            print(f"{section}: wall over {key[10:]}: {part[key]}" + (f" (route: {part['route']})"
                                                                    if "route" in part else ""))
        elif part:
            print(f"{section}: {part.get('skipped')}")


if __name__ == "__main__":
    raise SystemExit(main())
