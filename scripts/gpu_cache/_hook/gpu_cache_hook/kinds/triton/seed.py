"""gpu-cache's Triton cache managers: single-flight, and a read-only seed cache under it.

``FlightCacheManager`` is Triton's file cache manager with single-flight across processes
(``flight``): the startup hook makes it Triton's cache manager
(``triton.knobs.cache.manager_class``, in the process only: no ``TRITON_CACHE_MANAGER`` that a
job without the hook on its path could not import) when ``$GPU_CACHE_LOCKS`` is set and you
did not name a manager of your own.

Where Triton compiles (``triton/compiler/compiler.py``, ``compile``): one manager per compile,
``get_group(<kernel>.json)`` first; a hit returns at once; on a miss the stages are compiled,
each written with ``put``, and ``put_group`` writes the group file last. So a miss here takes
the key's lock (after re-reading the cache under it: a leader may have just written it) and
``put_group`` releases it once the group is written. A compile that ends without
``put_group`` (an error) releases it when its manager is garbage-collected (the exception and
its frames are gone), at this thread's next miss of the same key, at process exit (the kernel
drops the lock) and, for the waiters, after their timeout.

Triton also keeps files outside groups, each read with ``get_file`` and, on a miss, made and
written with ``put`` by the same manager: the shared objects ``runtime/build.py`` compiles with
the C compiler (``cuda_utils``, and on Triton <= 3.6 a ``__triton_launcher`` per signature) and
the autotuner's ``<fn>.autotune.json`` (``Autotuner.check_disk_cache``, which benchmarks every
config on a miss). A miss of such a file takes a lock of its own (the key and the file name),
re-reads under it, and the ``put`` of that file releases it; a miss never followed by its
``put`` releases as a group's does (issue 26).

``SeedOverlayCacheManager`` (``TRITON_CACHE_MANAGER=kinds.triton.seed:SeedOverlayCacheManager``,
exported when the cache root is read-only) reads a read-only seed cache and writes elsewhere:
Triton raises on a miss when its cache folder cannot be written, so gpu-cache points
``TRITON_CACHE_DIR`` at a node-local folder and ``GPU_CACHE_TRITON_SEED`` at the read-only
shared cache: hits come from the seed when it has them, new kernels go to the node-local
folder (single-flight there too), and nothing ever writes to the seed.
"""

from __future__ import annotations

import json
import os
import weakref

from triton.runtime.cache import FileCacheManager

try:
    from ... import flight
    from ...names import TRITON_SEED_VAR
except ImportError:  # a copy of this file without its siblings: Triton's plain file cache
    flight = TRITON_SEED_VAR = None
#: Endings of the files Triton writes alone, with ``get_file`` then ``put``: single-flighted.
SINGLE_FILES = (".so", ".autotune.json")


class FlightCacheManager(FileCacheManager):
    """Triton's file cache manager over ``$TRITON_CACHE_DIR``, where one process compiles a
    kernel that several miss at once and the others load it."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        self._single_flight = flight is not None and not (override or dump)
        self._releases = {}  # None (the group) or a single file's name -> finalizer of its held lock

    def _lookup(self, filename: str) -> dict[str, str] | None:
        return FileCacheManager.get_group(self, filename)

    def _lookup_file(self, filename: str) -> str | None:
        return FileCacheManager.get_file(self, filename)

    def _where(self) -> str:
        """The cache folder single-flight names the key's lock after."""
        return os.path.dirname(self.cache_dir)

    def get_group(self, filename: str) -> dict[str, str] | None:
        group = self._lookup(filename)
        if group is not None or not self._single_flight:
            return group
        return self._lead(None, self.key, lambda: self._lookup(filename))

    def get_file(self, filename: str) -> str | None:
        path = self._lookup_file(filename)
        if path is not None or not self._single_flight or not filename.endswith(SINGLE_FILES):
            return path
        # a lock name apart from the group's: the name's end (the key) is what lock_name keeps
        return self._lead(filename, f"{filename[:100]}-{self.key}", lambda: self._lookup_file(filename))

    def _lead(self, what: str | None, key: str, read):
        """After a miss of the group (``what`` None) or of the single file ``what``: the entry
        another process wrote meanwhile, or None with this manager holding its lock."""
        self._done(what, False)  # this manager's earlier miss of it was never written
        raised = []

        def lookup():
            try:
                return read()
            except BaseException as exc:  # Triton's own error: raised as without single-flight
                raised.append(exc)
                raise

        try:
            found, lock = flight.lead("triton", key, self._where(), read=lookup, peek=lookup)
        except Exception as exc:
            if raised:
                raise
            flight.disable("triton", f"failed: {exc!r}"[:300])
            return None  # compile, as without single-flight
        if lock is not None:
            self._releases[what] = weakref.finalize(self, lock.release, False)
        return found

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        try:
            path = super().put_group(filename, group)
        except BaseException:
            self._done(None, False)
            raise
        self._done(None, True)
        return path

    def put(self, data, filename: str, binary: bool = True) -> str:
        if filename not in self._releases:  # a group's child, or a file not missed under a lock
            path = super().put(data, filename, binary)
            self._stored(data, filename)
            return path
        try:
            path = super().put(data, filename, binary)
            self._stored(data, filename)
        except BaseException:
            self._done(filename, False)
            raise
        self._done(filename, True)
        return path

    def _stored(self, data, filename: str) -> None:
        """``filename`` is written, and its lock (a group's file: the group's) not yet released:
        the node-local tier promotes it here (``kinds.triton.tier_manager``). Never raises."""

    def _done(self, what: str | None, wrote: bool) -> None:
        release = self._releases.pop(what, None)
        detached = release.detach() if release is not None else None
        if detached is not None:
            _manager, lock_release, _args, _kwargs = detached
            lock_release(wrote)


class SeedOverlayCacheManager(FlightCacheManager):
    """Triton's file cache manager over ``$TRITON_CACHE_DIR``, with ``$GPU_CACHE_TRITON_SEED``
    consulted first for reads."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        seed = os.environ.get(TRITON_SEED_VAR) if TRITON_SEED_VAR else None
        self.seed_dir = os.path.join(seed, key) if seed and not (override or dump) else None

    def _lookup_file(self, filename: str) -> str | None:
        if self.seed_dir:
            path = os.path.join(self.seed_dir, filename)
            if os.path.exists(path):
                return path
        return super()._lookup_file(filename)

    def _lookup(self, filename: str) -> dict[str, str] | None:
        # Same rules as FileCacheManager.get_group: a group counts only when every child exists.
        if self.seed_dir:
            try:
                with open(os.path.join(self.seed_dir, f"__grp__{filename}")) as stream:
                    children = json.load(stream).get("child_paths")
            except (OSError, ValueError, AttributeError):
                children = None
            if isinstance(children, dict) and all(os.path.exists(p) for p in children.values()):
                return dict(children)
        return super()._lookup(filename)
