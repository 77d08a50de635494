"""gpu-cache's startup hook: per-process cache statistics, without touching user code.

gpu-cache puts this folder first on ``PYTHONPATH`` when ``stats_hook`` or ``single_flight``
is on. In every Python process it only installs an import watcher (a few microseconds). When
the process imports ``jax`` or ``triton``, it registers their cache listeners; at exit it
writes one JSON record into ``$GPU_CACHE_RECORDS``. On each cache hit it sets the entry's
mtime to now, which is gpu-cache's record of last use (file atimes are unreliable: noatime
mounts). With ``$GPU_CACHE_LOCKS`` set it also turns on single-flight (``gpu_cache_flight``
next to this file): JAX's persistent-cache read and write for one key are wrapped, and
Triton's cache manager becomes ``gpu_cache_triton_seed.FlightCacheManager``, so that of the
processes that miss one key at once only one compiles it.

Rules it keeps:

- standard library only, and nothing but the watcher in a process without jax or triton;
- never breaks a job: any error is swallowed with at most one warning line on stderr (none
  when stderr is closed), and the job's exit code and output stay as without the hook;
- records nothing without an absolute ``$GPU_CACHE_RECORDS``, and installs nothing without
  it or an absolute ``$GPU_CACHE_LOCKS``;
- one per process: several copies of this file on ``sys.path`` (two checkouts, or one reached
  through a symlink) act as one. The first copy that runs marks the process (an attribute of
  ``sys``); any later copy that still gets run does nothing; the copies, and older versions of
  the hook, are skipped when the next ``sitecustomize`` is looked for;
- it runs the user's own ``sitecustomize`` (the next one on ``sys.path`` that is not a copy
  of this hook) exactly once, instead of shadowing it, and reports its errors as Python does;
- records are small (at most ``_MAX_ITEMS`` names per list, the rest counted in ``dropped``)
  and written without following symlinks: a records folder that is a symlink is refused, and
  the record is created under a unique temporary name (``.<name>-<random>.json.tmp``, which
  prune removes when stale) with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then renamed.
"""

import os
import sys

#: Marks this file as gpu-cache's startup hook: a copy of it found later on ``sys.path`` is
#: recognised by this text (in its source or its bytecode) and never run. Keep it verbatim.
_HOOK_MARKER = "gpu-cache startup hook: one per process"
#: Names that every version of the hook before the marker has (source and bytecode): such an
#: older copy later on ``sys.path`` is skipped too.
_LEGACY_SIGNS = (b"_ImportWatcher", b"_run_user_sitecustomize", b"GPU_CACHE_RECORDS")
#: The attribute of ``sys`` that says that a copy of the hook already runs in this process.
_SYS_MARK = "_gpu_cache_startup_hook"

_RECORD_VERSION = 1
#: The modules whose caches this hook observes: a copy of gpu_cache.core.kinds.WATCHED_MODULES.
_WATCHED = ("jax", "triton")
#: At most this many entries in each list (and key_parts) of a record; the rest are counted.
_MAX_ITEMS = 1000
#: At most this many characters in each name, key or argument a record keeps.
_MAX_TEXT = 500


def _stderr(text):
    """Write to stderr when there is one; never raises."""
    try:
        stream = sys.stderr
        if stream is not None:
            stream.write(text)
            stream.flush()
    except Exception:
        pass


def _text(value, limit=_MAX_TEXT):
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


class _Stats:
    def __init__(self):
        self.warned = False
        self.folder = None  # the records folder; None: no records
        self.flight = False  # single-flight wanted ($GPU_CACHE_LOCKS)
        self.libraries = set()
        self.jax = {"requests": 0, "hits": 0, "writes": 0, "compile_seconds": 0.0,
                    "saved_seconds": 0.0, "hit_keys": [], "missed": [], "key_parts": {},
                    "key_context": {}, "dropped": {"hit_keys": 0, "missed": 0, "key_parts": 0}}
        self.triton = {"hits": 0, "misses": 0, "compile_seconds": 0.0,
                       "hit_keys": [], "missed": [], "dropped": {"hit_keys": 0, "missed": 0}}

    def warn(self, what, exc):
        """One warning line per process at most; never raises."""
        if self.warned:
            return
        self.warned = True
        try:
            detail = _text(repr(exc), 300)
        except Exception:
            detail = type(exc).__name__
        _stderr(f"gpu-cache: warning: stats hook disabled part of itself ({what}: {detail})\n")


_STATS = _Stats()


def _keep(stats, field, item):
    """Append to a record's list, up to _MAX_ITEMS; count what does not fit."""
    items = stats[field]
    if len(items) < _MAX_ITEMS:
        items.append(item)
    else:
        stats["dropped"][field] += 1


def _touch(path):
    """Mark a cache entry as used now (never through a symlink); a read-only cache just goes
    unmarked."""
    try:
        os.utime(path, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass


def _on_jax(jax_module):
    if _STATS.flight:
        try:
            _flight_jax()
        except Exception as exc:  # the job runs as without single-flight
            _flight_off("jax", f"not installed: {exc!r}"[:300])
            _STATS.warn("jax single-flight", exc)
    if _STATS.folder:
        _jax_listeners()


def _jax_listeners():
    from jax import monitoring

    stats = _STATS.jax
    counters = {
        "/jax/compilation_cache/compile_requests_use_cache": "requests",
        "/jax/compilation_cache/cache_hits": "hits",
        "/jax/compilation_cache/cache_misses": "writes",  # counts write attempts, not misses
    }
    durations = {
        "/jax/core/compile/backend_compile_duration": "compile_seconds",
        "/jax/compilation_cache/compile_time_saved_sec": "saved_seconds",
    }

    def on_event(event, **_kwargs):
        name = counters.get(event)
        if name:
            stats[name] += 1

    def on_duration(event, duration_secs, **_kwargs):
        name = durations.get(event)
        if name:
            stats[name] += float(duration_secs)

    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
    _wrap_jax_cache_logging()
    try:
        _wrap_jax_cache_key()
    except Exception as exc:  # private module: explain loses its input, nothing else
        _STATS.warn("jax cache key parts", exc)


#: Characters of each key component's sha256 kept in records (64 bits: plenty to compare).
_PART_CHARS = 16


def _wrap_jax_cache_key():
    """Record a hash of each part of every JAX cache key, for ``gpu-cache doctor --explain``.

    ``jax._src.cache_key.get`` hashes the key's parts (computation, jaxlib version, backend
    version, XLA flags, compile options, accelerator config, compression, custom hook) into
    one sha256, calling ``_log_cache_key_hash(hash_obj, part_name, ...)`` after each part.
    A tee hasher given to ``get`` also hashes each part on its own, so nothing is hashed twice.
    """
    import hashlib
    import threading

    from jax._src import cache_key

    original_get = cache_key.get
    original_log = cache_key._log_cache_key_hash
    local = threading.local()
    stats = _STATS.jax

    class _Tee:
        def __init__(self, *args):
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
            self._part = hashlib.sha256()

    class _Hashlib:
        """``hashlib`` for cache_key.py, whose ``sha256()`` in ``get`` is a tee."""

        def __getattr__(self, name):
            return getattr(hashlib, name)

        def sha256(self, *args):
            if getattr(local, "in_get", False) and getattr(local, "tee", None) is None:
                local.tee = _Tee(*args)
                return local.tee
            return hashlib.sha256(*args)

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
            _STATS.warn("jax cache key parts", exc)
            key = original_get(module, devices, compile_options, backend, *args, **kwargs)
        finally:
            local.in_get = False
        try:
            parts = stats["key_parts"]
            if local.tee is not None:
                name = _text(key)
                if name in parts or len(parts) < _MAX_ITEMS:
                    parts[name] = local.tee.parts
                else:
                    stats["dropped"]["key_parts"] += 1
            context = stats["key_context"]
            if not context:
                flat = list(getattr(devices, "flat", devices))
                context.update({
                    "platform": str(getattr(backend, "platform", "?")),
                    "platform_version": str(getattr(backend, "platform_version", "?")),
                    "device_count": len(flat),
                    "device_kinds": sorted({str(getattr(d, "device_kind", "?")) for d in flat}),
                    "compression": str(kwargs.get("compression_algorithm", args[0] if args else "?")),
                    "jaxlib": str(getattr(cache_key, "jaxlib_version_str", "?")),
                })
        except Exception as exc:
            _STATS.warn("jax cache key parts", exc)
        local.tee = None
        return key

    cache_key.hashlib = _Hashlib()
    cache_key._log_cache_key_hash = log_part
    cache_key.get = get


def _wrap_jax_cache_logging():
    """Learn the name and key of each hit and miss from jax's own log calls."""
    try:
        from jax._src import compiler
    except Exception as exc:  # private module: names are a bonus, counts still work
        _STATS.warn("jax cache keys", exc)
        return
    stats = _STATS.jax
    original_hit = getattr(compiler, "log_persistent_cache_hit", None)
    original_miss = getattr(compiler, "log_persistent_cache_miss", None)
    if original_hit is None or original_miss is None:
        return

    def on_hit(module_name, cache_key, *args, **kwargs):
        try:
            _keep(stats, "hit_keys", _text(cache_key))
            folder = _jax_cache_dir() or os.environ.get("JAX_COMPILATION_CACHE_DIR")
            if folder:
                path = os.path.join(folder, f"{cache_key}-cache")
                # older jax (0.4.30) names the entry by its key alone
                _touch(path if os.path.lexists(path) else os.path.join(folder, cache_key))
        except Exception as exc:
            _STATS.warn("jax hit", exc)
        return original_hit(module_name, cache_key, *args, **kwargs)

    def on_miss(module_name, cache_key, *args, **kwargs):
        try:
            _keep(stats, "missed", {"name": _text(module_name), "key": _text(cache_key)})
        except Exception as exc:
            _STATS.warn("jax miss", exc)
        return original_miss(module_name, cache_key, *args, **kwargs)

    compiler.log_persistent_cache_hit = on_hit
    compiler.log_persistent_cache_miss = on_miss


def _on_triton(triton_module):
    if _STATS.flight:
        try:
            _flight_triton(triton_module)
        except Exception as exc:
            _flight_off("triton", f"not installed: {exc!r}"[:300])
            _STATS.warn("triton single-flight", exc)
    if _STATS.folder:
        _triton_listener(triton_module)


def _triton_listener(triton_module):
    knobs = triton_module.knobs
    stats = _STATS.triton
    previous = knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        try:
            folder = None
            for path in (metadata_group or {}).values():
                folder = os.path.dirname(path)
                break
            name = getattr(src, "name", None) or str(metadata.get("name", "?"))
            if cache_hit:
                stats["hits"] += 1
                if folder:
                    _keep(stats, "hit_keys", _text(os.path.basename(folder)))
                    _touch(folder)
            else:
                stats["misses"] += 1
                _keep(stats, "missed", {"name": _text(name), "key": _text(os.path.basename(folder or ""))})
                micros = getattr(times, "ir_initialization", 0) + getattr(times, "store_results", 0)
                micros += sum(d for _stage, d in getattr(times, "lowering_stages", []))
                stats["compile_seconds"] += micros / 1e6
        except Exception as exc:
            _STATS.warn("triton listener", exc)
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)

    knobs.compilation.listener = listener


def _flight():
    """gpu-cache's single-flight module (next to this file), told how this hook warns."""
    import gpu_cache_flight

    gpu_cache_flight.configure(_STATS.warn)
    return gpu_cache_flight


def _flight_off(kind, why):
    try:
        _flight().disable(kind, why)
    except Exception:
        pass


def _flight_stats(kind):
    """What single-flight did for ``kind``, for the record."""
    if not _STATS.flight:
        return {"state": "off: GPU_CACHE_LOCKS is not set"}
    try:
        return _flight().stats(kind)
    except Exception as exc:
        return {"state": _text(f"off: {exc!r}", 300)}


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


def _flight_jax():
    """Single-flight around JAX's persistent cache, one key at a time.

    ``compile_or_get_cached`` reads the cache with ``_cache_read`` (a miss: ``(None, None)``),
    compiles, and writes with ``_cache_write``. On a miss the wrapped read takes the key's lock
    (``gpu_cache_flight.lead``) and reads again under it: a hit is returned as JAX's own hit,
    a miss leaves this process the key's leader. ``_cache_write`` releases the lock once the
    entry is written (or was not: waiters then compile side by side), and a ``finally`` around
    ``compile_or_get_cached`` releases whatever this call still holds (a failed compile).
    Computations of several processes of one ``jax.distributed`` run are left alone: JAX shares
    those between the processes itself, and only process 0 writes them.
    """
    import threading

    flight = _flight()
    from jax._src import compiler

    why = _jax_flight_mismatch(compiler)
    try:
        from jax._src import distributed

        state = distributed.global_state
    except Exception as exc:
        why = why or f"no jax._src.distributed.global_state ({exc!r})"
    if why:
        flight.disable("jax", why)
        return
    original_read = compiler._cache_read
    original_write = compiler._cache_write
    original_compile = compiler.compile_or_get_cached
    local = threading.local()

    def held():
        mine = getattr(local, "held", None)
        if mine is None:
            mine = local.held = {}
        return mine

    def folder():
        return _jax_cache_dir() or os.environ.get("JAX_COMPILATION_CACHE_DIR") or ""

    def cache_read(module_name, cache_key, *args, **kwargs):
        # JAX writes entries in place: one being written now (here or on another node) is a
        # miss, never read half (a warning and a second compile), and waited for below.
        writing = flight.enabled("jax") and flight.jax_entry(folder(), cache_key) == "partial"
        result = (None, None) if writing else original_read(module_name, cache_key, *args, **kwargs)
        if result[0] is not None or not flight.enabled("jax") \
                or getattr(state, "client", None) is not None:
            return result
        raised = []

        def read():
            if flight.settled_jax_entry(folder(), cache_key) == "partial":
                return None
            try:
                again = original_read(module_name, cache_key, *args, **kwargs)
            except BaseException as exc:  # jax told to raise cache errors: as without the hook
                raised.append(exc)
                raise
            return again if again[0] is not None else None

        def peek():
            return read() if flight.jax_entry(folder(), cache_key) == "whole" else None

        try:
            found, lock = flight.lead("jax", cache_key, folder(), read, peek)
        except Exception as exc:
            if raised:
                raise
            _STATS.warn("jax single-flight", exc)
            return result
        if found is not None:
            return found
        if lock is not None:
            held()[cache_key] = lock
        return result

    def cache_write(cache_key, *args, **kwargs):
        try:
            return original_write(cache_key, *args, **kwargs)
        finally:
            lock = held().pop(cache_key, None)
            if lock is not None:
                lock.release(wrote=_jax_entry_written(folder(), cache_key))

    def compile_or_get_cached(*args, **kwargs):
        before = set(held())
        try:
            return original_compile(*args, **kwargs)
        finally:
            mine = held()
            for key in [key for key in mine if key not in before]:
                mine.pop(key).release(wrote=False)

    compiler._cache_read = cache_read
    compiler._cache_write = cache_write
    compiler.compile_or_get_cached = compile_or_get_cached


def _jax_entry_written(folder, cache_key):
    """Whether JAX's cache folder holds the entry now (``<key>-cache``; the key alone on jax
    0.4.30). Never raises."""
    try:
        return bool(folder) and (os.path.exists(os.path.join(folder, f"{cache_key}-cache"))
                                 or os.path.exists(os.path.join(folder, cache_key)))
    except Exception:
        return False


#: The Triton cache manager (next to this file) gpu-cache exports for a read-only cache root;
#: it does single-flight too.
_SEED_MODULE = "gpu_cache_triton_seed"


def _flight_triton(triton_module):
    """Make Triton's cache manager gpu-cache's single-flight one, in this process only (the
    knob, not ``TRITON_CACHE_MANAGER``: a child without this folder on its path would fail
    to import it). A manager you named stays, and single-flight is off for Triton then."""
    flight = _flight()
    cache_knobs = getattr(getattr(triton_module, "knobs", None), "cache", None)
    if cache_knobs is None or not any("manager_class" in vars(k) for k in type(cache_knobs).__mro__):
        flight.disable("triton", "this triton has no triton.knobs.cache.manager_class (< 3.4)")
        return
    theirs = os.environ.get("TRITON_CACHE_MANAGER")
    if theirs:
        if theirs.split(":", 1)[0] != _SEED_MODULE:
            flight.disable("triton", _text(f"TRITON_CACHE_MANAGER={theirs} is your own", 300))
        return  # gpu-cache's seed manager: single-flight is in it
    import gpu_cache_triton_seed

    cache_knobs.manager_class = gpu_cache_triton_seed.FlightCacheManager


_HANDLERS = {"jax": _on_jax, "triton": _on_triton}


class _Watcher:
    """A meta-path finder that runs a handler right after a watched top-level import.

    Its ``find_spec`` asks the other finders for the spec. It never raises (an error means
    "not mine": the import goes on as without the hook) and is re-entrancy-safe: asked again
    by the same thread while it asks (another watcher that asks every finder, e.g. an older
    copy of this hook), it answers None, so two watchers never call each other forever.
    """

    def __init__(self):
        import _thread

        self._ident = _thread.get_ident
        self._busy = set()

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED:
            return None
        me = self._ident()
        if me in self._busy:
            return None
        self._busy.add(me)
        try:
            return self._find_spec(name, path, target)
        except Exception as exc:
            _STATS.warn("import watcher", exc)
            return None
        finally:
            self._busy.discard(me)

    def _find_spec(self, name, path, target):
        if name in _STATS.libraries:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            if name in _STATS.libraries:  # reloaded: the listeners are there already
                return
            _STATS.libraries.add(name)
            try:
                _HANDLERS[name](module)
            except Exception as exc:
                _STATS.warn(name, exc)

        loader.exec_module = exec_module
        return spec


#: Environment variables that change cache keys or where a cache is; kept in records.
#: A copy of gpu_cache.core.kinds.KEY_ENVIRONMENT (this hook may not import gpu_cache); a test
#: fails when the two drift apart.
_KEY_ENV = ("XLA_FLAGS", "JAX_ENABLE_X64", "CUDA_VISIBLE_DEVICES", "JAX_COMPILATION_CACHE_DIR",
            "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", "LIBTPU_INIT_ARGS", "TRITON_DEFAULT_FP_FUSION",
            "TRITON_DISABLE_LINE_INFO")


def _read_small(path, limit=1 << 20):
    """At most ``limit`` bytes of a regular file (or a /proc file); never blocks on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _snakemake_target(max_depth=12):
    """``(rule, wildcards)`` from the nearest ancestor ``snakemake ... --target-jobs R:W``.

    Snakemake gives a job's environment no rule name. But every job it runs in a process
    of its own (a SLURM job: the job script's and srun's ``python -m snakemake``; any
    remote executor) is run by a snakemake started with ``--target-jobs 'rule:wc=value'``.
    Local shell jobs of the main process have no such ancestor: ``(None, None)``.
    """
    pid = os.getppid()
    for _ in range(max_depth):
        if pid <= 1:
            break
        try:
            argv = _read_small(f"/proc/{pid}/cmdline").decode("utf-8", "replace").split("\0")
            stat = _read_small(f"/proc/{pid}/stat", 1 << 16).decode("utf-8", "replace")
        except OSError:
            break
        if "--target-jobs" in argv and any("snakemake" in a for a in argv[:3]):
            at = argv.index("--target-jobs") + 1
            if at < len(argv):
                rule, _, wildcards = argv[at].strip("'\"").partition(":")
                return _text(rule) or None, _text(wildcards) or None
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None, None


def _job_info():
    env = os.environ
    rule, wildcards = env.get("GPU_CACHE_RULE"), env.get("GPU_CACHE_WILDCARDS")
    if not rule:
        try:
            rule, wildcards = _snakemake_target()
        except Exception as exc:  # /proc missing or odd: the record just has no rule
            _STATS.warn("finding the snakemake job", exc)
    return {
        "gpu_type": env.get("GPU_CACHE_GPU_TYPE"),
        "rule": rule,
        "wildcards": wildcards,
        "slurm_job_id": env.get("SLURM_JOB_ID"),
        "run_id": env.get("GPU_CACHE_RUN_ID"),
        "env": {name: env.get(name) for name in _KEY_ENV},
    }


def _jax_cache_dir():
    """The cache folder this process's JAX really used: a program may set its own with
    ``jax.config.update("jax_compilation_cache_dir", ...)`` over the exported one."""
    try:
        folder = sys.modules["jax"].config.jax_compilation_cache_dir
    except Exception:
        return None
    return _text(str(folder)) if folder else None


def _record(time, socket):
    argv = getattr(sys, "argv", None)  # an embedded interpreter may have none
    record = {"version": _RECORD_VERSION, "time": time.time(), "host": socket.gethostname(),
              "pid": os.getpid(),
              "argv": [_text(a) for a in argv[:3]] if isinstance(argv, (list, tuple)) else [],
              **_job_info(), "libraries": sorted(_STATS.libraries)}
    if "jax" in _STATS.libraries:
        jax_stats = dict(_STATS.jax)
        jax_stats["misses"] = max(0, jax_stats["requests"] - jax_stats["hits"])
        jax_stats["cache_dir"] = _jax_cache_dir()
        jax_stats["single_flight"] = _flight_stats("jax")
        record["jax"] = jax_stats
        context = jax_stats["key_context"]
        if context:
            record["device"] = {"platform": context.get("platform"),
                                "kinds": context.get("device_kinds"),
                                "count": context.get("device_count")}
    if "triton" in _STATS.libraries:
        record["triton"] = dict(_STATS.triton)
        record["triton"]["single_flight"] = _flight_stats("triton")
    record["software"] = _software()
    return record


#: Variables that name the container image a process runs in; a copy of
#: gpu_cache.core.software.IMAGE_VARIABLES (this hook may not import gpu_cache).
_IMAGE_VARS = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")
#: Distributions whose versions decide whether a cache serves this process: a copy of
#: gpu_cache.core.software.KEY_PACKAGES.
_KEY_PACKAGES = ("jax", "jaxlib", "triton", "torch", "zstandard")


def _software():
    """This process's software, as gpu_cache.core.software.identity() names it (the record of a
    job is compared with the software that warmed its GPU type's cache)."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version(), "executable": _text(sys.executable)}
    for name in _KEY_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except Exception:
            out[name] = None
    out["image"] = next((os.environ[v] for v in _IMAGE_VARS if os.environ.get(v)), None)
    out["conda_env"] = os.environ.get("CONDA_PREFIX") or None
    return out


def _save(folder, name, data):
    """Write ``data`` as ``folder/name`` through a unique temporary file and a rename, never
    following a symlink: the folder itself must not be one (whoever could swap it for a link
    would send records outside the cache root), and the temporary file is created new."""
    import errno
    import stat

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        folder_fd = os.open(folder, flags)
    except OSError as exc:  # ELOOP or ENOTDIR for a symlink, as the kernel decides
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(os.lstat(folder).st_mode):
            raise OSError(exc.errno, "the records folder is a symbolic link: refused", folder) from None
        raise
    try:
        temp = f".{name[:-len('.json')]}-{os.urandom(6).hex()}.json.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o666, dir_fd=folder_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    if written <= 0:
                        raise OSError(errno.EIO, "short write", temp)
                    view = view[written:]
            finally:
                os.close(fd)
            os.replace(temp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=folder_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(folder_fd)


def _write_record():
    """At exit: one record for a process that imported jax or triton. Never raises."""
    try:
        if not _STATS.libraries:
            return
        import json
        import socket
        import time

        folder = _STATS.folder
        if not os.path.isabs(folder):
            raise ValueError(f"GPU_CACHE_RECORDS is not an absolute path: {folder!r}")
        record = _record(time, socket)
        host = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(record["host"]))[:100]
        name = f"{time.time_ns()}-{host}-{record['pid']}.json"
        data = json.dumps(record, default=str).encode("utf-8", "replace")
        os.makedirs(folder, exist_ok=True)
        _save(folder, name, data)
    except Exception as exc:
        _STATS.warn("writing the record", exc)


def _is_hook_copy(path):
    """Whether the file at ``path`` is a copy of this hook, of this version or an older one."""
    try:
        data = _read_small(path)
    except OSError:
        return False
    return _HOOK_MARKER.encode() in data or all(sign in data for sign in _LEGACY_SIGNS)


def _file_id(path):
    try:
        info = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return (info.st_dev, info.st_ino)


def _run_user_sitecustomize(here):
    """Run the next ``sitecustomize`` on sys.path that is not a copy of this hook (this file
    through another path, another checkout's, an older version's), so a user's own one still
    runs, once. Its errors are reported as Python's ``site`` reports them without the hook."""
    # importlib.machinery.PathFinder and importlib.util.module_from_spec, as loaded at start
    # (importing importlib.util would cost more than everything else the hook does).
    bootstrap = sys.modules.get("_frozen_importlib")
    external = sys.modules.get("_frozen_importlib_external")
    path_finder = getattr(external, "PathFinder", None)
    module_from_spec = getattr(bootstrap, "module_from_spec", None)
    if path_finder is None or module_from_spec is None:
        import importlib.machinery
        import importlib.util

        path_finder, module_from_spec = importlib.machinery.PathFinder, importlib.util.module_from_spec
    seen = {_file_id(here)} if here else set()
    for entry in list(sys.path):
        try:
            spec = path_finder.find_spec("sitecustomize", [entry])
        except Exception:
            continue
        if spec is None or spec.loader is None:
            continue
        if spec.origin and spec.has_location:
            found = _file_id(spec.origin)
            if found in seen:
                continue
            seen.add(found)
            if _is_hook_copy(spec.origin):
                continue
        module = module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            if isinstance(exc, ImportError) and exc.name == "sitecustomize":
                return
            if sys.flags.verbose:
                sys.excepthook(*sys.exc_info())
            else:
                _stderr("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                        f"{exc.__class__.__name__}: {exc}\n")
        return


def _usable_triton_folder():
    """Point Triton at a node-local folder when the exported one cannot be created: Triton
    creates it at start and raises in a read-only container image where the cache root is
    not bound. Costs one stat where the folder exists."""
    folder = os.environ.get("TRITON_CACHE_DIR")
    if not folder or os.path.isdir(folder):
        return
    try:
        os.makedirs(folder, exist_ok=True)
        return
    except OSError as exc:
        why = exc
    import tempfile

    local = os.path.join(tempfile.gettempdir(), f"gpu-cache-{os.getuid()}", "triton")
    os.environ["TRITON_CACHE_DIR"] = local
    _stderr(f"gpu-cache: warning: Triton's cache folder {_text(folder)} cannot be created "
            f"({why.strerror}); this process uses {local}. Is the cache root bound into the "
            "container?\n")


def _bytecode_folder():
    """With gpu-cache's bytecode cache on (``$GPU_CACHE_BYTECODE``), write and read this
    process's bytecode in a folder of this interpreter and image alone: Python trusts a .pyc
    whose source has the same mtime and size, which two images with normalised mtimes share.
    Overrides the image's PYTHONDONTWRITEBYTECODE for the imports that follow."""
    folder = os.environ.get("GPU_CACHE_BYTECODE")
    if not folder or not os.path.isabs(folder):
        return
    import zlib

    image = next((os.environ[v] for v in _IMAGE_VARS if os.environ.get(v)), "")
    identity = "\0".join([os.path.realpath(sys.executable or ""), sys.version, image])
    tag = f"{sys.implementation.cache_tag}-{zlib.crc32(identity.encode('utf-8', 'replace')):08x}"
    sys.pycache_prefix = os.path.join(folder, tag)
    sys.dont_write_bytecode = False


def _install():
    _usable_triton_folder()
    _bytecode_folder()
    folder = os.environ.get("GPU_CACHE_RECORDS") or None
    locks = os.environ.get("GPU_CACHE_LOCKS")
    _STATS.flight = bool(locks) and os.path.isabs(locks)
    # An older copy of this hook (before the marker) that ran first watches and records
    # already: a second watcher would only write a second record.
    if folder and any(type(finder).__name__ == "_ImportWatcher" for finder in sys.meta_path):
        folder = None
    if not folder and not _STATS.flight:
        return
    _STATS.folder = folder
    sys.meta_path.insert(0, _Watcher())
    if folder:
        import atexit

        atexit.register(_write_record)


def _main():
    if getattr(sys, _SYS_MARK, None) is not None:
        return  # another copy of this hook runs in this process, and ran the user's one
    here = globals().get("__file__")
    try:
        setattr(sys, _SYS_MARK, {"file": here, "marker": _HOOK_MARKER})
        _install()
    except Exception as exc:  # never break the interpreter's start
        _STATS.warn("install", exc)
    try:
        _run_user_sitecustomize(here)
    except Exception as exc:  # the hook's own fault: the user's errors are reported inside
        _STATS.warn("finding your sitecustomize", exc)


_main()
