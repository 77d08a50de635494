"""Jobs for the node-local tier (issue 23) on the two nodes of tests/harness/nodes.py, shared by
tests/test_tier_nodes.py and tests/benchmarks/tier_stress.py and tier_reads.py.

A job is one Python process on a node: :data:`WORKER` compiles ``keys`` Triton kernels (ahead of
time for sm_90, as on a machine without a GPU: a cubin from the wheel's ptxas) or jits ``keys`` JAX
functions, each after a barrier that all ``count`` jobs of its round reach (the pattern of
triton-lang/triton#11512: every process compiles the same variant at the same instant), catches
what each compile raises and prints one JSON line: compiles that worked, the failures (type and
message), JAX's cache warnings, hits and misses, seconds.

Set-ups (:func:`job_env`):

- ``plain``: no gpu-cache, the tool's own cache folder straight on the share
  (``TRITON_CACHE_DIR`` / ``JAX_COMPILATION_CACHE_DIR`` there), as users run today;
- ``shared``: ``gpu-cache env`` for a cache root on the share with the tier off
  (``local_tier.mode: off``): the caches straight in the root, as before issue 23;
- ``tier``: ``gpu-cache env`` for a cache root on the share, run on the node as each job's
  ``eval "$(gpu-cache env)"`` would: the caches in the node-local folder, promoted to the root.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from helpers import SCRIPTS, clean_environ, records

#: One job (see the module's docstring). argv[1]: a JSON spec.
WORKER = r'''
import json, os, sys, time, warnings
spec = json.loads(sys.argv[1])
kind, keys, sync, me, count = spec["kind"], spec["keys"], spec["sync"], spec["id"], spec["count"]
salts = spec.get("salts", [0])
started = time.monotonic()
stop = spec.get("stop_at")
if stop:  # test-only: stop this process (SIGSTOP) at the n-th step of a promotion
    import signal
    seen = [0]
    below = stop["shared"].rstrip("/") + "/"

    def shared_fd(fd):
        try:
            return (os.readlink(f"/proc/self/fd/{fd}") + "/").startswith(below)
        except (OSError, TypeError):
            return False

    def audit(event, args):
        step = stop["step"]
        if step == "tmp" and event == "open" and isinstance(args[0], str) \
                and os.path.basename(args[0]).startswith(".gpu-cache-tmp.") and args[2] & os.O_CREAT:
            pass  # creating a temporary file of the tier (before it exists)
        elif step == "link" and event == "os.link" and shared_fd(args[3]):
            pass  # the temporary file is whole, its name not given yet
        elif step == "unlink" and event == "os.remove" and isinstance(args[0], str) \
                and args[0].startswith(".gpu-cache-tmp.") and shared_fd(args[1]):
            pass  # the entry has its name, the temporary file is still there
        else:
            return
        seen[0] += 1
        if seen[0] == stop["nth"]:
            with open(stop["marker"], "w") as marker:
                marker.write(f"{os.getpid()} {event} {args!r}")
            os.kill(os.getpid(), signal.SIGSTOP)

    sys.addaudithook(audit)
failed, ok, cache_warnings = [], 0, []
hits = misses = 0
warnings.simplefilter("always")
shown = warnings.showwarning

def show(message, category, filename, lineno, file=None, line=None):
    if "persistent compilation cache" in str(message) or "gpu-cache" in str(message):
        cache_warnings.append(str(message)[:300])
    shown(message, category, filename, lineno, file, line)

warnings.showwarning = show

def barrier(step):
    if count <= 1:
        return
    folder = os.path.join(sync, str(step))
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(me)), "w").close()
    deadline = time.monotonic() + 600
    while len(os.listdir(folder)) < count and time.monotonic() < deadline:
        time.sleep(0.01)

if kind == "triton":
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def stress_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, SALT: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = i < n
        x = tl.load(x_ptr + i, mask=inside)
        tl.store(out_ptr + i, x * SALT + tl.exp(x), mask=inside)

    def listen(*, src, metadata, metadata_group, times, cache_hit):
        global hits, misses
        if cache_hit:
            hits += 1
        else:
            misses += 1

    previous = triton.knobs.compilation.listener

    def chained(**kwargs):
        listen(**kwargs)
        if previous is not None:
            previous(**kwargs)

    triton.knobs.compilation.listener = chained
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr", "SALT": "constexpr"}

    def compile_one(k):
        source = ASTSource(fn=stress_kernel, signature=signature,
                           constexprs={"BLOCK": 128, "SALT": k + 1})
        return len(triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"])
else:
    import jax, jax.numpy as jnp, numpy as np
    from jax import monitoring

    def listen(event, **_):
        global hits, misses
        if event == "/jax/compilation_cache/compile_requests_use_cache":
            misses += 1
        elif event == "/jax/compilation_cache/cache_hits":
            hits += 1
            misses -= 1

    monitoring.register_event_listener(listen)
    x = np.ones((32, 32), np.float32)

    def compile_one(k):
        def f(v):
            for i in range(spec.get("length", 3) + k % 1000):
                v = jnp.tanh(v @ v.T * 0.01 + i + k // 1000) + jnp.sin(v * (i + 1))
            return v.sum()
        f.__name__ = f"stress{k}"
        return float(jax.jit(f)(x))

ready = time.monotonic()
values = []
for salt in salts:  # one more set of keys per salt
    for k in range(keys):
        barrier(f"{salt}-{k}")
        try:
            values.append(compile_one(salt * 1000 + k))
            ok += 1
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}"[:400])
print(json.dumps({"ok": ok, "failed": failed, "cache_warnings": cache_warnings, "hits": hits,
                  "misses": misses, "values": values, "import_seconds": round(ready - started, 2),
                  "compile_seconds": round(time.monotonic() - ready, 2)}), flush=True)
'''


def worker(folder: Path) -> Path:
    """:data:`WORKER` written to ``folder`` (a folder every node sees)."""
    program = folder / "tier_worker.py"
    if not program.exists():
        program.write_text(WORKER)
    return program


def worker_argv(program: Path, kind: str, keys: int, sync: Path, me: int, count: int, **extra) -> list[str]:
    """The job's command line; ``extra``: ``salts`` (a list: one set of ``keys`` keys each),
    ``stop_at`` (``{"step": "tmp"|"link"|"unlink", "nth": n, "shared": root, "marker": path}``:
    the job stops itself at the n-th such step of a promotion into ``root``, after writing its
    pid to ``marker``), ``length`` (JAX: the first function's steps)."""
    spec = {"kind": kind, "keys": keys, "sync": str(sync), "id": me, "count": count, **extra}
    return [sys.executable, str(program), json.dumps(spec)]


def local_folder(root: str | os.PathLike[str], folder: str = "") -> Path:
    """The local tier of ``root`` as TIER.md fixes it: ``<folder>/<16 hex of sha256(root)>``,
    ``folder`` defaulting to ``/tmp/gpu-cache-<uid>/tier``."""
    base = folder or f"/tmp/gpu-cache-{os.getuid()}/tier"
    return Path(base) / hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:16]


def tier_known() -> bool:
    """Whether this checkout's gpu-cache has the tier (its config schema knows ``local_tier``)."""
    schema = SCRIPTS.parent / "workflow" / "schemas" / "config.schema.yaml"
    return "local_tier" in schema.read_text()


def job_env(node, setup: str, root: Path, config: Path, kind: str = "triton", by_hand: bool = False,
            **extra: str) -> dict[str, str]:
    """The environment of a job of ``setup`` (``plain``, ``shared`` or ``tier``: the module's docstring)
    on ``node`` for the cache root ``root`` (as the nodes see it); ``config``: a JSON config
    file for ``gpu-cache env`` (every node sees it). ``by_hand``: where ``gpu-cache env`` turns
    no tier on, add TIER.md's variables to its exports."""
    if setup == "plain":
        folder = {"triton": "TRITON_CACHE_DIR", "jax": "JAX_COMPILATION_CACHE_DIR"}[kind]
        base = {folder: str(root / kind), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "TRITON_DEFAULT_FP_FUSION": "1"}
        return clean_environ(**{**base, **extra})
    if setup == "shared":  # the same config with the tier off
        off = config.with_name(f"{config.stem}-tier-off.json")
        off.write_text(json.dumps({**json.loads(config.read_text()), "local_tier": {"mode": "off"}}))
        config = off
    done = node.run([sys.executable, "-m", "gpu_cache", "env", "--json", "--cache-root", str(root),
                     "--config", str(config)], env=clean_environ(), timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"gpu-cache env failed on {node.name}: {done.stderr[-2000:]}")
    exports = json.loads(done.stdout)["exports"]
    if setup == "tier" and "GPU_CACHE_TIER" not in exports:
        if not by_hand:
            raise RuntimeError(f"gpu-cache env on {node.name} turned no tier on: {done.stdout[-2000:]}")
        local = local_folder(root)  # TIER.md's exports, set by hand (before gpu-cache env had them)
        node.run(["mkdir", "-p", "-m", "700", str(local)], check=True)
        exports.update({"JAX_COMPILATION_CACHE_DIR": f"{local}/jax", "TRITON_CACHE_DIR": f"{local}/triton",
                        "TORCHINDUCTOR_CACHE_DIR": f"{local}/inductor", "GPU_CACHE_TIER": str(local),
                        "GPU_CACHE_SHARED": str(root), "GPU_CACHE_TIER_MAX_BYTES": str(20 << 30),
                        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "xla_gpu_per_fusion_autotune_cache_dir"})
    environ = clean_environ(**exports)
    environ["PYTHONPATH"] = os.pathsep.join(
        str(SCRIPTS / p) if p == "scripts" else p for p in exports["PYTHONPATH"].split(os.pathsep))
    environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    environ.update(extra)
    return environ


def triton_groups(folder: Path, seen_as: Path | None = None) -> dict[str, bool]:
    """Each Triton entry (``<key>/__grp__*.json``) under ``folder``: whether it is complete (its
    group file decodes and every child it lists is there, with bytes, in the group's own folder:
    Triton reads children by the absolute paths the group names). ``seen_as``: ``folder`` as
    the jobs see it (the group names paths there), where this process sees it elsewhere."""
    found = {}
    for group in sorted(folder.glob("*/__grp__*.json")):
        where = (seen_as or folder) / group.parent.name
        try:
            children = [Path(p) for p in json.loads(group.read_text())["child_paths"].values()]
            files = [group.parent / p.name for p in children]
            found[group.parent.name] = bool(children) and all(p.parent == where for p in children) \
                and all(f.is_file() and f.stat().st_size > 0 for f in files)
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            found[group.parent.name] = False
    return found


def jax_entries(folder: Path) -> dict[str, bool]:
    """Each JAX entry (``*-cache``) under ``folder``: whether it decompresses (zstd, or zlib
    where ``zstandard`` is missing: JAX compresses the compile time and executable whole)."""
    import zlib

    try:
        import zstandard
    except ImportError:  # JAX then writes zlib
        zstandard = None
    found = {}
    for entry in sorted(folder.glob("*-cache")):
        data = entry.read_bytes()
        try:
            if zstandard is not None and data[:4] == b"\x28\xb5\x2f\xfd":
                zstandard.ZstdDecompressor().decompress(data)
            else:
                zlib.decompress(data)
            found[entry.name] = True
        except Exception:  # noqa: BLE001 - any failure to decode is a broken entry
            found[entry.name] = False
    return found


def stress_round(nodes, program: Path, config: Path, kind: str, setup: str, rnd: int, procs: int,
              keys: int, by_hand: bool) -> dict:
    """One round of the crash stress (tests/benchmarks/tier_stress.py): ``procs`` fresh jobs of
    ``setup`` on each node of ``nodes`` (tests/harness/nodes.py's TwoNodes), a fresh folder on the share,
    ``keys`` keys each, a barrier before each key. Returns the jobs' JSON lines (``done``), what
    crashed, the wall seconds, the entries whole and broken on the share afterwards, and
    the ``single_flight`` part of each hook record (``flights``; none for ``plain``)."""
    tag = f"{kind}-{setup}-{rnd}"
    root, work = nodes.shared / tag, nodes.workdir / "stress" / tag
    work.mkdir(parents=True)
    environs = {node.name: job_env(node, setup, root, config, kind, by_hand=by_hand)
                for node in (nodes.a, nodes.b)}
    jobs = []
    started = time.monotonic()
    for node in (nodes.a, nodes.b):
        for _ in range(procs):
            me = len(jobs)
            with open(work / f"{me}.out", "w") as out, open(work / f"{me}.err", "w") as err:
                jobs.append(node.popen(worker_argv(program, kind, keys, work / "sync", me, 2 * procs),
                                       env=environs[node.name], stdout=out, stderr=err, cwd=str(work)))
    for job in jobs:
        job.wait(timeout=900)
    wall = time.monotonic() - started
    done, crashed = [], []
    for me, job in enumerate(jobs):
        lines = (work / f"{me}.out").read_text().strip().splitlines()
        if job.returncode != 0 or not lines:
            crashed.append(f"rc {job.returncode}: {(work / f'{me}.err').read_text()[-600:]}")
            continue
        done.append(json.loads(lines[-1]))
    shared = nodes.host_path(root / kind)  # plain: the tool's folder; tier: the root's kind folder
    if not shared.is_dir():
        entries = {}
    elif kind == "triton":
        entries = triton_groups(shared, seen_as=root / kind)
    else:
        entries = jax_entries(shared)
    return {"tag": tag, "wall": wall, "done": done, "crashed": crashed,
            "complete": sum(entries.values()), "broken": len(entries) - sum(entries.values()),
            "flights": [s["single_flight"] for s in records(nodes.host_path(root), kind)
                        if "single_flight" in s]}
