"""gpu-cache's startup hook, the Triton piece: loaded when the process imports ``triton``.

Triton's compilation listener counts hits and misses (and marks each hit entry used), and,
with ``$GPU_CACHE_LOCKS``, Triton's cache manager becomes gpu-cache's single-flight one
(``gpu_cache_triton_seed.FlightCacheManager``). Standard library only, Python 3.9+.
"""

import os

import gpu_cache_hook_common as common
from gpu_cache_hook_common import keep, text, touch


def on_import(triton_module, hook):
    """Run right after ``import triton``."""
    stats = common.triton_part(hook)
    if hook.flight:
        try:
            _flight_triton(triton_module, hook)
        except Exception as exc:
            common.flight_off(hook, "triton", f"not installed: {exc!r}"[:300])
            hook.warn("triton single-flight", exc)
    if hook.folder:
        _triton_listener(triton_module, hook, stats)


def _triton_listener(triton_module, hook, stats):
    knobs = triton_module.knobs
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
                    keep(stats, "hit_keys", text(os.path.basename(folder)))
                    touch(folder)
            else:
                stats["misses"] += 1
                keep(stats, "missed", {"name": text(name), "key": text(os.path.basename(folder or ""))})
                micros = getattr(times, "ir_initialization", 0) + getattr(times, "store_results", 0)
                micros += sum(d for _stage, d in getattr(times, "lowering_stages", []))
                stats["compile_seconds"] += micros / 1e6
        except Exception as exc:
            hook.warn("triton listener", exc)
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)

    knobs.compilation.listener = listener


#: The Triton cache manager (next to this file) gpu-cache exports for a read-only cache root;
#: it does single-flight too.
_SEED_MODULE = "gpu_cache_triton_seed"


def _flight_triton(triton_module, hook):
    """Make Triton's cache manager gpu-cache's single-flight one, in this process only (the
    knob, not ``TRITON_CACHE_MANAGER``: a child without this folder on its path would fail
    to import it). A manager you named stays, and single-flight is off for Triton then."""
    flight = common.flight(hook)
    cache_knobs = getattr(getattr(triton_module, "knobs", None), "cache", None)
    if cache_knobs is None or not any("manager_class" in vars(k) for k in type(cache_knobs).__mro__):
        flight.disable("triton", "this triton has no triton.knobs.cache.manager_class (< 3.4)")
        return
    theirs = os.environ.get("TRITON_CACHE_MANAGER")
    if theirs:
        if theirs.split(":", 1)[0] != _SEED_MODULE:
            flight.disable("triton", text(f"TRITON_CACHE_MANAGER={theirs} is your own", 300))
        return  # gpu-cache's seed manager: single-flight is in it
    cache_knobs.manager_class = hook.piece(_SEED_MODULE).FlightCacheManager
