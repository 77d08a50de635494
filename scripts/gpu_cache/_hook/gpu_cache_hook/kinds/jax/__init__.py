# gpu-cache hook piece
# watches jax
# tier pairs -cache -atime
# tier files xla_gpu_per_fusion_autotune_cache_dir
# software jax jaxlib zstandard
# key-environment XLA_FLAGS JAX_ENABLE_X64 JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES LIBTPU_INIT_ARGS
# place-environment JAX_COMPILATION_CACHE_DIR
"""gpu-cache's startup hook, the JAX piece: loaded when the process imports ``jax``.

Everything of the hook that touches JAX's private modules (``jax._src``) is here: the
listeners of ``jax.monitoring``, the names and keys of hits and misses from JAX's own log
calls, the parts of each cache key (for ``gpu-cache doctor --explain``), and JAX
single-flight and the node-local tier around the persistent cache's read and write
(``cache``). A jax whose internals differ loses the part that does not fit, with one warning
line at most; the job runs on.
Standard library only, Python 3.9+.
"""

import os
import sys
import threading

from ... import common
from ...common import MAX_ITEMS, keep, text, touch
from ...names import JAX_CACHE_DIR_VAR

KIND = "jax"
#: The leading parameters of ``jax._src.compiler._cache_read`` that the names of hits and misses
#: are read from where jax logs neither (``cache.FLIGHT_API`` holds the rest).
CACHE_READ = ("module_name", "cache_key")


def part(hook):
    """The record's ``jax`` part of this process, made on first use."""
    return common.part(hook, KIND, {
        "requests": 0, "hits": 0, "writes": 0, "compile_seconds": 0.0, "saved_seconds": 0.0,
        "own_compile_seconds": 0.0, "load_seconds": 0.0,
        "hit_keys": [], "missed": [], "key_parts": {}, "key_context": {},
        "dropped": {"hit_keys": 0, "missed": 0, "key_parts": 0}})


def cache_dir():
    """The cache folder this process's JAX really used: a program may set its own with
    ``jax.config.update("jax_compilation_cache_dir", ...)`` over the exported one."""
    try:
        folder = sys.modules["jax"].config.jax_compilation_cache_dir
    except Exception:
        return None
    return text(str(folder)) if folder else None


def section(hook):
    """The record's ``jax`` part at exit, with single-flight's and the tier's."""
    stats = common.section(hook, KIND)
    if stats is not None:
        stats["misses"] = max(0, stats["requests"] - stats["hits"])
        stats["cache_dir"] = cache_dir()
    return stats


def device(hook):
    """What JAX compiled for in this process (its keys' context), or None."""
    context = part(hook)["key_context"] if KIND in hook.libraries else None
    if not context:
        return None
    return {"platform": context.get("platform"), "kinds": context.get("device_kinds"),
            "count": context.get("device_count")}


def on_import(jax_module, hook):
    """Run right after ``import jax``."""
    hook.observed(KIND)
    stats = part(hook)
    tier = common.tier(hook)
    if hook.flight or tier is not None:
        try:
            from . import cache

            cache.wrap(hook, tier, cache_dir)
        except Exception as exc:  # the job runs as without single-flight and the tier
            common.wrappers_off(hook, KIND, tier, f"not installed: {exc!r}")
            hook.warn("jax cache wrappers", exc)
    if hook.folder:
        _jax_listeners(hook, stats)


#: JAX's monitoring events the split of its compile seconds follows.
_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
_HIT = "/jax/compilation_cache/cache_hits"
_COMPILE = "/jax/core/compile/backend_compile_duration"
#: The cached compile this thread is in (JAX sends each call's events from its thread): a hit,
#: the miss it named, the thread's single-flight wait seconds at the previous compile's end.
_CALL = threading.local()


def _jax_listeners(hook, stats):
    from jax import monitoring

    counters = {_REQUEST: "requests", _HIT: "hits",
                "/jax/compilation_cache/cache_misses": "writes"}  # counts write attempts, not misses
    durations = {_COMPILE: "compile_seconds",
                 "/jax/compilation_cache/compile_time_saved_sec": "saved_seconds"}
    flight = common.flight(hook) if hook.flight else None

    def on_event(event, **_kwargs):
        name = counters.get(event)
        if name:
            stats[name] += 1
        if event == _REQUEST:
            _CALL.hit, _CALL.missed = False, None
        elif event == _HIT:
            _CALL.hit = True

    def on_duration(event, duration_secs, **_kwargs):
        name = durations.get(event)
        if name:
            stats[name] += float(duration_secs)
        if event == _COMPILE:
            _split_compile(stats, float(duration_secs), flight.thread_wait_seconds("jax") if flight else 0.0)

    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
    _wrap_jax_cache_logging(hook, stats)
    try:
        _wrap_jax_cache_key(hook, stats)
    except Exception as exc:  # private module: explain loses its input, nothing else
        hook.warn("jax cache key parts", exc)


def _split_compile(stats, seconds, waited):
    """One compile step's seconds (JAX's ``backend_compile_duration``: the key, the cache read,
    any single-flight wait, the compile and the write) split into the wait and the rest: a hit's
    rest is loading the entry (``load_seconds``), a miss's is this process compiling it
    (``own_compile_seconds``, kept with the missed computation too)."""
    wait = max(0.0, waited - getattr(_CALL, "waited", 0.0))
    _CALL.waited = waited
    rest = max(0.0, seconds - wait)
    if getattr(_CALL, "hit", False):
        stats["load_seconds"] += rest
    else:
        stats["own_compile_seconds"] += rest
        missed = getattr(_CALL, "missed", None)
        if missed is not None:
            missed["seconds"] = round(rest, 3)
    _CALL.hit, _CALL.missed = False, None


#: Characters of each key component's sha256 kept in records (64 bits: plenty to compare).
_PART_CHARS = 16


class _Tee:
    """A sha256 of the whole key that also hashes each part of it on its own."""

    def __init__(self, hashlib, *args):
        self._sha256 = hashlib.sha256
        self._whole = hashlib.sha256(*args)
        self._part = hashlib.sha256()
        self.parts = {}

    def update(self, data):
        self._whole.update(data)
        self._part.update(data)

    def digest(self):
        return self._whole.digest()

    def hexdigest(self):
        return self._whole.hexdigest()

    def copy(self):
        return self._whole.copy()

    def cut(self, name):
        self.parts[name] = self._part.hexdigest()[:_PART_CHARS]
        self._part = self._sha256()


class _Hashlib:
    """``hashlib`` for cache_key.py, whose first ``sha256()`` in a ``get`` of this thread
    (``local.in_get``) is a :class:`_Tee`."""

    def __init__(self, hashlib, local):
        self._hashlib, self._local = hashlib, local

    def __getattr__(self, name):
        return getattr(self._hashlib, name)

    def sha256(self, *args):
        local = self._local
        if getattr(local, "in_get", False) and getattr(local, "tee", None) is None:
            local.tee = _Tee(self._hashlib, *args)
            return local.tee
        return self._hashlib.sha256(*args)


def _wrap_jax_cache_key(hook, stats):
    """Record a hash of each part of every JAX cache key, for ``gpu-cache doctor --explain``.

    ``jax._src.cache_key.get`` hashes the key's parts (computation, jaxlib version, backend
    version, XLA flags, compile options, accelerator config, compression, custom hook) into
    one sha256, calling ``_log_cache_key_hash(hash_obj, part_name, ...)`` after each part.
    A tee hasher given to ``get`` also hashes each part on its own, so nothing is hashed twice.
    """
    import hashlib

    from jax._src import cache_key

    original_get = cache_key.get
    original_log = cache_key._log_cache_key_hash
    local = threading.local()

    def log_part(hash_obj, last_serialized, *args, **kwargs):
        if isinstance(hash_obj, _Tee):
            hash_obj.cut(str(last_serialized))
        return original_log(hash_obj, last_serialized, *args, **kwargs)

    def get(module, devices, compile_options, backend, *args, **kwargs):
        local.in_get, local.tee = True, None
        try:
            key = original_get(module, devices, compile_options, backend, *args, **kwargs)
        except Exception as exc:
            # A jax whose key code the tee does not fit: compute the key plainly; the job
            # must never fail because of the hook (a real jax error raises again here).
            local.in_get, local.tee = False, None
            hook.warn("jax cache key parts", exc)
            key = original_get(module, devices, compile_options, backend, *args, **kwargs)
        finally:
            local.in_get = False
        try:
            _keep_key_parts(stats, key, local.tee)
            if not stats["key_context"]:
                stats["key_context"].update(_key_context(cache_key, devices, backend, args, kwargs))
        except Exception as exc:
            hook.warn("jax cache key parts", exc)
        local.tee = None
        return key

    cache_key.hashlib = _Hashlib(hashlib, local)
    cache_key._log_cache_key_hash = log_part
    cache_key.get = get


def _keep_key_parts(stats, key, tee):
    """The record keeps the parts' hashes of ``key`` (up to MAX_ITEMS keys; the rest are counted)."""
    if tee is None:
        return
    parts = stats["key_parts"]
    name = text(key)
    if name in parts or len(parts) < MAX_ITEMS:
        parts[name] = tee.parts
    else:
        stats["dropped"]["key_parts"] += 1


def _key_context(cache_key, devices, backend, args, kwargs):
    """What the process's keys were computed for: platform, devices, compression, jaxlib."""
    flat = list(getattr(devices, "flat", devices))
    return {
        "platform": str(getattr(backend, "platform", "?")),
        "platform_version": str(getattr(backend, "platform_version", "?")),
        "device_count": len(flat),
        "device_kinds": sorted({str(getattr(d, "device_kind", "?")) for d in flat}),
        "compression": str(kwargs.get("compression_algorithm", args[0] if args else "?")),
        "jaxlib": str(getattr(cache_key, "jaxlib_version_str", "?")),
    }


def _wrap_jax_cache_logging(hook, stats):
    """Learn the name and key of each hit and miss from jax's own log calls."""
    try:
        from jax._src import compiler
    except Exception as exc:  # private module: names are a bonus, counts still work
        hook.warn("jax cache keys", exc)
        return
    original_hit = getattr(compiler, "log_persistent_cache_hit", None)
    original_miss = getattr(compiler, "log_persistent_cache_miss", None)
    if original_hit is None or original_miss is None:
        _wrap_jax_cache_read_names(hook, stats, compiler)
        return

    def on_hit(module_name, cache_key, *args, **kwargs):
        _named_hit(hook, stats, cache_key)
        return original_hit(module_name, cache_key, *args, **kwargs)

    def on_miss(module_name, cache_key, *args, **kwargs):
        _named_miss(hook, stats, module_name, cache_key)
        return original_miss(module_name, cache_key, *args, **kwargs)

    compiler.log_persistent_cache_hit = on_hit
    compiler.log_persistent_cache_miss = on_miss


def _named_hit(hook, stats, cache_key):
    """Keep a hit's key (what the next warm step checks is still there) and mark its entry used."""
    try:
        keep(stats, "hit_keys", text(cache_key))
        folder = cache_dir() or os.environ.get(JAX_CACHE_DIR_VAR)
        if folder:
            path = os.path.join(folder, f"{cache_key}-cache")
            # older jax (0.4.30) names the entry by its key alone
            touch(path if os.path.lexists(path) else os.path.join(folder, cache_key))
    except Exception as exc:
        hook.warn("jax hit", exc)


def _named_miss(hook, stats, module_name, cache_key):
    try:
        missed = {"name": text(module_name), "key": text(cache_key)}
        keep(stats, "missed", missed)
        _CALL.missed = missed
    except Exception as exc:
        hook.warn("jax miss", exc)


def _wrap_jax_cache_read_names(hook, stats, compiler):
    """Names of hits and misses on a jax that logs neither (jax 0.4.30, whose
    ``compile_or_get_cached`` only logs "Persistent compilation cache hit" at debug level):
    from ``_cache_read``, which returns ``(executable, compile time)`` on a hit and
    ``(None, None)`` on a miss. Installed over single-flight's wrapper, so a hit found after
    waiting for another process's compile counts as the hit JAX then reports. A jax whose
    ``_cache_read`` differs is left alone: the record says why its hits have no names."""
    import inspect

    wanted = CACHE_READ  # all it uses (single-flight's wrapper has no more)
    read = getattr(compiler, "_cache_read", None)
    try:
        names = tuple(inspect.signature(read).parameters)[:len(wanted)] if callable(read) else ()
    except (TypeError, ValueError):
        names = ()
    if names != wanted:
        stats["unnamed"] = ("this jax logs no cache hits and its jax._src.compiler._cache_read is not "
                            f"_cache_read{wanted}: hits and misses are counted, not named")
        return

    def cache_read(module_name, cache_key, *args, **kwargs):
        result = read(module_name, cache_key, *args, **kwargs)
        try:
            found = result[0] is not None
        except Exception:  # not the pair this jax returns: leave it to jax
            return result
        if found:
            _named_hit(hook, stats, cache_key)
        else:
            _named_miss(hook, stats, module_name, cache_key)
        return result

    compiler._cache_read = cache_read
