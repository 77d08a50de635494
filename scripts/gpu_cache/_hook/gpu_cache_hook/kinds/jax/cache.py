"""gpu-cache's startup hook, the JAX piece's single-flight and node-local tier around JAX's
persistent cache (``wrap``), and its checks of a JAX entry's files: loaded with single-flight
or the tier, after ``import jax``. Standard library only, Python 3.9+.
"""

import os
import stat
import threading
import time

from ... import common
from ...common import touch
from ...names import JAX_CACHE_DIR_VAR, XLA_AUTOTUNE_CACHE

KIND = "jax"  # (its piece's)
#: What JAX single-flight wraps in ``jax._src.compiler``, with the leading parameters each must
#: have (jax 0.4.30, 0.10.2 and 0.11.2 have them). A jax whose internals differ runs without it.
FLIGHT_API = {
    "compile_or_get_cached": ("backend", "computation", "devices", "compile_options"),
    "_cache_read": ("module_name", "cache_key", "compile_options", "backend"),
    "_cache_write": ("cache_key", "compile_time_secs", "module_name", "backend", "executable"),
}


def _jax_flight_mismatch(compiler):
    """Why this jax's compiler does not fit JAX single-flight, or None."""
    import inspect

    for name, params in FLIGHT_API.items():
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


def wrap(hook, tier, cache_dir):
    """Single-flight and the node-local tier around JAX's persistent cache, one key at a time
    (``cache_dir()``: the folder this process's JAX set, where it set one).

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
            flight.disable(KIND, why)
        if tier is not None:
            tier.disable(KIND, why)
        return
    cache = _JaxCache(hook, flight, tier, compiler, state, cache_dir)
    compiler._cache_read = cache.read
    compiler._cache_write = cache.write
    if flight is not None:
        compiler.compile_or_get_cached = cache.compile_or_get_cached
    now = cache.tiered()
    if now is not None:  # XLA's per-fusion autotune results kept on the shared tier
        now.fetch_tree(KIND, XLA_AUTOTUNE_CACHE)


class _JaxCache:
    """JAX's ``_cache_read``, ``_cache_write`` and ``compile_or_get_cached`` through
    single-flight (``flight``) and the node-local tier (``tier``), as :func:`wrap`
    says; ``state``: JAX's distributed state (a run of several processes is left alone)."""

    def __init__(self, hook, flight, tier, compiler, state, cache_dir):
        self.hook, self.flight, self.tier, self.state = hook, flight, tier, state
        self.cache_dir = cache_dir
        self.original_read = compiler._cache_read
        self.original_write = compiler._cache_write
        self.original_compile = compiler.compile_or_get_cached
        self.local = threading.local()

    def flying(self):
        return self.flight is not None and self.flight.enabled(KIND)

    def held(self):
        """The keys' locks this thread holds."""
        mine = getattr(self.local, "held", None)
        if mine is None:
            mine = self.local.held = {}
        return mine

    def folder(self):
        return self.cache_dir() or os.environ.get(JAX_CACHE_DIR_VAR) or ""

    def tiered(self):
        """The tier, where this process's JAX cache folder is the local tier's."""
        tier = self.tier
        if tier is None or not tier.enabled(KIND):
            return None
        return tier if os.path.normpath(self.folder()) == tier.local_folder(KIND) else None

    def fetch(self, cache_key):
        """Copy the entry from the shared tier where the local one lacks it."""
        now = self.tiered()
        if now is not None:
            now.fetch(KIND, f"{cache_key}-cache", check=whole)

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
            return read() if now is not None and _has(now.shared_folder(KIND), cache_key) else None

        now = self.tiered()
        where = now.shared_folder(KIND) if now is not None else self.folder()
        try:
            found, lock = self.flight.lead(KIND, cache_key, where, read, peek)
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
                now.promote(KIND, f"{cache_key}-cache", check=whole)
                now.promote_tree(KIND, XLA_AUTOTUNE_CACHE)
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
            return "whole" if whole(fd, info.st_size) else "partial"
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


def whole(fd, size):
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
