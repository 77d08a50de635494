# gpu-cache hook piece
# watches numba.core.caching
# watches-with NUMBA_CACHE_DIR numba.core.caching
# node-local NUMBA_CACHE_DIR
# software numba
"""gpu-cache's startup hook, the piece of the ``numba`` kind: loaded when a process imports
``numba.core.caching`` (``numba`` does, at import), wherever the hook watches and wherever
``$NUMBA_CACHE_DIR`` is gpu-cache's folder (its guard is wanted even without records).

Numba looks a function's overload up in its on-disk cache (``@jit(cache=True)``, with
``$NUMBA_CACHE_DIR`` gpu-cache's folder) in ``Cache.load_overload``, which returns None where
the cache has none, and after a compile keeps it with ``save_overload``; its
``IndexDataCacheFile`` reads and writes the files, which are pickles. This piece:

- **judges every file before it is unpickled** (``kinds.numba.guard``): the index and data
  files are read by the piece itself, through descriptors, and unpickled only where they and
  their folder pass the trust rule and the file its seal. One that fails is a miss (numba
  compiles), set aside where its folder passes, and the record's ``refused`` or ``damaged``
  says why, with one warning line;
- **turns a damaged entry into a miss**: an index or data file of the user's own that is cut
  short, empty, not as prune sealed it, or that numba cannot rebuild an overload from
  (LLVM's "Invalid abbrev number") is set aside and compiled again, never the job's error;
- **writes privately**: numba's new folders are made 0700 (2770 in a team's folder) and its
  files lose group and other write (the team's kept in a team's folder) before they are
  renamed into place, whatever the umask; nothing is written into a folder that fails;
- **counts**: a hit for each overload loaded, a miss for each one looked up and not found (its
  function named), with the keys as gpu-cache's inventory names them (``<source folder's cache
  folder>/<index name>``).

A numba whose caching classes differ is not read from at all (its disk cache is off in the
process, compiled instead), and the record's ``state`` says so. Standard library only,
Python 3.9+.
"""

import contextlib
import errno
import os
import pickle
import time

from ... import common
from ...common import keep, text

KIND = "numba"
#: What the piece wraps: (class of ``numba.core.caching``, its methods).
WRAPPED = (("Cache", ("load_overload", "save_overload")),
           ("IndexDataCacheFile", ("_load_index", "_load_data", "_open_for_write")),
           ("_CacheLocator", ("ensure_cache_path",)))


def part(hook):
    """The record's ``numba`` part of this process, made on first use."""
    return common.part(hook, KIND, {
        "state": "not installed yet", "hits": 0, "misses": 0, "compile_seconds": 0.0, "hit_keys": [],
        "missed": [], "refused": [], "damaged": [],
        "dropped": {"hit_keys": 0, "missed": 0, "refused": 0, "damaged": 0}})


def section(hook):
    """The record's ``numba`` part at exit."""
    return common.section(hook, KIND)


def on_import(module, hook):
    """Right after ``numba.core.caching`` is imported: judge its files, count its look-ups."""
    hook.observed(KIND)
    stats = part(hook)
    classes = {name: getattr(module, name, None) for name, _methods in WRAPPED}
    known = {name: all(callable(getattr(classes[name], m, None)) for m in ms) for name, ms in WRAPPED}
    if not all(known.values()):
        stats["state"] = "off: numba.core.caching is not the one this hook knows"
        if known["Cache"]:  # its files would be unpickled unjudged: not read at all
            classes["Cache"].load_overload = lambda self, sig, target_context: None
            classes["Cache"].save_overload = lambda self, sig, data: None
            stats["state"] += ": its disk cache is off (compiled in each process)"
        hook.warn("numba cache", RuntimeError(stats["state"]), off=True)
        return
    from .guard import Guard

    def note(field, why):
        keep(stats, field, text(why))
        hook.warn("numba cache", OSError(errno.EPERM, f"{why}; compiled instead"), off=True)

    guard = Guard(note)
    _judge_files(classes["IndexDataCacheFile"], classes["_CacheLocator"], guard)
    _count(classes["Cache"], guard, stats, hook)
    stats["state"] = "on"


def _judge_files(index_file, locator, guard):
    """Numba's reads of its index and data files go through ``guard``; its writes are private."""
    from .guard import index_overloads

    write, ensure = index_file._open_for_write, locator.ensure_cache_path

    def _load_index(self):
        try:
            return guard.load(self._index_path, lambda data: index_overloads(self, data))
        except OSError:  # none, refused or damaged (set aside): numba compiles and writes it anew
            return {}

    def _load_data(self, name):
        # an OSError (refused, damaged) is what numba's own load takes for a missing data file
        return guard.load(self._data_path(name), pickle.loads, index_file=self)

    @contextlib.contextmanager
    def _open_for_write(self, filepath):
        folder_fd, team = guard.folder(os.path.dirname(filepath))  # Refused: nothing written there
        os.close(folder_fd)
        with write(self, filepath) as file:
            yield file
            guard.private(file.fileno(), team)

    def ensure_cache_path(self):
        try:  # numba's os.makedirs leaves the mode to the umask: 0777 under umask 000
            common.make_folders(self.get_cache_path())
        except OSError:
            pass  # numba's own attempt says why
        return ensure(self)

    for function in (_load_index, _load_data, _open_for_write):
        function.__wrapped__ = getattr(index_file, function.__name__)
        setattr(index_file, function.__name__, function)
    ensure_cache_path.__wrapped__ = ensure
    locator.ensure_cache_path = ensure_cache_path


def _count(cache, guard, stats, hook):
    """``Cache``'s look-up and save wrapped: hits and misses counted, an overload numba cannot
    rebuild from what it read a miss (its data file set aside), a refused folder no save."""
    from .guard import Refused

    load, save = cache.load_overload, cache.save_overload
    missed = {}  # id of a cache -> when its last miss was looked up

    def load_overload(self, sig, target_context):
        index_file = getattr(self, "_cache_file", None)
        guard.loaded.pop(id(index_file), None)
        try:
            found = load(self, sig, target_context)
        except Exception as exc:  # what numba read cannot be rebuilt (LLVM: "Invalid abbrev number")
            if not guard.set_aside_loaded(index_file, f"{type(exc).__name__}: {exc}"):
                hook.warn("numba cache", exc, off=True)
            found = None
        guard.loaded.pop(id(index_file), None)
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
        except Refused as exc:  # a folder another user may write: not written into
            guard.note("refused", f"{exc.strerror}: not written")
            return None
        finally:
            began = missed.pop(id(self), None)
            if began is not None:
                stats["compile_seconds"] += time.monotonic() - began

    load_overload.__wrapped__, save_overload.__wrapped__ = load, save
    cache.load_overload, cache.save_overload = load_overload, save_overload


def _key(cache):
    """The entry's key as gpu-cache's inventory names it: its index below the cache folder."""
    return f"{os.path.basename(cache.cache_path)}/{cache._cache_file._index_name[:-len('.nbi')]}"
