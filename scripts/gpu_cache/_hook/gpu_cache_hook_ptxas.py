"""gpu-cache's startup hook, the ptxas cache (issue 34): loaded at start in a process whose
environment names the cache folder (``$GPU_CACHE_PTXAS``, exported by ``gpu-cache env``).

jaxlib runs the first ``ptxas`` on ``PATH`` on every jax-triton kernel's PTX at the kernel's
first launch, in every process. A container job's ``PATH`` is the image's, so an exported one
would not reach it: the hook puts the shim's folder (``ptxas/`` beside this file) first on the
process's own ``PATH``, at start, before jaxlib loads (older XLA versions keep the ptxas they
found first for the whole process). It does so only where ``jax_triton`` is installed: XLA's own
kernels take ``<JAX's CUDA root>/bin/ptxas`` first and ``PATH`` after it, and a Python start
per call costs about what one of XLA's small ptxas calls does, so a process that cannot run
jaxlib's Triton kernels gets no shim (docs/ptxas.md, and ``tests/benchmarks/ptxas_gpu.py``).

It also sets, for the shim (and what the process starts): ``$GPU_CACHE_PTXAS_REAL``, the ptxas
the process would have run (the first on ``PATH``, else in ``/usr/local/cuda``, ``/opt/cuda``
or a CUDA wheel, as jaxlib looks); ``$GPU_CACHE_PTXAS_PYTHON``, this interpreter; and, with
records on, ``$GPU_CACHE_PTXAS_TALLY``, a file in the records folder where each shim call adds a
line, read into this process's record at exit (``ptxas``: hits, misses, the missed keys with
their parts) and removed. Standard library only, Python 3.9+.
"""

import os
import stat
import sys

import gpu_cache_hook_common as common
from sitecustomize import PTXAS_PYTHON_VAR, PTXAS_REAL_VAR, PTXAS_TALLY_VAR, PTXAS_VAR

#: The package whose kernels run through jaxlib's ptxas: where it is not installed, no shim.
JAX_TRITON = "jax_triton"
#: A tally larger than this is not read (a line per ptxas call: about 300 bytes).
MAX_TALLY = 8 << 20


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


def install(hook):
    """Put the shim first on this process's PATH, where it can serve; the record says why not."""
    shim = hook.piece("gpu_cache_ptxas")
    folder = os.environ.get(PTXAS_VAR, "")
    part = hook.parts["ptxas"] = {"state": "off", "folder": common.text(folder), "real": None,
                                  "found_in": None, **_counts()}
    why = _why_off(hook, shim, folder)
    path_value = os.environ.get("PATH", os.defpath)
    real, where = (None, None) if why else shim.find_real(path_value, sys.path)
    if why is None and real is None:
        why = "no ptxas on PATH, in /usr/local/cuda, /opt/cuda or a CUDA wheel"
    if why:
        part["state"] = f"off: {why}"
        return
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
        os.environ[PTXAS_TALLY_VAR] = hook.ptxas_tally = tally
        _remove_at_exit(tally)
    part.update(state="on", real=common.text(real), found_in=where)


def _counts():
    return {"hits": 0, "misses": 0, "passed": 0, "compile_seconds": 0.0, "saved_seconds": 0.0,
            "hit_keys": [], "missed": [], "passed_why": {}, "dropped": {"hit_keys": 0, "missed": 0}}


def _remove_at_exit(path):
    import atexit

    owner = os.getpid()

    def remove():
        if os.getpid() == owner:  # not in a forked child
            try:
                os.unlink(path)
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
    out = dict(hook.parts.get("ptxas") or {})
    tally = hook.ptxas_tally
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
        _add(out, line.split("\t"), hook.piece("gpu_cache_ptxas").META_SEP)
    out["compile_seconds"] = round(out["compile_seconds"], 4)
    out["saved_seconds"] = round(out["saved_seconds"], 4)
    return out
