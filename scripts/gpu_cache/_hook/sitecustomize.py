"""gpu-cache's startup hook: per-process cache statistics, without touching user code.

gpu-cache puts this folder first on ``PYTHONPATH`` when ``stats_hook`` is on. In every
Python process it only installs an import watcher (a few microseconds). When the process
imports ``jax`` or ``triton``, it registers their cache listeners; at exit it writes one
JSON record into ``$GPU_CACHE_RECORDS``. On each cache hit it sets the entry's mtime to
now, which is gpu-cache's record of last use (file atimes are unreliable: noatime mounts).

Rules it keeps: standard library only; never breaks a job (any error is swallowed with one
warning line); does nothing without ``$GPU_CACHE_RECORDS``; and it runs the user's own
``sitecustomize`` (the next one on ``sys.path``) instead of shadowing it.
"""

import os
import sys

_RECORD_VERSION = 1
#: The modules whose caches this hook observes: a copy of gpu_cache.kinds.WATCHED_MODULES.
_WATCHED = ("jax", "triton")


class _Stats:
    def __init__(self):
        self.warned = False
        self.libraries = set()
        self.jax = {"requests": 0, "hits": 0, "writes": 0, "compile_seconds": 0.0,
                    "saved_seconds": 0.0, "hit_keys": [], "missed": [], "key_parts": {},
                    "key_context": {}}
        self.triton = {"hits": 0, "misses": 0, "compile_seconds": 0.0,
                       "hit_keys": [], "missed": []}

    def warn(self, what, exc):
        if not self.warned:
            self.warned = True
            sys.stderr.write(f"gpu-cache: warning: stats hook disabled part of itself ({what}: {exc!r})\n")


_STATS = _Stats()


def _touch(path):
    """Mark a cache entry as used now; a read-only cache just goes unmarked."""
    try:
        os.utime(path)
    except OSError:
        pass


def _on_jax(jax_module):
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
            if local.tee is not None:
                stats["key_parts"][key] = local.tee.parts
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
            stats["hit_keys"].append(cache_key)
            folder = os.environ.get("JAX_COMPILATION_CACHE_DIR")
            if folder:
                _touch(os.path.join(folder, f"{cache_key}-cache"))
        except Exception as exc:
            _STATS.warn("jax hit", exc)
        return original_hit(module_name, cache_key, *args, **kwargs)

    def on_miss(module_name, cache_key, *args, **kwargs):
        try:
            stats["missed"].append({"name": module_name, "key": cache_key})
        except Exception as exc:
            _STATS.warn("jax miss", exc)
        return original_miss(module_name, cache_key, *args, **kwargs)

    compiler.log_persistent_cache_hit = on_hit
    compiler.log_persistent_cache_miss = on_miss


def _on_triton(triton_module):
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
                    stats["hit_keys"].append(os.path.basename(folder))
                    _touch(folder)
            else:
                stats["misses"] += 1
                stats["missed"].append({"name": name, "key": os.path.basename(folder or "")})
                micros = getattr(times, "ir_initialization", 0) + getattr(times, "store_results", 0)
                micros += sum(d for _stage, d in getattr(times, "lowering_stages", []))
                stats["compile_seconds"] += micros / 1e6
        except Exception as exc:
            _STATS.warn("triton listener", exc)
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)

    knobs.compilation.listener = listener


_HANDLERS = {"jax": _on_jax, "triton": _on_triton}


class _ImportWatcher:
    """A meta-path finder that runs a handler right after a watched top-level import."""

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED or name in _STATS.libraries:
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
            _STATS.libraries.add(name)
            try:
                _HANDLERS[name](module)
            except Exception as exc:
                _STATS.warn(name, exc)

        loader.exec_module = exec_module
        return spec


#: Environment variables that change cache keys or where a cache is; kept in records.
#: A copy of gpu_cache.kinds.KEY_ENVIRONMENT (this hook may not import gpu_cache); a test
#: fails when the two drift apart.
_KEY_ENV = ("XLA_FLAGS", "JAX_ENABLE_X64", "CUDA_VISIBLE_DEVICES", "JAX_COMPILATION_CACHE_DIR",
            "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", "LIBTPU_INIT_ARGS", "TRITON_DEFAULT_FP_FUSION",
            "TRITON_DISABLE_LINE_INFO")


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
            with open(f"/proc/{pid}/cmdline", "rb") as stream:
                argv = stream.read().decode("utf-8", "replace").split("\0")
            with open(f"/proc/{pid}/stat", "rb") as stream:
                stat = stream.read().decode("utf-8", "replace")
        except OSError:
            break
        if "--target-jobs" in argv and any("snakemake" in a for a in argv[:3]):
            at = argv.index("--target-jobs") + 1
            if at < len(argv):
                rule, _, wildcards = argv[at].strip("'\"").partition(":")
                return rule or None, wildcards or None
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


def _write_record():
    if not _STATS.libraries:
        return
    try:
        import json
        import socket
        import time

        record = {"version": _RECORD_VERSION, "time": time.time(), "host": socket.gethostname(),
                  "pid": os.getpid(), "argv": sys.argv[:3], **_job_info(),
                  "libraries": sorted(_STATS.libraries)}
        if "jax" in _STATS.libraries:
            jax_stats = dict(_STATS.jax)
            jax_stats["misses"] = max(0, jax_stats["requests"] - jax_stats["hits"])
            record["jax"] = jax_stats
            context = jax_stats["key_context"]
            if context:
                record["device"] = {"platform": context.get("platform"),
                                    "kinds": context.get("device_kinds"),
                                    "count": context.get("device_count")}
        if "triton" in _STATS.libraries:
            record["triton"] = dict(_STATS.triton)
        folder = os.environ["GPU_CACHE_RECORDS"]
        os.makedirs(folder, exist_ok=True)
        name = f"{time.time_ns()}-{record['host']}-{record['pid']}.json"
        temp = os.path.join(folder, f".{name}.tmp")
        with open(temp, "w") as stream:
            json.dump(record, stream)
        os.replace(temp, os.path.join(folder, name))
    except Exception as exc:
        _STATS.warn("writing the record", exc)


def _run_user_sitecustomize():
    """Run the next ``sitecustomize`` on sys.path, so a user's own one still runs."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    search = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", search)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _install():
    if os.environ.get("GPU_CACHE_RECORDS"):
        import atexit

        sys.meta_path.insert(0, _ImportWatcher())
        atexit.register(_write_record)


try:
    _install()
except Exception as _exc:  # never break the interpreter's start
    _STATS.warn("install", _exc)
try:
    _run_user_sitecustomize()
except Exception as _exc:
    sys.stderr.write(f"gpu-cache: warning: your sitecustomize raised {_exc!r}\n")
