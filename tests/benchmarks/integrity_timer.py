"""Timers on the startup hook's checks of what it serves, for tests/benchmarks/integrity_cost.py.

    python tests/benchmarks/integrity_timer.py OUT.json -m MODULE [ARGS...]
    python tests/benchmarks/integrity_timer.py OUT.json -c CODE [ARGS...]
    python tests/benchmarks/integrity_timer.py OUT.json --ptxas-calls PTX_FOLDER

Runs in a job process that has gpu-cache's startup hook (``PYTHONPATH`` as ``gpu-cache env``
exports it). Before the program runs, it wraps each check of :data:`CHECKS` with a timer: the
hook's modules are got by name from the package the running hook loaded (``sitecustomize.package``),
never by a file's path. At exit it writes to OUT each check's calls, seconds and truthy results, and the
seconds spent inside any of them (a check nested in another counted once), in wall time and in
the calling thread's CPU time (a sha256 of more than 2 KiB lets go of the GIL, and another thread
of the job may then hold it for its 5 ms turn: wall time the check waited, not spent). Then the program
runs as ``python -m`` or ``python -c`` would run it; ``--ptxas-calls`` runs :func:`ptxas_calls`.

The ptxas shim runs in a process of its own per call (``python -I -S``: no hook, no
``PYTHONPATH``). Where the hook put it on ``PATH`` and ``$INTEGRITY_COST_SHIM`` names a wrapper
(integrity_cost.py writes it: this file's :func:`shim` behind a ``#!python -IS`` line), the
runner makes that wrapper the shim's Python; each call then times the shim's checks
(:data:`SHIM_CHECKS`) and appends one line to ``$INTEGRITY_COST_SHIM_LOG``. Standard library
only: it runs in the jobs' Python and in every shim call, where it imports nothing the shim does
not (threading and json would add about 11 ms to a call here): what it writes is ``repr`` text,
read back with ``ast.literal_eval``.
"""

import os
import sys
import time

#: What the job side checks before it serves an entry: (hook module, attribute, label).
CHECKS = (
    # the jax-triton store (tier or not): the entry's sha256 frame, jaxlib's fields, the file's owner
    ("digest", "opened", "digest"),
    ("kinds.jax_triton.store", "problem", "fields"),
    ("kinds.jax_triton.store", "Store._problem", "entry trust"),
    # the node-local tier's fetch from the shared tier (JAX, Triton, Inductor, jax-triton); the
    # kind folders' owner and mode, once per process (the jax-triton store's folder too)
    ("tier.files", "folder_problem", "folder trust"),
    ("tier", "owner_problem", "tier trust"),
    ("tier.files", "zlib.crc32", "crc32"),
    ("tier", "zlib.crc32", "crc32"),
    ("seals", "Seals.damaged", "seal"),
    ("seals", "Seals.sealed", "seal found"),  # (inside "seal": its truthy, the seals found)
    ("tier.set_aside", "check", "set-aside list"),
    # JAX: a fetched entry's zstd frame whole; with single-flight, no entry read half-written
    ("kinds.jax", "_whole", "zstd frame whole"),
    ("kinds.jax", "jax_entry", "partial write"),
    # torch_extensions: the build's owner, manifest, library sha256 and headers
    ("kinds.torch_extensions", "_Build.whole", "whole build"),
)
#: The shim's, in its own process (the folder's and the entry's owner, the folders above, the
#: entry's sha256 frame and its header).
SHIM_CHECKS = (
    ("gpu_cache_hook.digest", "opened", "digest"),
    ("gpu_cache_hook.kinds.ptxas.shim", "unpack_entry", "entry"),
    ("gpu_cache_hook.kinds.ptxas.shim", "owner_problem", "trust"),
    ("gpu_cache_hook.kinds.ptxas.shim", "distrust_above", "trust above"),
)
#: Counted only inside the tier's fetch: a promotion's copy computes one too.
FETCH_ONLY = "crc32"
SHIM_VAR = "INTEGRITY_COST_SHIM"
SHIM_LOG_VAR = "INTEGRITY_COST_SHIM_LOG"


class Timer:
    """Calls, seconds (wall, and the thread's CPU) and truthy results per label, and the seconds
    inside any timed call (``threads``: timed calls may run in several threads at once)."""

    def __init__(self, threads=True):
        self.rows = {}
        self.seconds = self.cpu_seconds = 0.0
        self.missing = []
        if threads:
            import threading

            self.local, self.lock = threading.local(), threading.Lock()
        else:
            self.local = self.lock = _OneThread()

    def install(self, checks, module_of):
        """Wrap each check; one whose module or attribute this hook lacks is named in
        ``missing`` (the report says so)."""
        for module_name, attribute, label in checks:
            try:
                module = module_of(module_name)
                owner_name, _, name = attribute.rpartition(".")
                owner = getattr(module, owner_name) if owner_name else module
                if owner_name and isinstance(owner, type(os)):  # (zlib: a proxy in that module alone)
                    owner = _Proxy(owner)
                    setattr(module, owner_name, owner)
                self._wrap(owner, name, label)
            except (ImportError, AttributeError) as exc:
                self.missing.append(f"{module_name}.{attribute}: {exc}")

    def _wrap(self, owner, name, label):
        static = isinstance(owner, type) and isinstance(owner.__dict__.get(name), staticmethod)
        original = getattr(owner, name)
        row = self.rows.setdefault(label, {"calls": 0, "seconds": 0.0, "cpu_seconds": 0.0, "truthy": 0})

        def timed(*args, **kwargs):
            local = self.local
            if label == FETCH_ONLY and not getattr(local, "fetching", False):
                return original(*args, **kwargs)
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            result = None
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                result = original(*args, **kwargs)
                return result
            finally:
                spent, cpu = time.perf_counter() - started, time.thread_time() - cpu
                local.depth = depth
                with self.lock:
                    row["calls"] += 1
                    row["seconds"] += spent
                    row["cpu_seconds"] += cpu
                    row["truthy"] += bool(result)
                    if depth == 0:
                        self.seconds += spent
                        self.cpu_seconds += cpu

        setattr(owner, name, staticmethod(timed) if static else timed)

    def mark_fetches(self, module_of):
        """The tier's copies from the shared tier (``place(..., fetched=...)``) are fetches."""
        try:
            tier = module_of("tier").Tier
        except (ImportError, AttributeError):
            return
        original, local = tier.place, self.local

        def place(*args, **kwargs):
            before = getattr(local, "fetching", False)
            local.fetching = kwargs.get("fetched") is not None
            try:
                return original(*args, **kwargs)
            finally:
                local.fetching = before

        tier.place = place

    def report(self):
        """The checks that ran (their calls, seconds and truthy results), and their seconds in all."""
        checks = {label: row for label, row in self.rows.items() if row["calls"]}
        return {"check_seconds": self.seconds, "check_cpu_seconds": self.cpu_seconds, "checks": checks,
                "missing": self.missing}


class _OneThread:
    """The thread's state and the lock of a process that times one thread."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Proxy:
    """A module seen through another name: what is set on it stays on the proxy."""

    def __init__(self, module):
        self.__dict__["_module"] = module

    def __getattr__(self, name):
        return getattr(self._module, name)


def write(path, value, append=False):
    """``value`` (plain data) as one ``repr`` line in the file ``path``."""
    if not path or not os.path.isabs(path):
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, (repr(value) + "\n").encode())
    finally:
        os.close(fd)


def _module(name):
    """The module ``name``, imported (``__import__`` gives a dotted name's top package)."""
    __import__(name)
    return sys.modules[name]


def shim():
    """One ptxas shim call, started by the shim's front as ``<this wrapper> -I -S -c CODE
    <folder> <ptxas arguments>``: the shim's ``main`` with its checks timed (the modules by
    name, from the folder the front gave), one line in ``$INTEGRITY_COST_SHIM_LOG``."""
    started = time.perf_counter()
    at = sys.argv.index("-c")
    folder, args = sys.argv[at + 2], sys.argv[at + 3:]
    sys.argv = ["-c", *args]
    sys.path.insert(0, folder)
    shim_module = _module("gpu_cache_hook.kinds.ptxas.shim")
    timer = Timer(threads=False)
    timer.install(SHIM_CHECKS, _module)
    served = []
    original_serve, original_replay = shim_module.serve, shim_module.replay

    def replay(*a, **k):
        served.append(True)
        return original_replay(*a, **k)

    def serve(*a, **k):
        try:
            return original_serve(*a, **k)
        finally:
            write(os.environ.get(SHIM_LOG_VAR), {"hit": bool(served), **timer.report(),
                                                 "call_seconds": time.perf_counter() - started}, append=True)

    shim_module.serve, shim_module.replay = serve, replay
    shim_module.main()


def hook_module(hook, name):
    """The hook's module ``gpu_cache_hook.<name>``, from the package the running hook loads."""
    import importlib

    hook.package()
    return importlib.import_module(f"gpu_cache_hook.{name}")


def ptxas_calls(folder, hook):
    """jaxlib's ptxas calls, for a machine without a GPU (where jaxlib assembles nothing): each
    ``*.ptx`` in ``folder`` is marked as the hook's wrapper of jaxlib's ``TritonKernel`` marks
    a kernel, copied to a temporary file and assembled by the ptxas first on ``PATH`` (the
    shim) as jaxlib's ``CompileGpuAsmUsingPtxAs`` calls it."""
    import re
    import subprocess
    import tempfile

    marks = hook_module(hook, "kinds.ptxas.piece")
    kernels = marks.kernels_folder()
    if not kernels:
        raise SystemExit(f"the hook did not put the ptxas shim on PATH: {hook._HOOK.parts.get('ptxas')}")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".ptx"))
    if not names:
        raise SystemExit(f"no PTX in {folder}")
    calls = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            with open(os.path.join(folder, name), "rb") as stream:
                ptx = stream.read()
            marks._mark(kernels, re.search(rb"\.entry\s+([A-Za-z0-9_$]+)", ptx).group(1).decode())
            source, output = os.path.join(scratch, "in.ptx"), os.path.join(scratch, "out.cubin")
            with open(source, "wb") as stream:
                stream.write(ptx)
            started = time.perf_counter()
            subprocess.run(["ptxas", source, "-o", output, "-arch=sm_90a", "--warn-on-spills"], check=True)
            calls.append(time.perf_counter() - started)
    print(repr({"ptx": len(names), "call_seconds": calls}))


def main(argv):
    out, mode, rest = argv[0], argv[1], argv[2:]
    hook = sys.modules.get("sitecustomize")
    if getattr(sys, "_gpu_cache_startup_hook", None) is None or not hasattr(hook, "package"):
        raise SystemExit("integrity_timer: gpu-cache's startup hook does not run in this process")
    timer = Timer()
    timer.install(CHECKS, lambda name: hook_module(hook, name))
    timer.mark_fetches(lambda name: hook_module(hook, name))
    wrapper, python_var = os.environ.get(SHIM_VAR), hook_module(hook, "names").PTXAS_PYTHON_VAR
    if wrapper and os.environ.get(python_var):  # the hook put the shim on PATH
        os.environ[python_var] = wrapper

    import atexit

    atexit.register(lambda: write(out, timer.report()))
    if mode == "--ptxas-calls":
        ptxas_calls(rest[0], hook)
        return
    import runpy

    sys.argv = [mode, *rest[1:]] if mode == "-c" else [rest[0], *rest[1:]]
    if mode == "-m":
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    else:
        exec(compile(rest[0], "<string>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main(sys.argv[1:])
