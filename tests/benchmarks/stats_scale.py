"""Benchmark: gpu-cache's own speed at scale, next to the filesystem's floor, in one run.

    python tests/benchmarks/stats_scale.py [--sizes entries:100000,files:1000000]
        [--repeats 3] [--work DIR] [--out tests/benchmarks/results/stats_scale.json]

For each size it builds a cache root with every kind in it:

* JAX (55% of the entries): real compressed entries (compiled here with jax, so zstd when
  ``zstandard`` is installed, as JAX writes them), copied under distinct keys, in a capped cache
  (a ``-atime`` record beside each, with a ``.lockfile``);
* Triton (25%): key folders with ``<kernel>.{source,ttir,cubin,json}`` and the group manifest
  naming them by absolute path;
* Inductor (12%): code entries (``<xy>/<key>.cpp`` and a real ``.so`` built with gcc, with
  ``locks/<key>.lock``) and FX graph key folders;
* the stats hook's records (5%), bytecode (3%), and a CUDA driver cache (``index`` plus hashed
  folders, 2% of the files), all with last uses spread over 90 days;
* a few entries of every other registered kind (the contract suite's examples).

Then it times, as whole CLI processes (what a user waits for), each beside a bare
``os.scandir`` + ``lstat`` walk of the same tree in a process of its own (the floor, median of
the walks interleaved with the commands): ``stats`` before anything was verified, the first
``prune --dry-run`` (which verifies every entry: its extra time is reported per verified
entry), then ``prune --dry-run``, ``stats`` and ``stats --json`` once the entries are verified,
and a real ``prune`` (``--max-age 80d``: about a tenth of the entries go). Wall and CPU
seconds (user + system of the process) are both kept: on a shared machine CPU seconds move
less. The page cache is warm (the walk runs first). A second section times ``gpu-cache env`` (the code of
the console script pip writes, and ``python -m gpu_cache env``) against ``python -c pass``,
and ``python -c pass`` with and without the startup hook, interleaved, with bytecode cached.

Writes the JSON (figures, ratios to the walk, the machine, the free disk) to ``--out``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timing import run  # tests/benchmarks/timing.py

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
HOOK = SCRIPTS / "gpu_cache" / "_hook"
DAY = 86400.0

#: Share of the entries per kind (the CUDA cache is one entry of many files).
SHARES = {"jax": 0.55, "triton": 0.25, "inductor_code": 0.08, "inductor_fxgraph": 0.04,
          "records": 0.05, "bytecode": 0.03}
#: Files per entry of each kind (JAX capped: -cache and -atime; Triton: 4 files and the manifest;
#: Inductor code: .cpp, .so and its lock).
FILES = {"jax": 2, "triton": 5, "inductor_code": 3, "inductor_fxgraph": 1, "records": 1, "bytecode": 1}
CUDA_FILES_PER_ENTRY = 0.02

WALK = """
import os, sys
files = 0
pending = [sys.argv[1]]
while pending:
    with os.scandir(pending.pop()) as listing:
        for item in listing:
            info = item.stat(follow_symlinks=False)
            files += 1
            if item.is_dir(follow_symlinks=False):
                pending.append(item.path)
print(files)
"""

JAX_PROGRAM = """
import jax, jax.numpy as jnp
programs = [jnp.sin, jnp.cos, jnp.tanh, lambda x: x @ x.T, lambda x: jnp.exp(x).sum(0),
            lambda x: jnp.cumsum(x, 1), jax.nn.softmax, lambda x: jnp.linalg.norm(x, axis=1),
            lambda x: (x * 2 + 1) ** 2, lambda x: jnp.sort(x, 1)]
for program in programs:
    for n in (8, 64):
        jax.jit(program)(jnp.ones((n, n))).block_until_ready()
"""


def environ() -> dict[str, str]:
    """The CLI's environment: gpu_cache importable, bytecode read from its cache (as for a
    user), no cache variables of the caller."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_CACHE_", "JAX_", "TRITON_", "TORCHINDUCTOR_", "CUDA_CACHE_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(SCRIPTS)
    return env


def real_jax_entries(scratch: Path) -> list[bytes]:
    """The bytes of real JAX cache entries, compiled here."""
    folder = scratch / "jax-templates"
    env = environ() | {"JAX_COMPILATION_CACHE_DIR": str(folder), "JAX_PLATFORMS": "cpu",
                       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                       "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
                       "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}
    subprocess.run([sys.executable, "-c", JAX_PROGRAM], env=env, check=True, capture_output=True)
    found = [p.read_bytes() for p in sorted(folder.glob("*-cache"))]
    if not found:
        raise RuntimeError("jax wrote no cache entries")
    return found


def real_library(scratch: Path) -> bytes:
    """A real shared library, as Inductor's C++ backend builds (gcc), for the .so files."""
    source = scratch / "kernel.cpp"
    source.write_text('extern "C" void kernel(float* out, const float* in, long n) '
                      "{ for (long i = 0; i < n; ++i) out[i] = in[i] * 2.0f; }\n")
    library = scratch / "kernel.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O2", "-o", str(library), str(source)], check=True)
    return library.read_bytes()


def _framed(payload: bytes) -> bytes:
    """An entry framed with its sha256, as the hook's digest.py's ``framed`` writes it (ptxas, jax-triton)."""
    return b"gpu-cache sha256 " + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def _write(path: str, data: bytes, when: float) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.utime(path, (when, when))


def counts_for(spec: str) -> dict[str, int]:
    """Entries per kind for ``entries:N`` (N entries) or ``files:N`` (about N files)."""
    unit, _, number = spec.partition(":")
    n = int(float(number))
    files_per_entry = sum(SHARES[k] * FILES[k] for k in SHARES) + CUDA_FILES_PER_ENTRY
    entries = n if unit == "entries" else int(n / files_per_entry)
    counts = {kind: int(entries * share) for kind, share in SHARES.items()}
    counts["cuda_files"] = int(entries * CUDA_FILES_PER_ENTRY)
    return counts


def build(root: Path, counts: dict[str, int], jax_entries: list[bytes], library: bytes) -> dict[str, int]:
    """Write the cache root; returns the number of files and folders written."""
    rng = random.Random(14)
    now = time.time()
    folders = {name: root / name
               for name in ("jax", "triton", "inductor", "records", "bytecode", "cuda", "autotune", "ptxas",
                            "jax_triton", "vllm")}
    for folder in folders.values():
        folder.mkdir(parents=True)

    def used() -> float:
        return now - rng.uniform(0, 90) * DAY

    written = [_jax(str(folders["jax"]), counts["jax"], jax_entries, now, used),
               _triton(str(folders["triton"]), counts["triton"], used),
               _inductor(str(folders["inductor"]), counts, library, used),
               _records(str(folders["records"]), counts["records"], used),
               _bytecode(str(folders["bytecode"]), counts["bytecode"], used),
               _cuda(str(folders["cuda"]), counts["cuda_files"], now, used),
               _few_of_each(folders, used)]
    files, dirs = sum(f for f, _ in written), sum(d for _, d in written)
    more_files, more_dirs = _other_kinds(root, set(folders))
    return {"files": files + 2 + more_files, "folders": dirs + len(folders) + more_dirs}


def _jax(jax_dir: str, count: int, jax_entries: list[bytes], now: float, used) -> tuple[int, int]:
    """JAX's entries (``-cache`` and ``-atime``) and its lock file; the files and folders written
    (the lock file not counted: ``build`` counts it)."""
    files = 0
    _write(os.path.join(jax_dir, ".lockfile"), b"", now)
    for i in range(count):
        key = f"jit_fn{i % 300}-{hashlib.sha256(b'j%d' % i).hexdigest()}"
        when = used()
        _write(os.path.join(jax_dir, f"{key}-cache"), jax_entries[i % len(jax_entries)], when)
        _write(os.path.join(jax_dir, f"{key}-atime"), int(when * 1e9).to_bytes(8, "little"), when)
        files += 2
    return files, 0


def _triton(triton_dir: str, count: int, used) -> tuple[int, int]:
    """Triton's key folders, a kernel's four files and its group file in each."""
    files = dirs = 0
    for i in range(count):
        key = base64.b32encode(hashlib.sha256(b"t%d" % i).digest()).decode()[:52]
        folder = os.path.join(triton_dir, key)
        os.mkdir(folder)
        kernel = f"kernel_{i % 150}"
        when = used()
        children = {}
        for suffix, size in ((".source", 600), (".ttir", 1500), (".cubin", 6000), (".json", 900)):
            path = os.path.join(folder, kernel + suffix)
            _write(path, b"t" * size, when)
            children[kernel + suffix] = path
        _write(os.path.join(folder, f"__grp__{kernel}.json"),
               json.dumps({"child_paths": children}).encode(), when)
        os.utime(folder, (when, when))
        files += 5
        dirs += 1
    return files, dirs


def _inductor(inductor: str, counts: dict[str, int], library: bytes, used) -> tuple[int, int]:
    """Inductor's code entries (C++ source, library, lock) in shards, and its FX graphs."""
    files = dirs = 0
    os.mkdir(os.path.join(inductor, "locks"))
    for i in range(counts["inductor_code"]):
        key = "c" + base64.b32encode(hashlib.sha256(b"c%d" % i).digest()).decode().lower()[:51]
        shard = os.path.join(inductor, key[1:3])
        if not os.path.isdir(shard):
            os.mkdir(shard)
            dirs += 1
        when = used()
        _write(os.path.join(shard, f"{key}.cpp"), b"// kernel\n" * 40, when)
        _write(os.path.join(shard, f"{key}.so"), library, when)
        _write(os.path.join(inductor, "locks", f"{key}.lock"), b"", when)
        files += 3
    for i in range(counts["inductor_fxgraph"]):
        key = "f" + base64.b32encode(hashlib.sha256(b"f%d" % i).digest()).decode().lower()[:51]
        folder = os.path.join(inductor, "fxgraph", key[1:3], key)
        os.makedirs(folder)
        dirs += 1
        when = used()
        _write(os.path.join(folder, hashlib.sha256(key.encode()).hexdigest()[:52]), b"g" * 3000, when)
        files += 1
    return files, dirs


def _records(records: str, count: int, used) -> tuple[int, int]:
    """The startup hook's records, one per process."""
    for i in range(count):
        when = used()
        record = {"version": 1, "time": when, "host": f"node{i % 8}", "pid": i,
                  "rule": f"rule{i % 12}", "gpu_type": ("h200", "a100")[i % 2], "run_id": f"r{i % 50}",
                  "jax": {"requests": 20, "hits": 18, "misses": 2, "compile_seconds": 3.0,
                          "saved_seconds": 25.0, "missed": [], "key_parts": {}}}
        _write(os.path.join(records, f"{int(when * 1e9)}-node-{i}.json"), json.dumps(record).encode(), when)
    return count, 0


def _bytecode(bytecode_dir: str, count: int, used) -> tuple[int, int]:
    """Bytecode of one interpreter, a hundred modules to a package folder."""
    dirs = 0
    bytecode = os.path.join(bytecode_dir, "cpython-311-0a1b2c3d")
    for i in range(count):
        folder = os.path.join(bytecode, "site-packages", f"package{i // 100}")
        if i % 100 == 0:
            os.makedirs(folder)
            dirs += 1
        _write(os.path.join(folder, f"module{i}.cpython-311.pyc"), b"b" * 2000, used())
    return count, dirs


def _cuda(cuda: str, count: int, now: float, used) -> tuple[int, int]:
    """The CUDA driver's cache: its index (not counted: ``build`` counts it) and hashed files."""
    dirs = 0
    _write(os.path.join(cuda, "index"), b"i" * 4096, now - 2 * DAY)
    for i in range(count):
        digest = hashlib.sha256(b"p%d" % i).hexdigest()
        folder = os.path.join(cuda, digest[0], digest[1])
        if not os.path.isdir(folder):
            os.makedirs(folder)
            dirs += 1
        _write(os.path.join(folder, digest[2:16]), b"p" * 20000, used())
    return count, dirs


def _few_of_each(folders: dict[str, Path], used) -> tuple[int, int]:
    """The kinds of a handful of entries whatever the size: tokamax's results, the ptxas shim's,
    jax-triton's kernels, vLLM's torch.compile folders."""
    files = dirs = 0
    # tokamax results: one per (versions, device kind), so a handful whatever the size (the format
    # of core/kinds/autotune_format.py, written here by hand: the benchmark imports no gpu_cache)
    results = [(("0.0.12", "0.10.2"), "NVIDIA H200"), (("0.0.12", "0.10.2"), "NVIDIA A100-SXM4-80GB"),
               (("0.0.11", "0.10.2"), "NVIDIA H200")]
    for versions, device in results:
        folder = os.path.join(str(folders["autotune"]), f"tokamax-{versions[0]}_jax-{versions[1]}")
        if not os.path.isdir(folder):
            os.makedirs(folder)
            dirs += 1
        result = {"format": 1, "tokamax": versions[0], "jax": versions[1], "device_kind": device,
                  "result": "{}"}
        _write(os.path.join(folder, device.replace(" ", "_") + ".json"), json.dumps(result).encode(), used())
        files += 1
    # the ptxas shim's results (issue 34): a few kernels, in core/kinds/ptxas_format.py's format, by hand
    for i in range(8):
        key = hashlib.sha256(b"x%d" % i).hexdigest()
        cubin = b"c" * 20000
        meta = "\x1f".join((f"kernel_{i}", "release 13.4, V13.4.59", "d" * 16, "<input> -o <output>",
                            "i" * 16))
        head = b"gpu-cache ptxas entry 2\n%s\n0 0 %d 1.5000\n%s\n" % (key.encode(), len(cubin), meta.encode())
        _write(os.path.join(str(folders["ptxas"]), f"{key}.ptxas"), _framed(head + cubin), used())
        files += 1
    # jax-triton kernels the startup hook kept (issue 34), in core/kinds/jax_triton_format.py's format
    for i in range(6):
        key = hashlib.sha256(b"k%d" % i).hexdigest()
        entry = {"format": 3, "key": key, "kernel": f"attention_{i}", "module": "kernels.attention",
                 "jax_triton": "0.3.0", "triton": "3.6.0", "target": "cuda:90", "key_parts": {},
                 "result": {"binary": "p" * 20000, "name": f"attention_{i}", "shared_mem_bytes": 0},
                 "ttir": "t" * 4000}
        _write(os.path.join(str(folders["jax_triton"]), key), _framed(json.dumps(entry).encode()), used())
        files += 1
    # vLLM's torch.compile folders (issue 31): one hash folder per engine, a rank folder in each
    for i in range(4):
        engine = hashlib.sha256(b"v%d" % i).hexdigest()[:10]
        rank = os.path.join(str(folders["vllm"]), "torch_compile_cache", engine, "rank_0_0", "backbone")
        os.makedirs(rank)
        dirs += 4 if i == 0 else 3
        when = used()
        _write(os.path.join(rank, "vllm_compile_cache.py"), b"{}\n", when)
        _write(os.path.join(rank, "computation_graph.py"), b"# graph\n" * 200, when)
        files += 2
    return files, dirs


def _other_kinds(root: Path, written: set[str], count: int = 4) -> tuple[int, int]:
    """A few entries of each registered kind that ``build`` has no filler of (a kind added as
    its modules alone): its contract suite's examples (``tests/kind_examples/<kind>.py``); the
    files and folders written."""
    import importlib

    sys.path[:0] = [str(SCRIPTS), str(REPO / "tests")]
    from gpu_cache.core import kinds

    files = dirs = 0
    for kind in kinds.ALL:
        if kind.name not in written:
            example = importlib.import_module(f"kind_examples.{kind.name}")
            for number in range(count):
                example.write(kind.folder(root), number)
            dirs += 1
            for _top, found_dirs, found_files in os.walk(kind.folder(root)):
                files, dirs = files + len(found_files), dirs + len(found_dirs)
    return files, dirs


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_cache", *args]


def measure_size(spec: str, work: Path, repeats: int, templates: tuple[list[bytes], bytes]) -> dict[str, Any]:
    counts = counts_for(spec)
    root = work / f"root-{spec.replace(':', '-')}"
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    written = build(root, counts, *templates)
    built = time.perf_counter() - started
    env = environ()
    common = ("--cache-root", str(root))
    prune_args = ("--max-age", "80d", "--max-size", "1T")
    walk = [sys.executable, "-c", WALK, str(root)]
    samples: dict[str, list[tuple[float, float]]] = {}

    def timed(name: str, command: list[str]) -> str:
        wall, cpu, out = run(command, env)
        samples.setdefault(name, []).append((wall, cpu))
        print(f"  {spec} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
        return out

    names = int(timed("walk", walk).strip())
    timed("walk", walk)
    first_stats = json.loads(timed("stats_json_before_verification", cli("stats", "--json", *common)))
    timed("prune_dry_run_first", cli("prune", "--dry-run", "--json", *prune_args, *common))
    for _ in range(repeats):
        timed("walk", walk)
        timed("prune_dry_run", cli("prune", "--dry-run", "--json", *prune_args, *common))
        timed("walk", walk)
        timed("stats", cli("stats", *common))
        timed("walk", walk)
        timed("stats_json", cli("stats", "--json", *common))
    dry = json.loads(timed("prune_dry_run", cli("prune", "--dry-run", "--json", *prune_args, *common)))
    timed("walk", walk)
    real = json.loads(timed("prune", cli("prune", "--json", *prune_args, *common)))
    timed("walk_after_prune", walk)

    def median(name: str, which: int) -> float:
        return statistics.median(sample[which] for sample in samples[name])

    entries = sum(kind["entries"] for kind in first_stats["kinds"].values())
    verified_entries = first_stats["kinds"]["jax"]["entries"] + counts["inductor_code"]
    result: dict[str, Any] = {
        "size": spec, "entries": entries, "files": written["files"], "folders": written["folders"],
        "names_walked": names, "entries_by_kind": {k: v["entries"] for k, v in first_stats["kinds"].items()},
        "build_seconds": round(built, 1),
        "broken_entries_found": sum(k["broken"] for k in first_stats["kinds"].values()),
        "dry_run_would_remove": _removed(dry),
        "prune_removed": _removed(real),
        "prune_problems": real["problems"],
        "seconds": {}, "cpu_seconds": {}, "ratio_to_walk": {}, "cpu_ratio_to_walk": {},
    }
    walk_wall, walk_cpu = median("walk", 0), median("walk", 1)
    for name in samples:
        wall, cpu = median(name, 0), median(name, 1)
        result["seconds"][name] = round(wall, 3)
        result["cpu_seconds"][name] = round(cpu, 3)
        if name != "walk":
            result["ratio_to_walk"][name] = round(wall / walk_wall, 2)
            result["cpu_ratio_to_walk"][name] = round(cpu / walk_cpu, 2)
    extra = median("prune_dry_run_first", 1) - median("prune_dry_run", 1)
    result["first_verification_cpu_ms_per_verified_entry"] = round(1000 * extra / verified_entries, 3)
    result["verified_entries"] = verified_entries
    result["microseconds_per_entry"] = {name: round(1e6 * s / entries, 2)
                                        for name, s in result["seconds"].items()}
    shutil.rmtree(root, ignore_errors=True)
    return result


def _removed(report: dict[str, Any]) -> int:
    """Entries a prune report removed (or would remove), over its kinds."""
    return sum(part["entries_removed"] for part in report.values()
               if isinstance(part, dict) and "entries_removed" in part)


def measure_startup(work: Path, repeats: int) -> dict[str, Any]:
    """``gpu-cache env`` against ``python -c pass``; ``python -c pass`` with and without the hook."""
    env = environ()
    root = work / "startup-root"
    hooked = env | {"PYTHONPATH": os.pathsep.join([str(HOOK), str(SCRIPTS)]),
                    "GPU_CACHE_RECORDS": str(root / "records")}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(SCRIPTS / "gpu_cache")],
                   check=True, capture_output=True)  # bytecode cached, as pip installs it
    # What the `gpu-cache` console script that pip writes runs, and `python -m gpu_cache`.
    script = [sys.executable, "-c", "import sys; from gpu_cache.cli import main; sys.exit(main())"]
    cases = {"python_pass": ([sys.executable, "-c", "pass"], env),
             "gpu_cache_env": ([*script, "env", "--cache-root", str(root)], env),
             "python_m_gpu_cache_env": (cli("env", "--cache-root", str(root)), env),
             "python_pass_with_hook": ([sys.executable, "-c", "pass"], hooked)}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (command, case_env) in cases.items():
            wall, cpu, _out = run(command, case_env)
            samples[name].append((wall, cpu))
    median = {name: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
              for name, v in samples.items()}
    minimum = {name: (min(s[0] for s in v), min(s[1] for s in v)) for name, v in samples.items()}
    return {
        "repeats": repeats,
        "median_ms": {name: {"wall": round(1000 * w, 2), "cpu": round(1000 * c, 2)}
                      for name, (w, c) in median.items()},
        "min_ms": {name: {"wall": round(1000 * w, 2), "cpu": round(1000 * c, 2)}
                   for name, (w, c) in minimum.items()},
        "env_over_python_pass_ms": {
            "median_wall": round(1000 * (median["gpu_cache_env"][0] - median["python_pass"][0]), 2),
            "min_wall": round(1000 * (minimum["gpu_cache_env"][0] - minimum["python_pass"][0]), 2),
            "median_cpu": round(1000 * (median["gpu_cache_env"][1] - median["python_pass"][1]), 2),
            "python_m_median_wall": round(
                1000 * (median["python_m_gpu_cache_env"][0] - median["python_pass"][0]), 2)},
        "hook_over_python_pass_ms": {
            "median_wall": round(1000 * (median["python_pass_with_hook"][0] - median["python_pass"][0]), 2),
            "min_wall": round(1000 * (minimum["python_pass_with_hook"][0] - minimum["python_pass"][0]), 2),
            "median_cpu": round(1000 * (median["python_pass_with_hook"][1] - median["python_pass"][1]), 2)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="entries:100000,files:1000000",
                        help="comma-separated entries:N or files:N (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--startup-repeats", type=int, default=40)
    parser.add_argument("--work", type=Path, help="folder for the roots (default: a temporary one)")
    parser.add_argument("--out", type=Path,
                        default=REPO / "tests" / "benchmarks" / "results" / "stats_scale.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-cache-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    templates = (real_jax_entries(work), real_library(work))
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(), "load_average_at_start": os.getloadavg(),
        "disk_free_bytes_at_start": free, "jax_entry_templates": len(templates[0]),
        "jax_compression": "zstd" if templates[0][0].startswith(b"\x28\xb5\x2f\xfd") else "zlib",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "startup": measure_startup(work, args.startup_repeats), "sizes": [],
    }
    print(json.dumps(result["startup"], indent=1), flush=True)
    for spec in args.sizes.split(","):
        result["sizes"].append(measure_size(spec, work, args.repeats, templates))
        result["load_average_at_end"] = os.getloadavg()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")  # after each size: nothing lost
        print(json.dumps({k: v for k, v in result["sizes"][-1].items()
                          if k in ("size", "entries", "files", "ratio_to_walk", "cpu_ratio_to_walk",
                                   "first_verification_cpu_ms_per_verified_entry")}, indent=1), flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
