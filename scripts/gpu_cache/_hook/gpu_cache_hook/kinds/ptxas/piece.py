"""gpu-cache's startup hook, the ptxas cache (issue 34): loaded at start in a process whose
environment names the cache folder (``$GPU_CACHE_PTXAS``, exported by ``gpu-cache env``).

jaxlib runs the first ``ptxas`` on ``PATH`` on every jax-triton kernel's PTX at the kernel's
first launch, in every process. A container job's ``PATH`` is the image's, so an exported one
would not reach it: the hook puts the shim's folder (``bin/`` beside this file) first on the
process's own ``PATH``, at start, before jaxlib loads (older XLA versions keep the ptxas they
found first for the whole process). It does so only where ``jax_triton`` is installed: a process
that cannot run jaxlib's Triton kernels gets no shim (docs/ptxas.md).

It also sets, for the shim (and what the process starts): ``$GPU_CACHE_PTXAS_REAL``, the ptxas
the process would have run (the first on ``PATH``, else in ``/usr/local/cuda``, ``/opt/cuda``
or a CUDA wheel, as jaxlib looks); ``$GPU_CACHE_PTXAS_PYTHON``, this interpreter; and, with
records on, ``$GPU_CACHE_PTXAS_TALLY``, a file in the records folder where each shim call adds a
line, read into this process's record at exit (``ptxas``: hits, misses, the missed keys with
their parts, the entries refused and set aside, and why) and removed.

XLA's own kernels stay off the cache (issue 37: about 1000 calls in a cold 12-layer process,
each a Python start, +14% CPU on an H100): ``$GPU_CACHE_PTXAS_KERNELS`` is ``<this pid>:<a new
private folder>``, and after ``jax_triton`` is imported every kernel jaxlib's Triton path is
given (``gpu_triton.TritonKernel``, whose first argument is the PTX's entry name) leaves an
empty file of its name there. The shim's ``/bin/sh`` front runs the real ptxas at once, without
Python, for a call of this process whose PTX's entry has no such file: XLA's. Set at start,
never changed later (``setenv`` while another thread reads the environment can crash it); a
forked child gets its own pid there. Standard library only, Python 3.9+.
"""

import os
import stat
import sys

from ... import common
from ...names import (
    NODE_LOCAL_PREFIX,
    PTXAS_KERNELS_VAR,
    PTXAS_PYTHON_VAR,
    PTXAS_REAL_VAR,
    PTXAS_TALLY_VAR,
    PTXAS_VAR,
)

KIND = "ptxas"
#: The package whose kernels run through jaxlib's ptxas: where it is not installed, no shim.
JAX_TRITON = "jax_triton"
#: A tally larger than this is not read (a line per ptxas call: about 300 bytes).
MAX_TALLY = 8 << 20
#: The longest kernel name marked for the shim (longer ones: XLA's route, uncached).
MAX_NAME = 200


def _jax_triton_installed():
    external = sys.modules.get("_frozen_importlib_external")
    finder = getattr(external, "PathFinder", None)
    if finder is None:
        import importlib.machinery

        finder = importlib.machinery.PathFinder
    return finder.find_spec(JAX_TRITON) is not None


def _why_off(hook, shim, folder):
    if not _jax_triton_installed():
        return (f"{JAX_TRITON} is not installed: no jaxlib Triton kernel to assemble, and XLA's own "
                "ptxas calls are left alone")
    if not (os.path.isfile(shim.FRONT) and os.access(shim.FRONT, os.X_OK)):
        return f"the shim {shim.FRONT} is missing or not executable"
    try:
        os.close(shim.Folder(folder).fd)
    except OSError as exc:
        return f"the cache folder cannot be used: {exc.strerror or exc}"
    return None


#: This process's folder of jaxlib's kernel names and its tally file, once the shim is set up.
_STATE = {"kernels": None, "tally": None}


def kernels_folder():
    """The folder of jaxlib's kernel names this process marks for the shim (None: no shim)."""
    return _STATE["kernels"]


def install(hook):
    """Put the shim first on this process's PATH, where it can serve; the record says why not."""
    from . import shim

    folder = os.environ.get(PTXAS_VAR, "")
    part = hook.parts[KIND] = {"state": "off", "folder": common.text(folder), "real": None,
                                  "found_in": None, **_counts()}
    why = _why_off(hook, shim, folder)
    path_value = os.environ.get("PATH", os.defpath)
    real, where = (None, None) if why else shim.find_real(path_value, sys.path)
    if why is None and real is None:
        why = "no ptxas on PATH, in /usr/local/cuda, /opt/cuda or a CUDA wheel"
    kernels = None
    if why is None:
        try:
            kernels = _kernels_folder()
        except OSError as exc:
            why = f"no folder for jaxlib's kernel names: {exc.strerror or exc}"
    if why:
        part["state"] = f"off: {why}"
        return
    _STATE["kernels"] = kernels
    os.environ[PTXAS_KERNELS_VAR] = f"{os.getpid()}:{kernels}"
    _remove_at_exit(kernels, folder=True)
    os.register_at_fork(after_in_child=lambda: os.environ.__setitem__(
        PTXAS_KERNELS_VAR, f"{os.getpid()}:{kernels}"))
    rest = [entry for entry in path_value.split(os.pathsep)
            if not (entry and shim.same_folder(entry, shim.SHIM_DIR))]
    os.environ["PATH"] = os.pathsep.join([shim.SHIM_DIR, *rest])
    os.environ[PTXAS_REAL_VAR] = real
    if sys.executable and os.access(sys.executable, os.X_OK):
        os.environ[PTXAS_PYTHON_VAR] = sys.executable
    os.environ.pop(PTXAS_TALLY_VAR, None)  # a parent's: its record is not ours
    if hook.folder and os.path.isabs(hook.folder):
        try:
            os.makedirs(hook.folder, exist_ok=True)  # as the record's writer does, at exit
        except OSError:
            pass
        tally = os.path.join(hook.folder, f".ptxas-{os.uname().nodename[:60]}-{os.getpid()}-"
                                          f"{os.urandom(4).hex()}.tally")
        os.environ[PTXAS_TALLY_VAR] = _STATE["tally"] = tally
        _remove_at_exit(tally)
    part.update(state="on", real=common.text(real), found_in=where, jaxlib_kernels=0)


def _kernels_folder():
    """A new folder of this process's (0700, under ``$TMPDIR`` or ``/tmp``), for the names of
    jaxlib's Triton kernels; a random name, so nobody made it first."""
    base = os.environ.get("TMPDIR", "")
    folder = os.path.join(base if os.path.isabs(base) else "/tmp", f"{NODE_LOCAL_PREFIX}{os.getuid()}-"
                          f"ptxas-kernels-{os.getpid()}-{os.urandom(6).hex()}")
    os.mkdir(folder, 0o700)
    return folder


def on_jax_triton(module, hook):
    """Run right after ``jax_triton`` is imported: each kernel jaxlib's Triton path is given
    from now on marks its name for the shim (jaxlib runs ptxas on it at its first launch)."""
    kernels = _STATE["kernels"]
    lib = getattr(sys.modules.get("jax._src.lib"), "gpu_triton", None)
    original = getattr(lib, "TritonKernel", None)
    if kernels is None or original is None or getattr(original, "__wrapped__", None) is not None:
        return  # (no shim in this process: XLA's ptxas runs are left alone)
    part = hook.parts[KIND]
    names = set()

    def TritonKernel(*args, **kwargs):
        kernel = original(*args, **kwargs)
        name = args[0] if args else None
        if isinstance(name, str) and name not in names and _mark(kernels, name):
            names.add(name)
            part["jaxlib_kernels"] = len(names)
        return kernel

    TritonKernel.__wrapped__ = original
    lib.TritonKernel = TritonKernel


def _mark(folder, name):
    """An empty file ``name`` in ``folder``; whether it is there (names the shim's front cannot
    match, like one with a "/", are not marked)."""
    plain = name.replace("_", "a").replace("$", "a")
    if not (0 < len(name) <= MAX_NAME and plain.isascii() and plain.isalnum()):
        return False
    try:
        os.close(os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600))
    except OSError:
        return False
    return True


def _counts():
    return {"hits": 0, "misses": 0, "passed": 0, "compile_seconds": 0.0, "saved_seconds": 0.0,
            "hit_keys": [], "missed": [], "refused": [], "passed_why": {},
            "dropped": {"hit_keys": 0, "missed": 0, "refused": 0}}


def _remove_at_exit(path, folder=False):
    import atexit

    owner = os.getpid()

    def remove():
        if os.getpid() != owner:  # not in a forked child
            return
        try:
            for name in os.listdir(path) if folder else ():
                os.unlink(os.path.join(path, name))
            (os.rmdir if folder else os.unlink)(path)
        except OSError:
            pass

    atexit.register(remove)


def _number(text):
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if value == value and abs(value) < 1e9 else 0.0


def _add(part, fields, separator):
    outcome, key, name, seconds, saved, meta, why = (fields + [""] * 7)[:7]
    if outcome == "pass":
        part["passed"] += 1
        counted = part["passed_why"]
        if why in counted or len(counted) < 50:
            counted[why] = counted.get(why, 0) + 1
        return
    if outcome == "refused":  # an entry there that may not be served, set aside: its call misses
        common.keep(part, "refused", common.text(why))
        return
    if outcome not in ("hit", "miss"):
        return
    if outcome == "hit":
        part["hits"] += 1
        part["saved_seconds"] += _number(saved)  # negative where a hit took longer than the run
        if key and key not in part["hit_keys"]:
            common.keep(part, "hit_keys", key)
        return
    part["misses"] += 1
    part["compile_seconds"] += _number(seconds)
    names = ("name", "ptxas", "ptxas_digest", "options", "input")
    parts = dict(zip(names, meta.split(separator))) if meta else {}
    common.keep(part, "missed", {"name": common.text(name or "?"), "key": common.text(key),
                                 "parts": {k: common.text(v) for k, v in parts.items()},
                                 "why": common.text(why) if why else None})


def part(hook):
    """The record's ``ptxas`` part: the install's state, and what the tally counted."""
    from .shim import META_SEP

    out = dict(hook.parts.get(KIND) or {})
    tally = _STATE["tally"]
    if not tally:
        return out
    out.update(_counts())
    try:  # never through a link; a FIFO never blocks
        fd = os.open(tally, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            data = os.read(fd, MAX_TALLY) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
    except OSError:
        data = b""
    for line in data.decode("utf-8", "replace").splitlines():
        _add(out, line.split("\t"), META_SEP)
    out["compile_seconds"] = round(out["compile_seconds"], 4)
    out["saved_seconds"] = round(out["saved_seconds"], 4)
    return out
