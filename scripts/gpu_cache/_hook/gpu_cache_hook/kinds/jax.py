"""gpu-cache's startup hook, the JAX piece: loaded when the process imports ``jax``.

Everything of the hook that touches JAX's private modules (``jax._src``) is here: the
listeners of ``jax.monitoring``, the names and keys of hits and misses from JAX's own log
calls, the parts of each cache key (for ``gpu-cache doctor --explain``), and JAX
single-flight around the persistent cache's read and write. A jax whose internals differ
loses the part that does not fit, with one warning line at most; the job runs on.
Standard library only, Python 3.9+.
"""

import os
import stat
import threading
import time

from sitecustomize import JAX_CACHE_DIR_VAR

from gpu_cache_hook import common
from gpu_cache_hook.common import MAX_ITEMS, keep, text, touch


def on_import(jax_module, hook):
    """Run right after ``import jax``."""
    stats = common.jax_part(hook)
    tier = common.tier(hook)
    if hook.flight or tier is not None:
        try:
            _wrap_jax_cache(hook, tier)
        except Exception as exc:  # the job runs as without single-flight and the tier
            if hook.flight:
                common.flight_off(hook, "jax", f"not installed: {exc!r}"[:300])
            if tier is not None:
                tier.disable("jax", f"not installed: {exc!r}")
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
        folder = common.jax_cache_dir() or os.environ.get(JAX_CACHE_DIR_VAR)
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

    wanted = _JAX_FLIGHT_API["_cache_read"][:2]  # all it uses (single-flight's wrapper has no more)
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


#: What JAX single-flight wraps in ``jax._src.compiler``, with the leading parameters each must
#: have (jax 0.4.30, 0.10.2 and 0.11.2 have them). A jax whose internals differ runs without it.
_JAX_FLIGHT_API = {
    "compile_or_get_cached": ("backend", "computation", "devices", "compile_options"),
    "_cache_read": ("module_name", "cache_key", "compile_options", "backend"),
    "_cache_write": ("cache_key", "compile_time_secs", "module_name", "backend", "executable"),
}


def _jax_flight_mismatch(compiler):
    """Why this jax's compiler does not fit JAX single-flight, or None."""
    import inspect

    for name, params in _JAX_FLIGHT_API.items():
        func = getattr(compiler, name, None)
        if not callable(func):
            return f"jax._src.compiler.{name} is missing"
        try:
            names = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError) as exc:
            return f"jax._src.compiler.{name}: no signature ({exc})"
        if names[:len(params)] != params:
            return f"jax._src.compiler.{name}{names[:len(params)]} is not {name}{params}"
    return None


def _wrap_jax_cache(hook, tier):
    """Single-flight and the node-local tier around JAX's persistent cache, one key at a time.

    ``compile_or_get_cached`` reads the cache with ``_cache_read`` (a miss: ``(None, None)``),
    compiles, and writes with ``_cache_write``. With the tier (``tier``), a read
    first copies the entry from the shared tier where the local one lacks it (fetch), and a
    write promotes the entry to the shared tier before anything else (so that a waiter on
    another node finds it as soon as it is told to look). With single-flight, on a miss the
    wrapped read takes the key's lock (``flight.lead``) and reads again under it: a
    hit is returned as JAX's own hit, a miss leaves this process the key's leader; its peeks
    look at its own folder (the local tier: this node's leader's entry, whole before its
    promotion ends) and at the SHARED tier where the tier is on. ``_cache_write`` releases the lock once the
    entry is written (or was not: waiters then compile side by side), and a ``finally`` around
    ``compile_or_get_cached`` releases whatever this call still holds (a failed compile).
    Computations of several processes of one ``jax.distributed`` run are left alone by
    single-flight: JAX shares those between the processes itself, and only process 0 writes.
    """
    flight = common.flight(hook) if hook.flight else None
    from jax._src import compiler

    why = _jax_flight_mismatch(compiler)
    try:
        from jax._src import distributed

        state = distributed.global_state
    except Exception as exc:
        why = why or f"no jax._src.distributed.global_state ({exc!r})"
    if why:
        if flight is not None:
            flight.disable("jax", why)
        if tier is not None:
            tier.disable("jax", why)
        return
    cache = _JaxCache(hook, flight, tier, compiler, state)
    compiler._cache_read = cache.read
    compiler._cache_write = cache.write
    if flight is not None:
        compiler.compile_or_get_cached = cache.compile_or_get_cached
    now = cache.tiered()
    if now is not None:  # XLA's per-fusion autotune results kept on the shared tier
        now.fetch_tree("jax", now.XLA_AUTOTUNE)


class _JaxCache:
    """JAX's ``_cache_read``, ``_cache_write`` and ``compile_or_get_cached`` through
    single-flight (``flight``) and the node-local tier (``tier``), as :func:`_wrap_jax_cache`
    says; ``state``: JAX's distributed state (a run of several processes is left alone)."""

    def __init__(self, hook, flight, tier, compiler, state):
        self.hook, self.flight, self.tier, self.state = hook, flight, tier, state
        self.original_read = compiler._cache_read
        self.original_write = compiler._cache_write
        self.original_compile = compiler.compile_or_get_cached
        self.local = threading.local()

    def flying(self):
        return self.flight is not None and self.flight.enabled("jax")

    def held(self):
        """The keys' locks this thread holds."""
        mine = getattr(self.local, "held", None)
        if mine is None:
            mine = self.local.held = {}
        return mine

    def folder(self):
        return common.jax_cache_dir() or os.environ.get(JAX_CACHE_DIR_VAR) or ""

    def tiered(self):
        """The tier, where this process's JAX cache folder is the local tier's."""
        tier = self.tier
        if tier is None or not tier.enabled("jax"):
            return None
        return tier if os.path.normpath(self.folder()) == tier.local_folder("jax") else None

    def fetch(self, cache_key):
        """Copy the entry from the shared tier where the local one lacks it."""
        now = self.tiered()
        if now is not None:
            now.fetch("jax", f"{cache_key}-cache", check=_whole)

    def read(self, module_name, cache_key, *args, **kwargs):
        self.fetch(cache_key)
        # JAX writes entries in place: one being written now (here or on another node) is a
        # miss, never read half (a warning and a second compile), and waited for below.
        writing = self.flying() and jax_entry(self.folder(), cache_key) == "partial"
        result = (None, None) if writing else self.original_read(module_name, cache_key, *args, **kwargs)
        if result[0] is not None and self.tiered() is not None:  # used now: the bound trims LRU first
            touch(os.path.join(self.folder(), f"{cache_key}-cache"))
        if result[0] is not None or not self.flying() or getattr(self.state, "client", None) is not None:
            return result
        return self._lead(module_name, cache_key, args, kwargs, result)

    def _lead(self, module_name, cache_key, args, kwargs, result):
        """A miss: take the key's lock, or load what its leader wrote meanwhile."""
        raised = []

        def read():
            self.fetch(cache_key)
            if settled_jax_entry(self.folder(), cache_key) == "partial":
                return None
            try:
                again = self.original_read(module_name, cache_key, *args, **kwargs)
            except BaseException as exc:  # jax told to raise cache errors: as without the hook
                raised.append(exc)
                raise
            return again if again[0] is not None else None

        def peek():
            # The entry this node's leader wrote is whole in the local folder before its
            # promotion ends (a copy to the shared tier): a waiter on this node loads it then.
            if jax_entry(self.folder(), cache_key) == "whole":
                return read()
            now = self.tiered()  # another node's promoted entry is whole the moment it shows
            return read() if now is not None and _has(now.shared_folder("jax"), cache_key) else None

        now = self.tiered()
        where = now.shared_folder("jax") if now is not None else self.folder()
        try:
            found, lock = self.flight.lead("jax", cache_key, where, read, peek)
        except Exception as exc:
            if raised:
                raise
            self.hook.warn("jax single-flight", exc)
            return result
        if found is not None:
            return found
        if lock is not None:
            self.held()[cache_key] = lock
        return result

    def write(self, cache_key, *args, **kwargs):
        try:
            return self.original_write(cache_key, *args, **kwargs)
        finally:
            folder = self.folder()
            now = self.tiered()
            if now is not None and _jax_entry_written(folder, cache_key):
                now.promote("jax", f"{cache_key}-cache", check=_whole)
                now.promote_tree("jax", now.XLA_AUTOTUNE)
            lock = self.held().pop(cache_key, None)
            if lock is not None:
                lock.release(wrote=_jax_entry_written(folder, cache_key))

    def compile_or_get_cached(self, *args, **kwargs):
        before = set(self.held())
        try:
            return self.original_compile(*args, **kwargs)
        finally:
            mine = self.held()
            for key in [key for key in mine if key not in before]:
                mine.pop(key).release(wrote=False)


def _has(folder, cache_key):
    return os.path.lexists(os.path.join(folder, f"{cache_key}-cache"))


def _jax_entry_written(folder, cache_key):
    """Whether JAX's cache folder holds the entry now (``<key>-cache``; the key alone on jax
    0.4.30). Never raises."""
    try:
        return bool(folder) and (os.path.exists(os.path.join(folder, f"{cache_key}-cache"))
                                 or os.path.exists(os.path.join(folder, cache_key)))
    except Exception:
        return False


# --- what a JAX waiter may read while another process writes (JAX writes entries in place) ---

_READ_ENTRY = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
#: How long after its last write a JAX entry is checked for being whole before it is read.
YOUNG = 60.0


def jax_entry(folder, key):
    """The state of JAX's entry for ``key`` in ``folder``: "whole" or "partial" when it was
    written within the last ``YOUNG`` seconds (JAX writes entries in place, so another process
    may be writing it now: a complete zstd frame, checked through its block headers with no
    decoder, or zlib stream, is whole), else None (no entry, or an older one, which JAX's own
    read judges). Never raises."""
    for name in (f"{key}-cache", key):  # jax 0.4.30 names entries by the key alone
        try:
            fd = os.open(os.path.join(folder, name), _READ_ENTRY)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or time.time() - info.st_mtime > YOUNG:
                return None
            return "whole" if _whole(fd, info.st_size) else "partial"
        except (OSError, ValueError):
            return "partial"
        finally:
            os.close(fd)
    return None


def settled_jax_entry(folder, key, bound=2.0):
    """``jax_entry``, waiting up to ``bound`` seconds while it says "partial": the writer is
    finishing, or (a network filesystem) this node still sees the size it cached while the
    entry was written (FUSE keeps attributes for a second). Never raises."""
    deadline = time.monotonic() + bound
    state = jax_entry(folder, key)
    while state == "partial" and time.monotonic() < deadline:
        time.sleep(0.02)
        state = jax_entry(folder, key)
    return state


def _whole(fd, size):
    head = os.pread(fd, 18, 0)
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return _zstd_end(fd, head) == size
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        import zlib

        inflate = zlib.decompressobj()
        offset = 0
        while offset < size and not inflate.eof:
            chunk = os.pread(fd, 1 << 20, offset)
            if not chunk:
                return False
            offset += len(chunk)
            inflate.decompress(chunk, 1 << 16)
            while inflate.unconsumed_tail and not inflate.eof:
                inflate.decompress(inflate.unconsumed_tail, 1 << 16)
        return inflate.eof and offset == size and not inflate.unused_data
    return False


def _zstd_end(fd, head):
    """Where the zstd frame that starts the file ends (its size when whole), from its header
    and block headers; -1 where the header is cut short."""
    if len(head) < 6:
        return -1
    descriptor = head[4]
    single = descriptor >> 5 & 1
    offset = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3] \
        + ((1 if single else 0), 2, 4, 8)[descriptor >> 6]
    while True:
        block = os.pread(fd, 3, offset)
        if len(block) < 3:
            return -1
        header = int.from_bytes(block, "little")
        kind, length = header >> 1 & 3, header >> 3
        if kind == 3:
            raise ValueError("reserved zstd block type")
        offset += 3 + (1 if kind == 1 else length)
        if header & 1:
            return offset + (4 if descriptor >> 2 & 1 else 0)
