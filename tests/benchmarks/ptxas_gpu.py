"""ptxas shim benchmark (issues 34, 37): what the shim saves and costs, measured side by side.

    python tests/benchmarks/ptxas_gpu.py [--out DIR] [--sections micro,xla,jaxlib]
                                         [--jax-triton-wheel WHEEL] [--reps N] [--allow-cpu --quick]

* ``micro``: one ptxas call at a time, on PTX that this machine's Triton writes for sm_90a (a
  vector add, about the size of XLA's small kernels; two matmuls): the real ptxas; the shim on a
  miss (an empty cache: it runs the real one and keeps the result); the shim on a hit; and a bare
  ``python -I -S`` start, the floor of any hit. Then the routes, side by side on the vector add:
  the real ptxas, a hit whose real ptxas is the ELF binary, a hit whose real ptxas is a shell
  wrapper (its ``--version`` asked at every call), and XLA's route (a call of the process the
  hook marked, of a kernel jaxlib did not make: the ``/bin/sh`` front runs the real ptxas).
  Then what the entry's digest check (issue 38) adds to a hit, side by side with the check off
  (the frame stripped unchecked), per kernel: the hit's lookup in this process (the entry read,
  checked and unpacked, microseconds) and the shim's whole call (its Python started as the
  front starts it, milliseconds).
* ``xla``: XLA's own ptxas calls (issue 37): a cold plain JAX process, the 12-layer transformer
  (every compile a miss: a new cache root each run), under ``gpu-cache env`` with the shim off
  (``GPU_CACHE_PTXAS=""``) and on (jax_triton importable, so the hook puts the shim first on
  PATH), alternating, ``--reps`` of each: the CPU seconds of the process and all it ran, the
  wall, and the ptxas entries it left.
* ``jaxlib``: jaxlib's ptxas calls: a jax-triton program (``ptxas_jax_triton.py``, 6 matmul
  kernels) in fresh processes under ``gpu-cache env`` with JAX's cache warm: without the shim
  (``GPU_CACHE_PTXAS=""``), with it on an empty and on a warm ptxas cache.

``xla`` and ``jaxlib`` need jax_triton importable; ``--jax-triton-wheel`` installs one into a
scratch folder first.

Each section writes its figures into ``DIR/ptxas_<device>.json`` (default
tests/benchmarks/results) as soon as it is done. ``--allow-cpu --quick`` runs the logic on a CPU
(XLA runs no ptxas there, and jaxlib only lowers: their sections then show the harness works).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from gpu_cache._hook.gpu_cache_hook.kinds.ptxas import shim as SHIM  # noqa: E402
from gpu_cache.config.settings import settings_from  # noqa: E402
from gpu_cache.core import device, hook_records, kinds, names  # noqa: E402
from gpu_cache.core.kinds import ptxas_lookup  # noqa: E402
from gpu_cache.jobenv import env  # noqa: E402

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
    out["routes"] = routes(made["add"], real_dir, real, scratch, reps)
    out["digest_check"] = digest_check(files, real_dir, scratch, reps)
    return out


#: What the shim's Python runs before its ``main``: nothing (the check as it is), or the check
#: turned off (the frame stripped unchecked).
CHECK = {"on": "", "off": "import gpu_cache_hook.digest as d; d.opened = lambda data: data[d.LINE:]; "}
LOOKUPS = 50


def _lookup_us(folder: Any, key: str, case: str) -> float:
    """Microseconds of one hit's lookup in this process (mean of LOOKUPS), with the check
    ``case``."""
    frame = SHIM.gpu_cache_hook.digest
    checked = frame.opened
    if case == "off":
        frame.opened = lambda data: data[frame.LINE:]
    try:
        started = time.perf_counter()
        for _ in range(LOOKUPS):
            assert SHIM.lookup(folder, key) is not None
        return (time.perf_counter() - started) / LOOKUPS * 1e6
    finally:
        frame.opened = checked


def digest_check(files: dict[str, Path], real_dir: Path, scratch: Path, reps: int) -> dict[str, Any]:
    """What the digest check adds to a hit, with the check on and off, interleaved: per kernel,
    the lookup in this process (median microseconds) and the whole call (median ms)."""
    cache = scratch / "digest" / "ptxas"
    environ = shim_environ(cache, real_dir)
    folder = SHIM.Folder(str(cache))
    out = {}
    for name, path in files.items():
        call = [str(path), "-o", str(scratch / "digest.cubin"), "-arch=sm_90a", "--warn-on-spills"]
        before = set(cache.glob("*.ptxas"))
        timed(["ptxas", *call], environ)  # the miss that keeps the entry
        (entry,) = set(cache.glob("*.ptxas")) - before
        lookups: dict[str, list[float]] = {"on": [], "off": []}
        calls: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(reps):
            for case in ("on", "off"):
                lookups[case].append(_lookup_us(folder, entry.stem, case))
                program = (f"import sys; sys.path.insert(0, sys.argv.pop(1)); {CHECK[case]}"
                           "import gpu_cache_hook.kinds.ptxas.shim; gpu_cache_hook.kinds.ptxas.shim.main()")
                command = [sys.executable, "-I", "-S", "-c", program, SHIM.HERE, *call]
                calls[case].append(timed(command, environ))
        us = {case: round(statistics.median(values), 1) for case, values in lookups.items()}
        ms = {case: median_ms(values) for case, values in calls.items()}
        out[name] = {"entry_bytes": entry.stat().st_size, "lookup_us": us,
                     "check_us": round(us["on"] - us["off"], 1), "hit_ms": ms,
                     "check_share_of_hit": round((us["on"] - us["off"]) / 1000 / ms["on"], 4)}
    return out


def routes(ptx: Path, real_dir: Path, real: str, scratch: Path, reps: int) -> dict[str, float]:
    """One call on each route, interleaved, median milliseconds (see the module's text)."""
    wrapper = scratch / "wrapper-bin" / "ptxas"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    kernels = scratch / "no-jaxlib-kernels"
    kernels.mkdir()
    xla = shim_environ(scratch / "xla" / "ptxas", real_dir)
    xla.update({names.PTXAS_KERNELS_VAR: f"{os.getpid()}:{kernels}",
                names.PTXAS_REAL_VAR: str(real_dir / "ptxas")})
    call = [str(ptx), "-o", str(scratch / "route.cubin"), "-arch=sm_90a", "--warn-on-spills"]
    cases = {"real ptxas": ([str(real_dir / "ptxas"), *call], None),
             "hit, ELF ptxas": (["ptxas", *call], shim_environ(scratch / "elf" / "ptxas", real_dir)),
             "hit, shell wrapper ptxas": (["ptxas", *call],
                                          shim_environ(scratch / "sh" / "ptxas", wrapper.parent)),
             "XLA's route (no Python)": (["ptxas", *call], xla)}
    samples: dict[str, list[float]] = {case: [] for case in cases}
    for command, environ in cases.values():
        timed(command, environ)  # the misses that fill the two caches
    for _ in range(reps):
        for case, (command, environ) in cases.items():
            samples[case].append(timed(command, environ))
    return {case: median_ms(values) for case, values in samples.items()}


def hook_install_us(scratch: Path, reps: int) -> dict[str, float]:
    """What the hook's ``sitecustomize`` import takes (``python -X importtime``, microseconds,
    median), with the ptxas cache exported (the shim installed at start) and without."""
    out = {}
    root = scratch / "hook-root"
    for case, folder in (("without GPU_CACHE_PTXAS", ""), ("with GPU_CACHE_PTXAS", str(root / "ptxas"))):
        (root / "ptxas").mkdir(parents=True, exist_ok=True)
        # bytecode compiled, as a job's: the first run writes it
        environ = {k: v for k, v in os.environ.items()
                   if not k.startswith("GPU_CACHE_") and k != "PYTHONDONTWRITEBYTECODE"}
        environ.update(PYTHONPATH=str(REPO / "scripts" / "gpu_cache" / "_hook"), GPU_CACHE_PTXAS=folder,
                       GPU_CACHE_RECORDS=str(root / "records"))
        samples = []
        for _ in range(reps + 1):
            done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=environ,
                                  capture_output=True, text=True, check=True)
            line = next(x for x in done.stderr.splitlines() if x.split("|")[-1].strip() == "sitecustomize")
            samples.append(float(line.split("|")[1]))
        out[case] = statistics.median(samples[1:])
    return out


def run_process(command: list[str], environ: dict[str, str]) -> dict[str, Any]:
    """Run ``command``: its wall, its CPU (user and system, of it and every process it ran), its
    exit code and JSON line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    line = next((t for t in reversed(done.stdout.splitlines()) if t.startswith("{")), "{}")
    return {"wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 2), "returncode": done.returncode,
            "result": json.loads(line), "stderr_tail": done.stderr[-600:] if done.returncode else ""}


def twelve_layers(quick: bool) -> list[str]:
    """The README's 12-layer JAX transformer (``gpu_benchmark.py``'s), or a tiny one."""
    size = (["--layers", "2", "--d-model", "64", "--heads", "4", "--batch", "2", "--shape", "16,32"] if quick
            else ["--layers", "12", "--d-model", "1024", "--heads", "16", "--batch", "8", "--shape",
                  "256,512,1024"])
    return [sys.executable, "-m", "gpu_cache.workloads.jax_transformer", *size]


def job_run(root: Path, command: list[str], extra: str, shim: bool) -> dict[str, Any]:
    """``command`` as a job under ``gpu-cache env`` on ``root`` (the ptxas shim off: GPU_CACHE_PTXAS=""),
    with jax_triton importable (``extra``): its wall and CPU, the record's ptxas part, the
    ptxas entries in ``root``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CACHE_")}
    base["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if not shim:
        base[names.PTXAS_VAR] = ""
    environ = env.job_environ(env.resolve(settings_from({}, cache_root=str(root)), base), base)
    parts = (environ["PYTHONPATH"], str(REPO / "scripts"), extra)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    environ["GPU_CACHE_RUN_ID"] = run_id = os.urandom(8).hex()
    run = run_process(command, environ)
    found = list(hook_records.read(kinds.records_dir(root), run_id))
    part = next((r.get("ptxas") for r in found if r.get("ptxas")), None)
    run["ptxas"] = {k: part.get(k) for k in ("state", "real", "jaxlib_kernels", "hits", "misses", "passed",
                                             "compile_seconds", "saved_seconds")} if part else None
    run["ptxas_entries"] = len(list((root / "ptxas").glob("*.ptxas")))
    return run


def xla_section(scratch: Path, quick: bool, reps: int, wheel: str | None) -> dict[str, Any]:
    """A cold plain JAX process with the shim off and on, alternating (see the module's text)."""
    extra, why = jax_triton_path(scratch, wheel)
    if extra is None:
        return {"skipped": why}
    command = twelve_layers(quick)
    cases: dict[str, list[dict[str, Any]]] = {"shim off": [], "shim on": []}
    for n in range(reps):
        for case in (("shim off", "shim on") if n % 2 == 0 else ("shim on", "shim off")):
            run = job_run(scratch / f"root-{n}-{case[-2:].strip()}", command, extra, case == "shim on")
            cases[case].append(run)
            print(f"  xla: {case}: {run['cpu_seconds']} CPU-s, {run['wall_seconds']} s wall, ptxas "
                  f"{run['ptxas']}, {run['ptxas_entries']} entries", flush=True)
    cpu = {case: statistics.median(r["cpu_seconds"] for r in runs) for case, runs in cases.items()}
    # XLA meets the shim only where JAX's CUDA root has no bin/ptxas: it then looks on PATH
    root, where = ptxas_lookup.jax_cuda_root(dict(os.environ))
    xla_on_path = not (root and (Path(root) / "bin" / "ptxas").exists())
    return {"command": command, "cases": cases, "median_cpu_seconds": cpu,
            "cpu_on_over_off": round(cpu["shim on"] / cpu["shim off"], 4),
            "xla_meets_the_shim": xla_on_path, "jax_cuda_root": [root, where]}


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
            run = job_run(root, command, extra, shim_on)
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
    parser.add_argument("--reps", type=int, default=2, help="xla: cold processes of each case (default 2)")
    args = parser.parse_args()
    found = device.detect()
    on_gpu = found.gpu_type != "cpu"
    if not on_gpu and not args.allow_cpu:
        print("ptxas benchmark: no NVIDIA GPU here (--allow-cpu --quick runs the logic on a CPU)")
        return 0
    report: dict[str, Any] = {"device": found.as_dict(), "python": sys.version.split()[0],
                              "doctor": ptxas_lookup.report(names.PTXAS_VAR, {}, dict(os.environ)),
                              "quick": args.quick}
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
                report["xla"] = xla_section(where, args.quick, args.reps, args.jax_triton_wheel)
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
        print("  routes, the vector add (ms): " + ", ".join(f"{k} {v}" for k, v in m["routes"].items()))
        for name, c in m.get("digest_check", {}).items():
            print(f"  digest check, {name:>14} ({c['entry_bytes']} B entry): lookup "
                  f"{c['lookup_us']['on']} us checked, {c['lookup_us']['off']} us unchecked (the check: "
                  f"{c['check_us']} us, {c['check_share_of_hit']:.2%} of a hit); whole hit "
                  f"{c['hit_ms']['on']} ms checked, {c['hit_ms']['off']} ms unchecked")
    xla = report.get("xla") or {}
    for case, runs in xla.get("cases", {}).items():
        print(f"xla, cold plain JAX process, {case}: CPU-s {[r['cpu_seconds'] for r in runs]}, wall s "
              f"{[r['wall_seconds'] for r in runs]}, ptxas entries left "
              f"{[r['ptxas_entries'] for r in runs]}, "
              f"record {[r['ptxas'] for r in runs][:1]}")
    if "cpu_on_over_off" in xla:
        print(f"xla: median CPU with the shim on over off: {xla['cpu_on_over_off']} "
              f"({xla['median_cpu_seconds']}); XLA meets the shim: {xla['xla_meets_the_shim']} "
              f"(JAX's CUDA root: {xla['jax_cuda_root']})")
    for case, runs in (report.get("jaxlib") or {}).get("cases", {}).items():
        first = [r["result"].get("first_call_seconds") for r in runs]
        counts = [(r["ptxas"]["hits"], r["ptxas"]["misses"]) if r["ptxas"] else None for r in runs]
        print(f"jaxlib, {case}: first call {first} s, ptxas (hits, misses) {counts}")
    for section in ("xla", "jaxlib"):
        part = report.get(section)
        if part and "ratios_to_no_shim" in part:
            print(f"{section}: wall over no shim: {part['ratios_to_no_shim']}")
        elif part and "skipped" in part:
            print(f"{section}: skipped: {part['skipped']}")


if __name__ == "__main__":
    raise SystemExit(main())
