"""What gpu-cache's checks of an entry add to a warm hit, per cache kind (issue 38 item 2).

    python3 tests/benchmarks/integrity_cost.py --repeats 2 --budget 150 \\
        --out tests/benchmarks/results/gpu_integrity_cost.json
    python tests/benchmarks/integrity_cost.py --allow-cpu \\
        --out tests/benchmarks/results/cpu_integrity_cost.json

What the job side checks before it serves an entry, read from the startup hook
(``scripts/gpu_cache/_hook``; timed by integrity_timer.py, whose CHECKS name each function):

* the node-local tier's fetch (JAX, Triton, Inductor, jax-triton; only where the local tier
  lacks the entry: a new node): the kind folders' and each file's owner and mode, the CRC-32 of
  the bytes it copies and the seal a verifying prune left for it (``gpu_cache_hook.seals``), once per
  kind the list of entries validation set aside; for JAX also the fetched entry's zstd frame read
  whole through its block headers (``gpu_cache_hook.kinds.jax._whole``);
* JAX with single-flight (the default): before each read, an entry younger than 60 s is checked
  for being whole (``jax_entry``: no entry is read half-written). JAX's own read decompresses
  and checks its zstd frames: that is JAX's, not gpu-cache's. Triton and Inductor read their
  entries themselves; without the tier gpu-cache checks nothing there (prune and doctor do);
* jax-triton's store, on every read: the entry's owner and mode, its sha256 frame
  (``gpu_cache_hook.digest.opened``; twice on a new node: the shared copy before the fetch, the
  local one before use) and every field jaxlib's ``TritonKernel`` takes;
* the ptxas shim, in a process of its own per call: the owner of the folder, of each folder
  above it and of the entry, the entry's sha256 frame and its header. On a GPU jaxlib's calls
  of the warm jax-triton process are measured (the shim's Python becomes integrity_timer.py's
  ``shim``: one ``#!python -IS`` wrapper instead of ``python -I -S -c``); without a GPU jaxlib
  calls no ptxas, so a stand-in process calls the shim as jaxlib does on the PTX of the Triton
  kind's entries (integrity_timer.ptxas_calls);
* torch_extensions: before a build is loaded, its folder's and library's owner, its manifest,
  the library's sha256 and every header it included (``_Build.whole``).

Each kind gets a fresh cache root from ``gpu-cache env``, with the node-local tier on and off.
Tier on: a cold process fills the root (its entries promoted there), whose files are then dated
past prune's grace period and sealed by ``gpu-cache prune --kind``; then ``--repeats`` warm
processes as on a new node (the local tier emptied before each: every entry fetched and
checked). Tier off (the caches in the root itself: what ``gpu-cache env`` exports on a local
disk): a cold process again (JAX's keys differ between the two: the XLA caches setting), then
``--repeats`` warm ones. Kinds the tier does not hold (ptxas, torch_extensions) run the second
case only. Each process runs inside integrity_timer.py; the figure is the checks' seconds over
the process's wall seconds (target: under 2%), and the checks' milliseconds, medians over the
warm processes. The entries here are seconds old, so JAX's single-flight check reads each
frame's block headers; an entry older than 60 s costs it one ``fstat``.

Without an NVIDIA GPU it prints why and exits 0; ``--allow-cpu`` runs it here (JAX, Triton ahead
of time for sm_90, jax-triton's lowering for CUDA with ``.ci-cache/jax-cuda12-plugin``, Inductor
and g++ builds all run on a CPU). On a GPU, jax_triton must be importable (the hook puts the
ptxas shim on PATH only then), and torch_extensions needs ``ninja`` and ``g++``: a kind that cannot
run is reported as not measured, and the others go on. ``--budget`` skips the kinds not begun
after that many seconds; the report is written after each kind.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from timing import run  # noqa: E402  (tests/benchmarks/timing.py)

from gpu_cache.config.settings import settings_from  # noqa: E402
from gpu_cache.core import device, hook_records, kinds, software  # noqa: E402
from gpu_cache.jobenv import env  # noqa: E402

TIMER = HERE / "integrity_timer.py"
#: The ptxas shim's Python in the runs (a file in the scratch folder: :func:`shim_wrapper`).
SHIM_PYTHON = "shim-python"
TARGET = 0.02
#: Older than prune's grace period (an hour): a settled file, which a verifying scan seals.
SETTLED = 2 * 3600
#: An extension in plain C++ (no torch headers: it builds in seconds), loaded as jobs load theirs.
EXTENSION = r'''
from torch.utils import cpp_extension
SOURCE = """
#include <Python.h>
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
#define STR2(x) #x
#define STR(x) STR2(x)
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&mod); }
"""
assert cpp_extension.load_inline("integrity_answer", [SOURCE], no_implicit_headers=True).answer() == 42
'''
NEW_NODE, TIER_OFF = "new node (tier on)", "tier off"
VERDICT = {True: "holds", False: "MISSED", None: "n/a"}


def workloads(gpu: bool) -> dict[str, list[str]]:
    """The program of each kind, in the order they run (without a GPU the ptxas stand-in reads
    the PTX of the Triton kind's entries, so Triton runs first)."""
    out = {"jax_triton": ["-m", "gpu_cache.workloads.jax_triton_kernels", "--shape", "256"],
           "jax": ["-m", "gpu_cache.workloads.jax_transformer", "--shape", "64"],
           "triton": ["-m", "gpu_cache.workloads.triton_kernels", "--shape", "1024"],
           "ptxas": ["--ptxas-calls"],
           "torch_extensions": ["-c", EXTENSION],
           "inductor": ["-m", "gpu_cache.workloads.torch_compile", "--shape", "32", "--blocks", "1"]}
    if gpu:
        del out["ptxas"]  # measured in jax-triton's processes: jaxlib's own calls
    return out


def job_environ(root: Path, tier: Path | None, extra_path: str, bin_dir: str) -> dict[str, str]:
    """``gpu-cache env`` for ``root``, the node-local tier in ``tier`` (None: off); ``extra_path``
    after the hook and the package on ``PYTHONPATH``, ``bin_dir`` first on ``PATH``."""
    config = {"local_tier": {"mode": "on", "folder": str(tier)} if tier else {"mode": "off"}}
    exports = env.resolve(settings_from(config, cache_root=str(root)))
    environ = env.job_environ(exports)
    if tier is not None and not environ.get("GPU_CACHE_TIER"):
        raise SystemExit(f"gpu-cache env turned the tier off: {exports.messages()}")
    parts = [environ.get("PYTHONPATH", ""), str(REPO / "scripts"), extra_path]
    environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in parts if p))
    environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # (a GPU: processes one after another)
    if bin_dir:
        environ["PATH"] = os.pathsep.join([bin_dir, environ.get("PATH", "")])
    return environ


def shim_wrapper(scratch: Path) -> None:
    """The ptxas shim's Python for the runs: integrity_timer.shim behind a ``#!python -IS`` line."""
    path = scratch / SHIM_PYTHON
    path.write_text(f"#!{sys.executable} -IS\nimport sys\nsys.path.insert(0, {str(HERE)!r})\n"
                    "import integrity_timer\nintegrity_timer.shim()\n")
    path.chmod(0o755)


def process(command: list[str], environ: dict[str, str], scratch: Path, kind: str) -> dict[str, Any]:
    """One job process inside integrity_timer.py: its wall, its checks, the shim calls it made,
    and the kind's hits and misses from its record."""
    tag = uuid.uuid4().hex
    out, log = scratch / f"timer-{tag}.json", scratch / f"shim-{tag}.jsonl"
    environ = dict(environ, GPU_CACHE_RUN_ID=tag, INTEGRITY_COST_SHIM=str(scratch / SHIM_PYTHON),
                   INTEGRITY_COST_SHIM_LOG=str(log))
    wall, cpu, stdout = run([sys.executable, str(TIMER), str(out), *command], environ)
    found = ast.literal_eval(out.read_text())
    calls = [ast.literal_eval(line) for line in log.read_text().splitlines()] if log.exists() else []
    records = list(hook_records.read(Path(environ["GPU_CACHE_RECORDS"]), tag))
    totals = {name: (t.hits, t.misses) for name, t in kinds.record_totals(records).items() if t.processes}
    hits, misses = totals.get(kind, (None, None))
    return {"wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 2), **found, "hits": hits,
            "misses": misses, "recorded": totals,
            "shim": shim_calls(calls), "stand_in": _stand_in(stdout) if "--ptxas-calls" in command else {}}


def _stand_in(stdout: str) -> dict[str, Any]:
    """What the ptxas stand-in printed last: each call's seconds, as its caller saw them."""
    return ast.literal_eval(stdout.strip().splitlines()[-1])


def shim_calls(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The shim's calls of one process, summed; the hits' own checks and time per call."""
    checks: dict[str, dict[str, float]] = {}
    for call in calls:
        for label, row in call["checks"].items():
            into = checks.setdefault(label, dict.fromkeys(row, 0))
            for field in into:
                into[field] += row[field]
    hits = [c for c in calls if c["hit"]]
    return {"calls": len(calls), "hits": len(hits), "check_seconds": sum(c["check_seconds"] for c in calls),
            "check_cpu_seconds": sum(c["check_cpu_seconds"] for c in calls), "checks": checks,
            "hit_check_seconds": [c["check_seconds"] for c in hits],
            "hit_call_seconds": [c["call_seconds"] for c in hits],
            "missing": sorted({m for c in calls for m in c["missing"]})}


def seal(root: Path, name: str, environ: dict[str, str]) -> dict[str, Any]:
    """Date the kind's files in ``root`` past prune's grace period, then let prune seal them."""
    settled = time.time() - SETTLED
    folder = kinds.KINDS[name].folder(root)
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (settled, settled), follow_symlinks=False)
    command = [sys.executable, "-m", "gpu_cache", "prune", f"--cache-root={root}", f"--kind={name}", "--json"]
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"prune failed: {done.stderr[-800:]}")
    pruned = json.loads(done.stdout).get(name) or {}
    return {field: pruned.get(field) for field in ("entries_before", "entries_removed")}


def ptx_of(root: Path, scratch: Path) -> Path:
    """The PTX of the Triton kind's entries under ``root``, in one folder."""
    folder = scratch / "ptx"
    folder.mkdir(exist_ok=True)
    for path in sorted(kinds.KINDS["triton"].folder(root).glob("*/*.ptx")):
        shutil.copyfile(path, folder / f"{path.parent.name}-{path.name}")
    if not any(folder.iterdir()):
        raise RuntimeError("the Triton kind left no PTX for the ptxas stand-in")
    return folder


def measure_kind(name: str, command: list[str], scratch: Path, repeats: int, extra_path: str,
                 bin_dir: str = "") -> dict[str, Any]:
    """Cold, sealed, then the warm cases of one kind on a root of its own."""
    where = scratch / name
    root, tier = where / "root", where / "local"
    on, off = job_environ(root, tier, extra_path, bin_dir), job_environ(root, None, extra_path, bin_dir)
    tiered = kinds.KINDS[name].tiered
    out: dict[str, Any] = {"workload": command, "cold": {}, "cases": {}}
    for case, environ in ((NEW_NODE, on), (TIER_OFF, off)):
        if case == NEW_NODE and not tiered:
            continue
        # a cold process of each case: JAX's keys differ between the two (the XLA caches setting)
        out["cold"][case] = process(command, environ, scratch, name)
        if case == NEW_NODE:
            out["sealed"] = seal(root, name, off)
        runs = out["cases"][case] = []
        for _ in range(repeats):
            if case == NEW_NODE:
                shutil.rmtree(environ["GPU_CACHE_TIER"], ignore_errors=True)  # a new node
            runs.append(process(command, environ, scratch, name))
    return out


def figures(runs: list[dict[str, Any]], shim: bool) -> dict[str, Any]:
    """Medians over the warm runs of a case: wall, the checks' seconds and share, each check."""
    parts = [r["shim"] if shim else r for r in runs]
    wall = statistics.median(r["wall_seconds"] for r in runs)
    checks = statistics.median(p["check_seconds"] for p in parts)
    cpu = statistics.median(p["check_cpu_seconds"] for p in parts)
    labels = sorted({label for p in parts for label in p["checks"]})
    each = {}
    for label in labels:
        rows = [p["checks"].get(label, {"calls": 0, "seconds": 0.0, "cpu_seconds": 0.0, "truthy": 0})
                for p in parts]
        each[label] = {"ms": round(1000 * statistics.median(r["seconds"] for r in rows), 3),
                       "cpu_ms": round(1000 * statistics.median(r["cpu_seconds"] for r in rows), 3),
                       "calls": statistics.median(r["calls"] for r in rows),
                       "truthy": statistics.median(r["truthy"] for r in rows)}
    out = {"wall_seconds": round(wall, 3), "check_ms": round(1000 * checks, 3),
           "check_cpu_ms": round(1000 * cpu, 3), "share": round(checks / wall, 6),
           "holds": checks / wall < TARGET, "checks": each,
           "hits_misses": [(r["hits"], r["misses"]) for r in runs]}
    if shim:
        hits = [s for p in parts for s in p["hit_check_seconds"]]
        calls = [s for p in parts for s in p["hit_call_seconds"]]
        out["hits_misses"] = [(p["hits"], p["calls"] - p["hits"]) for p in parts]
        if not any(p["calls"] for p in parts):
            out["holds"] = None  # no shim call to measure (the shim off? the record's ptxas part says why)
        whole = [s for r in runs for s in r["stand_in"].get("call_seconds", [])]
        out["per_hit_call"] = {"check_ms": round(1000 * statistics.median(hits), 3) if hits else None,
                               "call_ms": round(1000 * statistics.median(calls), 2) if calls else None,
                               "whole_call_ms": round(1000 * statistics.median(whole), 2) if whole else None}
    return out


def summarise(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per kind and case, the figures; ptxas from the shim's calls (on a GPU: jax-triton's runs)."""
    out: dict[str, dict[str, Any]] = {}
    for name, result in report["kinds"].items():
        if "failed" in result:
            continue
        shim_source = name == "ptxas"
        out[name] = {case: figures(runs, shim_source) for case, runs in result["cases"].items()}
        if name == "jax_triton" and report["gpu"]:
            out["ptxas"] = {case: figures(runs, True) for case, runs in result["cases"].items()}
    return out


def print_summary(report: dict[str, Any]) -> None:
    print(f"\ngpu-cache's checks on a warm hit, {report['device']} ({report['repeats']} warm runs per "
          f"case, medians; target: under {TARGET:.0%} of the process's wall time; checks' CPU: the "
          "calling thread's)")
    print(f"{'kind':<17} {'case':<19} {'wall s':>7} {'checks ms':>10} {'CPU ms':>7} {'share':>8}  "
          f"{'target':<6} {'hits/misses':<13} each check: wall ms (calls)")
    for name, cases in report["summary"].items():
        for case, f in cases.items():
            each = ", ".join(f"{label} {row['ms']} ({row['calls']:g})" if label != "seal found" else
                             f"{row['truthy']:g} of {row['calls']:g} files sealed"
                             for label, row in f["checks"].items() if row["calls"])
            hits = " ".join(f"{h}/{m}" for h, m in f["hits_misses"])
            print(f"{name:<17} {case:<19} {f['wall_seconds']:>7.2f} {f['check_ms']:>10.3f} "
                  f"{f['check_cpu_ms']:>7.3f} {f['share']:>8.4%}  {VERDICT[f['holds']]:<6} {hits:<13} "
                  f"{each or '-'}")
            if f.get("per_hit_call", {}).get("check_ms") is not None:
                call = f["per_hit_call"]
                whole = f"; {call['whole_call_ms']} ms as its caller saw it" if call["whole_call_ms"] else ""
                print(f"{'':<45} a hit's shim call: checks {call['check_ms']} ms of {call['call_ms']} ms "
                      f"(from the shim's Python code's start to its reply{whole})")
    for name, result in report["kinds"].items():
        if "failed" in result:
            print(f"{name}: not measured: {result['failed']}")
    if report["skipped"]:
        print(f"skipped past the budget of {report['budget']:.0f} s: {', '.join(report['skipped'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the report (JSON) here")
    parser.add_argument("--repeats", type=int, default=3, help="warm processes per case (default 3)")
    parser.add_argument("--kinds", help="comma-separated kinds (default: all of the mode's)")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU")
    parser.add_argument("--budget", type=float, help="seconds after which kinds not begun are skipped")
    args = parser.parse_args(argv)
    found = device.detect()
    gpu = found.gpu_type != "cpu"
    if not gpu and not args.allow_cpu:
        print("integrity cost: no NVIDIA GPU here (--allow-cpu runs it on this CPU)")
        return 0
    plugin = REPO / ".ci-cache" / "jax-cuda12-plugin"  # (jax-triton's lowering without a GPU)
    extra_path = str(plugin) if not gpu and plugin.is_dir() else ""
    chosen = workloads(gpu)
    if args.kinds:
        wanted = args.kinds.split(",")
        unknown = [k for k in wanted if k not in chosen]
        if unknown:
            parser.error(f"--kinds: {', '.join(unknown)} not among {', '.join(chosen)}")
        chosen = {k: v for k, v in chosen.items() if k in wanted}
    report: dict[str, Any] = {"device": found.name, "gpu": gpu, "cpus": os.cpu_count(),
                              "software": software.identity(), "repeats": args.repeats,
                              "budget": args.budget, "kinds": {}, "skipped": []}
    scratch = Path(tempfile.mkdtemp(prefix="gpu-cache-integrity-"))
    try:
        measure(report, chosen, scratch, extra_path, args.out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_summary(report)
    print(f"{report['seconds']} s in all")
    return 0


def measure(report: dict[str, Any], chosen: dict[str, list[str]], scratch: Path, extra_path: str,
            out: Path | None) -> None:
    """Each kind in turn into ``report``, written to ``out`` after each (a run stopped at a
    limit keeps what it measured)."""
    started = time.perf_counter()
    shim_wrapper(scratch)
    for name, command in chosen.items():
        if report["budget"] is not None and time.perf_counter() - started > report["budget"]:
            report["skipped"].append(name)
            continue
        print(f"integrity cost: {name}", flush=True)
        try:
            bin_dir = ""
            if name == "ptxas":  # the stand-in: the Triton kind's PTX, a ptxas that reads it
                command = [*command, str(ptx_of(scratch / "triton" / "root", scratch))]
                bin_dir = str(_real_ptxas(scratch))
            report["kinds"][name] = measure_kind(name, command, scratch, report["repeats"], extra_path,
                                                 bin_dir)
        except (RuntimeError, OSError, SystemExit) as exc:
            report["kinds"][name] = {"failed": str(exc)[-1500:]}
        report["summary"] = summarise(report)
        report["seconds"] = round(time.perf_counter() - started, 1)
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1) + "\n")


def _real_ptxas(scratch: Path) -> Path:
    """A folder whose ``ptxas`` reads this Triton's PTX (ptxas_gpu.pick_real's choice)."""
    from ptxas_gpu import pick_real

    return pick_real(next((scratch / "ptx").iterdir()), scratch)[0]


if __name__ == "__main__":
    raise SystemExit(main())
