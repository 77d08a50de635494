# gpu-cache hook piece
# watches torch._inductor torch._inductor.codecache torch._inductor.compile_fx
# watches torch._functorch._aot_autograd.autograd_cache
# node-local TORCHINDUCTOR_CACHE_DIR
# tier files
# software torch
"""gpu-cache's startup hook, the Inductor piece (issue 31): loaded when the process imports
``torch._inductor`` (with the node-local tier: Inductor's shared files copied in, issue 23),
and called again when it imports ``torch._inductor.codecache``,
``torch._functorch._aot_autograd.autograd_cache`` and ``torch._inductor.compile_fx``; does
nothing in Inductor's compile workers, nor in a process that imports torch without compiling.

- The record's ``inductor`` part: FX graph and AOTAutograd hits, misses and bypasses (torch's
  own counters, read at exit), the graphs that missed (``missed``: a name such as ``backward
  graph 0/1`` and the FX graph key), the keys that hit, the compile time the hits saved (as
  Inductor stored it with each graph), and the parts of every FX graph key this process
  computed, from Inductor's own debug lines (``key_context``: the parts of the first key, each
  ``[hash, value]``, the value where it is short text; ``key_parts``: per key, the parts that
  differ from it; ``key_names``: per key, the graph's name), for ``gpu-cache doctor --explain``.
- Single-flight for Inductor's AOTAutograd and FX graph caches (``kinds.inductor.flight``).

A torch whose functions lack the parameters in :data:`API` (checked with
``inspect.signature``; torch 2.11.0 and 2.13.0 have them) is left untouched: the record's
``state`` says what did not fit, and torch's counters still give the counts. Standard library
only, Python 3.9+.
"""

import os
import sys
import threading
import time

from ... import common
from ...common import MAX_ITEMS, keep, text

KIND = "inductor"
#: The package whose import copies Inductor's shared files into the node-local tier (issue 23).
PACKAGE = "torch._inductor"
CODECACHE = "torch._inductor.codecache"
AUTOGRAD_CACHE = "torch._functorch._aot_autograd.autograd_cache"
COMPILE_FX = "torch._inductor.compile_fx"
#: What the piece wraps in each module, with the leading parameters each must have.
API = {
    CODECACHE: {
        "FxGraphCache.prepare_key": ("gm", "example_inputs", "fx_kwargs", "inputs_to_check", "remote"),
        "FxGraphCache.load_with_key": ("key", "debug_lines", "example_inputs", "local", "remote_cache",
                                       "is_backward", "constants"),
        "FxGraphCache._lookup_graph": ("key", "example_inputs", "local", "remote_cache", "constants"),
        "FxGraphCache._save_graph": ("key", "compiled_graph", "example_inputs", "local", "remote_cache"),
        "FxGraphCache._get_tmp_dir_for_key": ("key",),
    },
    AUTOGRAD_CACHE: {
        "AOTAutogradCache._lookup": ("key", "local", "remote", "args", "cache_info", "aot_config"),
        "AOTAutogradCache.save": ("key", "entry", "remote"),
        "AOTAutogradCache._get_tmp_dir_for_key": ("_key",),
    },
    COMPILE_FX: {
        "_compile_fx_inner": ("gm", "example_inputs"),
        "compile_fx": ("model_", "example_inputs_"),
    },
}
#: torch's counters that the record keeps: (counter group, name) -> the record's field.
COUNTERS = {
    ("inductor", "fxgraph_cache_hit"): ("fxgraph", "hits"),
    ("inductor", "fxgraph_cache_miss"): ("fxgraph", "misses"),
    ("inductor", "fxgraph_cache_bypass"): ("fxgraph", "bypassed"),
    ("aot_autograd", "autograd_cache_hit"): ("aotautograd", "hits"),
    ("aot_autograd", "autograd_cache_miss"): ("aotautograd", "misses"),
    ("aot_autograd", "autograd_cache_bypass"): ("aotautograd", "bypassed"),
    ("aot_autograd", "autograd_cache_guard_miss"): ("aotautograd", "guard_misses"),
    ("aot_autograd", "autograd_cache_saved"): ("aotautograd", "saved"),
}
#: Characters kept of each key part's hash, and of its value (a longer value or one that is
#: not printable text, such as the graph's code, keeps its hash alone).
PART_HASH = 12
PART_VALUE = 400

_STATE = {"flight": None}  # and "modules": those of API imported so far
_MUTEX = threading.Lock()


def part(hook):
    """The record's ``inductor`` part of this process, made on first use (the tier's copy-in
    may have made an empty one already)."""
    found = hook.parts.setdefault(KIND, {})
    if "missed" not in found:
        found.update({"state": "not installed: no compile", "compile_seconds": 0.0, "hook_seconds": 0.0,
                      "saved_seconds": 0.0, "hit_keys": [], "missed": [], "key_context": {},
                      "key_parts": {}, "key_names": {},
                      "dropped": {"hit_keys": 0, "missed": 0, "key_parts": 0}})
    return found


def mismatch(module, names):
    """Why ``module`` does not fit the piece (its wrapped functions and their leading
    parameters), or None."""
    import inspect

    for dotted, params in API[module.__name__].items():
        owner, _, name = dotted.rpartition(".")
        holder = getattr(module, owner, None) if owner else module
        func = getattr(holder, name, None)
        if not callable(func):
            return f"{module.__name__}.{dotted} is missing"
        try:
            found = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError) as exc:
            return f"{module.__name__}.{dotted}: no signature ({exc})"
        if found[:len(params)] != params:
            return f"{module.__name__}.{dotted}{found[:len(params)]} is not {name}{params}"
        names.append(dotted)
    return None


def on_import(module, hook):
    """Run right after ``torch._inductor`` (the tier's copy-in) or one of the three modules is
    imported; once all three are (Dynamo's backend imports the last one before its first
    compile), check them all, then wrap all of them or none."""
    if hook.compile_worker():
        return
    if module.__name__ == PACKAGE:
        tier = common.tier(hook)
        if tier is not None:
            hook.parts.setdefault(KIND, {})
            tier.fetch_tree(KIND)
        return
    hook.observed(KIND)
    stats = part(hook)
    with _MUTEX:
        _STATE.setdefault("modules", {})[module.__name__] = module
        modules = dict(_STATE["modules"])
    if set(modules) != set(API):
        return
    why = next((w for w in (mismatch(m, []) for m in modules.values()) if w), None)
    if why:
        stats["state"] = text(f"off: torch {_torch_version()} is not one the hook knows ({why})", 300)
        if hook.flight:
            common.flight_off(hook, KIND, stats["state"][len("off: "):])
        return
    flight = _flight(hook)
    stats["state"] = "on"
    _wrap_fx_cache(modules[CODECACHE].FxGraphCache, hook, stats, flight)
    _wrap_aot_cache(modules[AUTOGRAD_CACHE].AOTAutogradCache, hook, stats, flight)
    _wrap_compile(modules[COMPILE_FX], hook, stats, flight)


def _flight(hook):
    """The process's single-flight and tier state (``kinds.inductor.flight``), made once."""
    with _MUTEX:
        if _STATE["flight"] is None:
            tier = common.tier(hook)
            flight = common.flight(hook) if hook.flight else None
            from .flight import Flight

            _STATE["flight"] = Flight(hook, flight, tier)
        return _STATE["flight"]


def _torch_version():
    return text(str(getattr(sys.modules.get("torch"), "__version__", "?")), 40)


def _compile_id():
    """Dynamo's id of the frame being compiled (``0/1``: frame 0, its second compile)."""
    try:
        found = sys.modules["torch._guards"].CompileContext.current_compile_id()
    except Exception:
        return "?"
    return text(str(found), 40) if found is not None else "?"


# --- the FX graph cache ------------------------------------------------------------------

def _named(func):
    """``named(args, kwargs)``: the arguments of a call of ``func`` by parameter name (torch
    calls these functions with keywords too)."""
    import inspect

    signature = inspect.signature(func)

    def named(args, kwargs):
        try:
            return signature.bind_partial(*args, **kwargs).arguments
        except TypeError:  # a call the signature does not take: torch raises it itself
            return {}

    return named


def _wrap_fx_cache(cache, hook, stats, flight):
    """Wrap ``FxGraphCache``: key parts from ``prepare_key``, misses from ``load_with_key``,
    hits (and single-flight on a miss, only inside ``load_with_key``) in ``_lookup_graph``, the
    release of a held key after ``_save_graph``."""
    original_prepare = cache.prepare_key
    original_load = cache.load_with_key
    original_lookup = cache._lookup_graph
    original_save = cache._save_graph
    of_prepare, of_load = _named(original_prepare), _named(original_load)
    of_lookup, of_save = _named(original_lookup), _named(original_save)
    names = {}  # key -> what kind of graph it is, from prepare_key's fx_kwargs
    state = threading.local()

    def prepare_key(*args, **kwargs):
        result = original_prepare(*args, **kwargs)
        began = time.perf_counter()
        try:
            if result[0] is not None and hook.folder:
                key, lines = result[0]
                fx_kwargs = of_prepare(args, kwargs).get("fx_kwargs") or {}
                kind = "inference" if fx_kwargs.get("is_inference") else \
                    "backward" if fx_kwargs.get("is_backward") else "forward"
                names[key] = f"{kind} graph {_compile_id()}"
                _keep_parts(stats, key, names[key], lines)
        except Exception as exc:
            hook.warn("inductor key parts", exc)
        stats["hook_seconds"] += time.perf_counter() - began
        return result

    def load_with_key(*args, **kwargs):
        given = of_load(args, kwargs)
        key = given.get("key")
        state.loading = key
        try:
            result = original_load(*args, **kwargs)
        finally:
            state.loading = None
        if result[0] is None and hook.folder:
            try:
                kind = "backward" if given.get("is_backward") else "forward"
                name = names.pop(key, None) or f"{kind} graph {_compile_id()}"
                keep(stats, "missed", {"name": text(name), "key": text(key)})
            except Exception as exc:
                hook.warn("inductor miss", exc)
        return result

    def lookup_graph(*args, **kwargs):
        def read():
            again = original_lookup(*args, **kwargs)
            return again if again[0] is not None else None

        given = of_lookup(args, kwargs)
        key = given.get("key")
        result = original_lookup(*args, **kwargs)
        if result[0] is None and key and given.get("local") and getattr(state, "loading", None) == key:
            found = flight.lead(key, _folder_of(cache, key, hook), 3, read)
            result = found if found is not None else result
        if result[0] is not None and hook.folder:
            try:
                _hit(stats, key, result[0])
            except Exception as exc:
                hook.warn("inductor hit", exc)
        return result

    def save_graph(*args, **kwargs):
        key = of_save(args, kwargs).get("key")
        try:
            return original_save(*args, **kwargs)
        finally:
            flight.saved(key, _folder_of(cache, key, hook), 3)

    cache.prepare_key = staticmethod(prepare_key)
    cache.load_with_key = staticmethod(load_with_key)
    cache._lookup_graph = staticmethod(lookup_graph)
    cache._save_graph = staticmethod(save_graph)


def _folder_of(cache, key, hook):
    """Where Inductor keeps ``key``'s entries (None: it cannot say; the key goes without
    single-flight)."""
    try:
        return cache._get_tmp_dir_for_key(key) if key else None
    except Exception as exc:
        hook.warn("inductor cache folder", exc)
        return None


def _hit(stats, key, graph):
    keep(stats, "hit_keys", text(key))
    taken = getattr(graph, "_time_taken_ns", None)
    if isinstance(taken, (int, float)) and taken > 0:
        stats["saved_seconds"] += taken / 1e9


def _parse(lines):
    """``{part: [hash, value or None]}`` from Inductor's key debug lines
    (``[<hash>] <part>: <value>``)."""
    parts = {}
    for line in lines:
        if not isinstance(line, str) or not line.startswith("["):
            continue
        end = line.find("] ")
        if end < 0:
            continue
        name, _, value = line[end + 2:].partition(": ")
        short = value if len(value) <= PART_VALUE and value.isprintable() else None
        parts[text(name, 200)] = [line[1:end][:PART_HASH], short]
    return parts


def _keep_parts(stats, key, name, lines):
    """Keep the parts of FX graph key ``key`` (of the graph ``name``): the first key's all of
    them (the context), each later key's those that differ from the context (None: the part
    is absent from the key)."""
    parts = _parse(lines)
    context = stats["key_context"]
    if not context:
        context.update(parts)
    own = {name: value for name, value in parts.items() if context.get(name) != value}
    own.update({name: None for name in context if name not in parts})
    found = stats["key_parts"]
    if key in found or len(found) < MAX_ITEMS:
        found[text(key)] = own
        stats["key_names"][text(key)] = text(name)
    else:
        stats["dropped"]["key_parts"] += 1


# --- AOTAutograd's cache -----------------------------------------------------------------

def _wrap_aot_cache(cache, hook, stats, flight):
    """Wrap ``AOTAutogradCache``: single-flight on a miss of ``_lookup``, the release of a held
    key after ``save``."""
    original_lookup = cache._lookup
    original_save = cache.save
    of_lookup, of_save = _named(original_lookup), _named(original_save)

    def lookup(*args, **kwargs):
        def read():
            return original_lookup(*args, **kwargs)

        result = read()
        given = of_lookup(args, kwargs)
        key = given.get("key")
        if result is None and key and given.get("local"):
            result = flight.lead(key, _folder_of(cache, key, hook), 2, read, aot=True)
        return result

    def save(*args, **kwargs):
        key = of_save(args, kwargs).get("key")
        try:
            return original_save(*args, **kwargs)
        finally:
            flight.saved(key, _folder_of(cache, key, hook), 2)

    cache._lookup = staticmethod(lookup)
    cache.save = staticmethod(save)


# --- compile calls: a failed compile releases its keys -------------------------------------

def _wrap_compile(module, hook, stats, flight):
    """Wrap ``compile_fx`` (Dynamo's backend: its outermost call per thread holds the AOTAutograd
    keys until a save, a failure, or the lazy backward's bound) and ``_compile_fx_inner`` (one
    graph: its FX keys are released when it ends)."""
    original_outer = module.compile_fx
    original_inner = module._compile_fx_inner
    local = threading.local()

    def compile_fx(*args, **kwargs):
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        started = time.monotonic()
        try:
            if depth:
                return original_outer(*args, **kwargs)
            return flight.compiling(lambda: original_outer(*args, **kwargs), outer=True)
        finally:
            local.depth = depth
            if not depth:
                stats["compile_seconds"] += time.monotonic() - started

    def compile_fx_inner(*args, **kwargs):
        backward = bool(kwargs.get("is_backward"))  # Inductor passes its graph kwargs by name
        return flight.compiling(lambda: original_inner(*args, **kwargs), backward=backward)

    module.compile_fx = compile_fx
    module._compile_fx_inner = compile_fx_inner


# --- the record ---------------------------------------------------------------------------

def section(hook):
    """The record's ``inductor`` part at exit: torch's counters added, ``hits`` and ``misses``
    of the FX graph cache (each graph a process compiled or loaded), single-flight and the
    tier; only the tier's where the tier copied files in but Inductor compiled nothing."""
    if KIND not in hook.libraries:
        return {"tier": common.tier_stats(hook, KIND)} if KIND in hook.parts else None
    began = time.perf_counter()
    stats = dict(part(hook))
    counts = {"fxgraph": {"hits": 0, "misses": 0, "bypassed": 0},
              "aotautograd": {"hits": 0, "misses": 0, "bypassed": 0, "guard_misses": 0, "saved": 0}}
    try:
        counters = sys.modules["torch._dynamo.utils"].counters
        for (group, name), (field, what) in COUNTERS.items():
            counts[field][what] = int(counters[group][name])
    except Exception as exc:  # torch without the counters: what the wrappers saw
        stats["counters"] = text(f"not read: {exc!r}", 300)
        counts["fxgraph"]["misses"] = len(stats["missed"])
        counts["fxgraph"]["hits"] = len(stats["hit_keys"])
    stats.update(counts)
    stats["hits"] = counts["fxgraph"]["hits"]
    # A graph that bypassed the cache is compiled by every process: a miss for validation.
    stats["misses"] = counts["fxgraph"]["misses"] + counts["fxgraph"]["bypassed"]
    stats["compile_seconds"] = round(stats["compile_seconds"], 3)
    stats["saved_seconds"] = round(stats["saved_seconds"], 3)
    stats["torch"] = _torch_version()
    stats["cache_dir"] = _cache_dir()
    stats["device"], stats["device_count"] = _device()
    with _MUTEX:
        flight = _STATE["flight"]
    stats["single_flight"] = common.flight_stats(hook, KIND)
    if flight is not None:
        stats["single_flight"].update(flight.counts())
    stats["tier"] = common.tier_stats(hook, KIND)
    # What the record costs this process: its key parts and this section (not the JSON write).
    stats["hook_seconds"] = round(stats["hook_seconds"] + time.perf_counter() - began, 4)
    return stats


def _cache_dir():
    try:
        return text(sys.modules["torch._inductor.runtime.cache_dir_utils"].cache_dir())
    except Exception:
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or None


def device(hook):
    """What Inductor compiled for in this process (the GPU, where it used CUDA), or None."""
    if KIND not in hook.libraries:
        return None
    name, count = _device()
    return {"platform": "gpu" if name else "cpu", "kinds": [name or "cpu"],
            "count": count or (0 if name else 1)}


def _device():
    """(name, count) of the GPUs where this process used CUDA (the name is part of Inductor's
    keys), else (None, 0)."""
    try:
        cuda = sys.modules["torch"].cuda
        if cuda.is_initialized():
            return text(cuda.get_device_name(), 100), int(cuda.device_count())
    except Exception:
        pass
    return None, 0
