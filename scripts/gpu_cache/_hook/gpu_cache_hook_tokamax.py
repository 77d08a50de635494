"""gpu-cache's startup hook, the tokamax fix (issue 20): loaded when the process imports
``tokamax._src.ops.op``.

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
The record's ``tokamax`` part says what happened, and in which thread. Never raises into the
job. Standard library only, Python 3.9+.
"""

import threading

from gpu_cache_hook_common import text

FUNCTION = "get_autotuning_cache_overlay_state"


def on_import(op_module, hook):
    """Run right after ``tokamax._src.ops.op`` is imported, in the importing thread."""
    part = hook.parts["tokamax"] = {}
    if not hook.tokamax_fix:
        part["fix"] = "off: GPU_CACHE_TOKAMAX_FIX switches it off"
        return
    make = getattr(op_module, FUNCTION, None)
    if not callable(make):
        part["fix"] = f"not needed: this tokamax has no {FUNCTION}"
        return
    thread = threading.current_thread()
    try:
        make()
    except Exception as exc:  # the job runs as without the fix
        part["fix"] = text(f"failed: {exc!r}", 300)
        hook.warn("tokamax fix", exc)
        return
    part.update(fix="applied", thread=text(thread.name), main_thread=thread is threading.main_thread())
