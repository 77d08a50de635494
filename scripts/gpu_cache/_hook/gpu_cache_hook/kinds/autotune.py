# gpu-cache hook piece
# watches-always tokamax._src.ops.op
# watches-with GPU_CACHE_AUTOTUNE tokamax
# node-local GPU_CACHE_AUTOTUNE
# software tokamax
"""gpu-cache's startup hook, the piece of the ``autotune`` kind, for tokamax: the second-compile
fix (issue 20), loaded when the process imports ``tokamax._src.ops.op``, and the autotuning
results kept per GPU type (issue 24), when the ``tokamax`` package has been imported.

tokamax 0.0.12 (which AlphaFold 3 v3.0.x pins) makes a JAX user context
(``jax.make_user_context`` in ``get_autotuning_cache_overlay_state()``) the first time an op
looks up its autotuning cache, which is during the first trace of a jitted function. A new user
context changes every jit key, so the function's second call traces, lowers and compiles the
whole model again (or reads its cache entry again). Made once before the first trace, the
context is part of the first key: one compile.

That state is per thread (``threading.local``): this covers the thread that imports tokamax
(AlphaFold 3 imports it and traces in its main thread); another thread that traces makes its
own context at its first lookup, as without the hook. A tokamax without the function (0.0.13
and later fixed it upstream) is left alone. ``GPU_CACHE_TOKAMAX_FIX=0`` switches the fix off.

Autotuning results (``$GPU_CACHE_AUTOTUNE``, the layout in ``gpu_cache.core.kinds.autotune_format``):
every result of this process's tokamax and jax versions is put into tokamax's per-op
autotuning cache, one per device kind (the device is not asked for at import: that would start
JAX's backend). That cache is global, so every thread gets the configs, and no JAX user context
is made (entering a result, ``with result:``, would cover one thread and change every jit key).
A result whose own versions differ from this process's is refused before tokamax parses it. A
lookup that misses (tokamax's "Autotuning cache miss" log, also logged before its ``error``
fallback raises) is counted. In a warm process (``GPU_CACHE_AUTOTUNE_SAVE=1``) a miss autotunes
(tokamax's ``autotune`` fallback unless the command line names another) and what was tuned is
merged into the device kind's result at exit.

The record's ``autotune`` part says what happened, and in which thread. Never raises into the
job. Standard library only, Python 3.9+.
"""

import atexit
import functools
import json
import logging
import os
import re
import stat
import sys
import threading

from ..common import replace_whole, safe_mode, text
from ..names import AUTOTUNE_SAVE_VAR, AUTOTUNE_VAR, TOKAMAX_FIX_VAR
from ..owners import owner_problem, team_gid

KIND = "autotune"
#: The module after whose import the fix runs, and the package after whose import the results
#: are entered.
OP_MODULE = "tokamax._src.ops.op"
PACKAGE = "tokamax"
#: What switches the fix off.
_OFF = ("0", "off", "false", "no")
FUNCTION = "get_autotuning_cache_overlay_state"
#: The results' format (the host's inventory, gpu_cache.core.kinds.autotune_format, imports it
#: from here, with ``version_folder`` and ``file_name``): the wrapper's version, and the largest
#: result read.
FORMAT = 1
RESULT_LIMIT = 64 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]")
MISS_LOG = "Autotuning cache miss"
FALLBACK_FLAG = "tokamax_autotuning_cache_miss_fallback"
#: How many missed lookups a record names.
NAMED = 20


def on_import(module, hook):
    """Run right after ``tokamax._src.ops.op`` or the ``tokamax`` package is imported, in the
    importing thread."""
    if module.__name__ == PACKAGE:
        on_package(module, hook)
    elif module.__name__ == OP_MODULE:
        fix(module, hook)


def section(hook):
    """The record's ``autotune`` part: what the fix did, and the autotuning results."""
    return hook.parts.get(KIND)


def fix(op_module, hook):
    """Make tokamax 0.0.12's JAX context now, before the first trace."""
    fix_on = os.environ.get(TOKAMAX_FIX_VAR, "").strip().lower() not in _OFF
    if not (fix_on or hook.folder):  # switched off, the record says so
        return
    part = hook.parts.setdefault(KIND, {})
    if not fix_on:
        part["fix"] = f"off: {TOKAMAX_FIX_VAR} switches it off"
        return
    make = getattr(op_module, FUNCTION, None)
    if not callable(make):
        part["fix"] = f"not needed: this tokamax has no {FUNCTION}"
        return
    thread = threading.current_thread()
    try:
        make()
    except BaseException as exc:  # the job runs as without the fix, even after a SystemExit
        part["fix"] = text(f"failed: {exc!r}", 300)
        hook.warn("tokamax fix", exc)
        return
    part.update(fix="applied", thread=text(thread.name), main_thread=thread is threading.main_thread())


def version_folder(tokamax_version, jax_version):
    """The folder name of one (tokamax, jax) pair."""
    return _UNSAFE.sub("_", f"tokamax-{tokamax_version}_jax-{jax_version}")


def file_name(device_kind):
    """The file name of one device kind's result (``NVIDIA H200`` -> ``NVIDIA_H200.json``)."""
    return _UNSAFE.sub("_", device_kind) + ".json"


def on_package(tokamax, hook):
    """Run right after the ``tokamax`` package is imported: enter the saved results, count
    misses, and in a warm process keep what gets tuned."""
    folder = os.environ.get(AUTOTUNE_VAR, "")
    if not os.path.isabs(folder):
        return
    jax = sys.modules.get("jax")
    versions = (str(getattr(tokamax, "__version__", "?")), str(getattr(jax, "__version__", "?")))
    tuning = {"versions": list(versions), "loaded": [], "refused": [], "entries": 0,
              "misses": 0, "missed": []}
    hook.parts.setdefault(KIND, {})["autotuning"] = tuning
    logging.getLogger("absl").addFilter(_MissCounter(tuning))
    here = os.path.join(folder, version_folder(*versions))
    why = _distrust(folder, here)
    if why is not None:  # another user could have written what is there: neither read nor written
        tuning["refused"].append(text(why, 300))
        return
    try:
        names = sorted(os.listdir(here))
    except OSError:
        names = []
        others = _others(folder)
        if others:
            tuning["refused"].append(text(f"no result for tokamax {versions[0]} with jax "
                                          f"{versions[1]}; results for: {', '.join(others)}"))
    for name in names:
        if name.endswith(".json") and not name.startswith("."):
            try:
                _enter(tokamax, os.path.join(here, name), versions, tuning)
            except BaseException as exc:  # that result is not used; the job runs as without it
                first = (str(exc).splitlines() or [""])[0]
                tuning["refused"].append(text(f"{name}: {type(exc).__name__}: {first}", 300))
    if os.environ.get(AUTOTUNE_SAVE_VAR) == "1":
        _keep_tuned(tokamax, here, versions, tuning)


def _distrust(folder, here):
    """Why the results folder ``folder`` or its version folder ``here`` may hold results another
    user wrote (a result decides which kernels a job runs), or None. A missing ``here`` is fine."""
    for path in (folder, here):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot inspect {path}: {exc.strerror}"
        if not stat.S_ISDIR(info.st_mode):
            return f"{path} is not a folder (a link?)"
        why = owner_problem(info, team_gid(os.lstat(folder)), where=path)
        if why is not None:
            return f"{path} is {why}"
    return None


def _others(folder):
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith("tokamax-"))[:5]
    except OSError:
        return []


def _read(path):
    """A result file's wrapper: a regular file, never followed, at most RESULT_LIMIT bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        why = owner_problem(info, team_gid(os.stat(os.path.dirname(os.path.dirname(path)))), where=fd)
        if why is not None:
            raise ValueError(f"{why}: another user could have written it")
        data = os.read(fd, RESULT_LIMIT + 1)
    finally:
        os.close(fd)
    if len(data) > RESULT_LIMIT:
        raise ValueError("larger than 64 MiB")
    wrapper = json.loads(data)
    if not isinstance(wrapper, dict) or wrapper.get("format") != FORMAT \
            or not isinstance(wrapper.get("result"), str) or not isinstance(wrapper.get("device_kind"), str):
        raise ValueError("not a gpu-cache autotuning result")
    return wrapper


def _enter(tokamax, path, versions, tuning):
    """Put one result's configs into tokamax's per-op cache (global: every thread)."""
    name = os.path.basename(path)
    wrapper = _read(path)
    made = (str(wrapper.get("tokamax")), str(wrapper.get("jax")))
    if made != versions:  # tokamax's own parser would fail, or mislead, on another version's
        tuning["refused"].append(text(f"{name}: made with tokamax {made[0]} and jax {made[1]}, "
                                      f"not {versions[0]} and {versions[1]}", 300))
        return
    device = wrapper["device_kind"]
    if file_name(device) != name:
        tuning["refused"].append(text(f"{name}: holds the result of {device!r}", 300))
        return
    result = tokamax.AutotuningResult.loads(wrapper["result"])
    if result.device_kind != device:
        tuning["refused"].append(text(f"{name}: tokamax's result is for {result.device_kind!r}", 300))
        return
    for bound, data in result.data:
        bound.op.get_autotuning_cache(device)[bound.autotuning_cache_key] = data
    tuning["loaded"].append(text(name))
    tuning["entries"] += len(result.data)


class _MissCounter(logging.Filter):
    """Counts tokamax's autotuning-cache misses as absl logs them; lets every record through."""

    def __init__(self, tuning):
        super().__init__()
        self.tuning = tuning

    def filter(self, record):
        try:
            if isinstance(record.msg, str) and record.msg.startswith(MISS_LOG):
                self.tuning["misses"] += 1
                args = record.args if isinstance(record.args, tuple) else ()
                if len(self.tuning["missed"]) < NAMED and len(args) >= 2:
                    self.tuning["missed"].append({"name": text(type(args[0]).__name__, 200),
                                                  "key": text(" ".join(str(a) for a in args[1:3]), 300)})
        except Exception:
            pass
        return True


def _keep_tuned(tokamax, here, versions, tuning):
    """A warm process: misses autotune, and what was tuned is saved at exit."""
    tuned = []
    bound_class = tokamax.BoundArguments
    original = bound_class.autotune

    @functools.wraps(original)
    def autotune(self, *args, **kwargs):
        data = original(self, *args, **kwargs)
        tuned.append((self, data))
        return data

    bound_class.autotune = autotune
    from absl import flags  # tokamax's own dependency

    if FALLBACK_FLAG in flags.FLAGS:
        flags.FLAGS.set_default(FALLBACK_FLAG, "autotune")  # a command line that names one wins
    tuning["save"] = "at exit"
    atexit.register(_save, tokamax, here, versions, tuned, tuning)


def _save(tokamax, here, versions, tuned, tuning):
    """Merge this process's tuned configs into the device kind's result (under a lock on the
    version folder: warm runs its shapes side by side), written whole through a rename, with a
    mode nobody else may write whatever the umask."""
    if not tuned:
        tuning["save"] = "nothing tuned"
        return
    try:
        device = sys.modules["jax"].devices()[0].device_kind
        result = tokamax.AutotuningResult(device, tuple(tuned))
        team = team_gid(os.stat(os.path.dirname(here)))
        try:
            os.mkdir(here, safe_mode(team, folder=True))
        except FileExistsError:
            pass
        why = _distrust(os.path.dirname(here), here)
        if why is not None:
            raise OSError(f"refused: {why}")
        name = file_name(device)
        fd = os.open(here, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                wrapper = _read(os.path.join(here, name))
                if (str(wrapper.get("tokamax")), str(wrapper.get("jax"))) == versions:
                    result = tokamax.AutotuningResult.loads(wrapper["result"]) | result
            except (OSError, ValueError):
                pass  # none yet (or unusable): this process's result replaces it
            body = json.dumps({"format": FORMAT, "tokamax": versions[0], "jax": versions[1],
                               "device_kind": device, "result": result.dumps()})
            replace_whole(fd, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp", name, body.encode(),
                          safe_mode(team))
        finally:
            os.close(fd)
        tuning["save"] = f"saved {len(result.data)} config set(s) for {text(device, 100)}"
    except BaseException as exc:  # the job's exit is never changed by it, even by a SystemExit
        tuning["save"] = text(f"failed: {exc!r}", 300)
