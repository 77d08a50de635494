# gpu-cache hook piece
# watches numba.core.caching
# node-local NUMBA_CACHE_DIR
# software numba
"""gpu-cache's startup hook, the piece of the ``numba`` kind: loaded when a process imports
``numba.core.caching`` (``numba`` does, at import).

Numba looks a function's overload up in its on-disk cache (``@jit(cache=True)``, with
``$NUMBA_CACHE_DIR`` gpu-cache's folder) in ``Cache.load_overload``, which returns None where
the cache has none, and after a compile keeps it with ``save_overload``. This piece wraps both
(numba.cuda's cache is the same class) and counts: a hit for each overload loaded, a miss for
each one looked up and not found (its function named), with the keys, as gpu-cache's inventory
names them (``<source folder's cache folder>/<index name>``). A numba whose ``Cache`` differs is
left alone, and the record's ``state`` says so. Standard library only, Python 3.9+.
"""

import os
import time

from gpu_cache_hook import common
from gpu_cache_hook.common import keep, text

KIND = "numba"


def part(hook):
    """The record's ``numba`` part of this process, made on first use."""
    return common.part(hook, KIND, {
        "state": "not installed yet", "hits": 0, "misses": 0, "compile_seconds": 0.0, "hit_keys": [],
        "missed": [], "dropped": {"hit_keys": 0, "missed": 0}})


def section(hook):
    """The record's ``numba`` part at exit."""
    return common.section(hook, KIND)


def on_import(module, hook):
    """Right after ``numba.core.caching`` is imported: wrap its ``Cache``'s look-up and save."""
    hook.observed(KIND)
    stats = part(hook)
    cache = getattr(module, "Cache", None)
    wrapped = [getattr(cache, name, None) for name in ("load_overload", "save_overload")]
    if not all(callable(f) for f in wrapped):
        stats["state"] = "off: numba.core.caching.Cache is not the one this hook knows"
        return
    load, save = wrapped
    missed = {}  # id of a cache -> when its last miss was looked up

    def load_overload(self, sig, target_context):
        found = load(self, sig, target_context)
        try:
            key = _key(self)
            if found is not None:
                stats["hits"] += 1
                keep(stats, "hit_keys", text(key))
            elif getattr(self, "_enabled", False):
                stats["misses"] += 1
                name = getattr(self._py_func, "__qualname__", "?")
                keep(stats, "missed", {"name": text(name), "key": text(key)})
                missed[id(self)] = time.monotonic()
        except Exception as exc:  # the count is lost, numba's answer is not
            hook.warn("numba cache", exc)
        return found

    def save_overload(self, sig, data):
        try:
            return save(self, sig, data)
        finally:
            began = missed.pop(id(self), None)
            if began is not None:
                stats["compile_seconds"] += time.monotonic() - began

    load_overload.__wrapped__, save_overload.__wrapped__ = load, save
    cache.load_overload, cache.save_overload = load_overload, save_overload
    stats["state"] = "on"


def _key(cache):
    """The entry's key as gpu-cache's inventory names it: its index below the cache folder."""
    return f"{os.path.basename(cache.cache_path)}/{cache._cache_file._index_name[:-len('.nbi')]}"
