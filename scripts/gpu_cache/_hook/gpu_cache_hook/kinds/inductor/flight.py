"""gpu-cache's startup hook: single-flight for Inductor's AOTAutograd and FX graph caches
(issue 31), through the node-local tier where it is on. Loaded by ``kinds.inductor``.

A process that misses a key (an AOTAutograd key in ``AOTAutogradCache._lookup``, an FX graph
key in ``FxGraphCache._lookup_graph``) takes the key's lock (``flight.lead``, kind
``inductor``: ``flock`` on one node, and leases across nodes in cluster mode) or waits for the
process that holds it, peeking at the key's folder (``aotautograd/<key>/``,
``fxgraph/<xx>/<key>/``: Inductor writes each entry there with a temporary file and a rename,
so a name that appears there is a whole entry) and reading the cache again when a new name
appears. A hit after the wait is Inductor's own hit: it loads the leader's graphs and counts a
hit. The leader releases the key once Inductor saved it:

- an FX graph key after ``_save_graph``, or when ``_compile_fx_inner`` ends without a save (a
  compile that raised: its waiters are told it was abandoned and compile side by side);
- an AOTAutograd key after ``AOTAutogradCache.save``, which for a training graph comes only with
  the lazy backward compile (at the first ``backward()``). A ``compile_fx`` that raises abandons
  the keys it took; one that returns leaves them held for the backward, at most
  :data:`AWAIT_BACKWARD` seconds after this process's last compile ended (a process that never
  runs the backward, or one that waits for another key itself, frees its waiters then);
- the process's end at the latest (the kernel drops its locks; a lease goes stale).

With the node-local tier (Inductor's folder ``$GPU_CACHE_TIER/inductor``), locks are named by
the shared folder, the waiters peek there, a hit after the wait first copies the entry and the
code it names from the shared tier, and a leader promotes its new files to the shared tier
(the entry's folder last) before it releases the key. Standard library only, Python 3.9+.
"""

import os
import threading
import time

KIND = "inductor"
#: Seconds a leader keeps the AOTAutograd keys of a compiled forward for its lazy backward
#: after its last compile ended.
AWAIT_BACKWARD = 30.0


def _names(folder):
    """The names of whole entries in a key folder (Inductor's temporary files start with a
    dot); an empty set where it is missing."""
    try:
        return {name for name in os.listdir(folder) if not name.startswith(".")}
    except OSError:
        return set()


def fetch_entry(tier, sub):
    """Copy the shared key folder ``inductor/<sub>`` where the local tier lacks files of it,
    and when that brought one, the rest of Inductor's tree (the code the entry names)."""
    before = tier.counts(KIND)["fetched"]
    tier.fetch_tree(KIND, sub)
    if tier.counts(KIND)["fetched"] > before:
        tier.fetch_tree(KIND)


def promote_entry(tier, sub):
    """Promote Inductor's new local files, those of the key folder ``inductor/<sub>`` last: a
    process that sees the entry in the shared tier finds the files it names there."""
    tier.promote_tree(KIND, skip=sub)
    tier.promote_tree(KIND, sub)
    tier.known.setdefault((KIND, ""), set()).update(
        os.path.join(sub, rel) for rel in tier.known.get((KIND, sub), ()))


def _above(folder, depth):
    for _ in range(depth):
        folder = os.path.dirname(folder)
    return folder


class Flight:
    """Single-flight and the tier for Inductor's caches in this process."""

    def __init__(self, hook, flight, tier):
        self.hook, self.flight, self.tier = hook, flight, tier
        self.mutex = threading.Lock()
        self.held = {}  # key -> (lock, aot, key folder)
        self.awaiting = {}  # AOTAutograd key -> lock, kept for the lazy backward
        self.local = threading.local()  # .taken: keys taken in the current compile call
        self.active = 0  # threads of this process in a compile call
        self.waiting = 0  # of them, those waiting for another process's key
        self.last_end = time.monotonic()
        self.watchdog = None
        self.stats = {"awaited_backward": 0, "backward_bound_expired": 0}

    def counts(self):
        with self.mutex:
            return dict(self.stats)

    def _flying(self):
        return self.flight is not None and self.flight.enabled(KIND)

    def _tiered(self, folder):
        """The tier, where ``folder`` (Inductor's cache folder) is the local tier's."""
        tier = self.tier
        if tier is None or not tier.enabled(KIND):
            return None
        return tier if os.path.normpath(folder) == tier.local_folder(KIND) else None

    def _taken(self):
        taken = getattr(self.local, "taken", None)
        if taken is None:
            taken = self.local.taken = []
        return taken

    # --- a miss ------------------------------------------------------------------------------

    def lead(self, key, key_folder, depth, read, aot=False):
        """After a miss of ``key`` (whose entries go to ``key_folder``, ``depth`` folders below
        Inductor's cache folder): wait for the process compiling it and return what ``read()``
        then finds, or lead (None: compile; the lock is held until :meth:`saved`)."""
        if not self._flying() or not key_folder:
            return None
        folder = _above(key_folder, depth)
        tier = self._tiered(folder)
        rel = os.path.relpath(key_folder, folder)
        watched = os.path.join(tier.shared_folder(KIND), rel) if tier is not None else key_folder
        seen = _names(watched)

        def again():
            if tier is not None:
                fetch_entry(tier, rel)
            return read()

        def peek():
            now = _names(watched)
            if now - seen:
                seen.update(now)
                return again()
            return None

        where = tier.shared_folder(KIND) if tier is not None else folder
        with self.mutex:
            self.waiting += 1
        try:
            found, lock = self.flight.lead(KIND, key, where, again, peek)
        except Exception as exc:  # the hook's own fault: compile as without it
            self.hook.warn("inductor single-flight", exc)
            return None
        finally:
            with self.mutex:
                self.waiting -= 1
        if lock is not None:
            with self.mutex:
                self.held[key] = (lock, aot, key_folder)
            self._taken().append(key)
        return found

    # --- the leader's end ----------------------------------------------------------------------

    def saved(self, key, key_folder, depth):
        """After Inductor saved ``key`` (or tried to): promote its files through the tier, then
        release the key. Never raises."""
        if not key_folder:
            return
        try:
            wrote = bool(_names(key_folder))
            tier = self._tiered(_above(key_folder, depth))
            if wrote and tier is not None:
                promote_entry(tier, os.path.relpath(key_folder, _above(key_folder, depth)))
            with self.mutex:
                held = self.held.pop(key, None)
                lock = held[0] if held else self.awaiting.pop(key, None)
            if lock is not None:
                lock.release(wrote=wrote)
        except Exception as exc:
            self.hook.warn("inductor single-flight release", exc)

    def compiling(self, call, outer=False, backward=False):
        """Run one compile call (``outer``: Dynamo's backend, ``compile_fx``; else one graph,
        ``_compile_fx_inner``) and release what it took and still holds: all of it when it
        raised (a backward that raised also frees the keys kept for it); at its end an FX key,
        while an AOTAutograd key of an outer call stays for the lazy backward."""
        taken = self._taken()
        start = len(taken)
        depth = getattr(self.local, "depth", 0)
        self.local.depth = depth + 1
        if not depth:  # threads compiling, each once however deep its calls
            with self.mutex:
                self.active += 1
        ok = False
        try:
            result = call()
            ok = True
            return result
        finally:
            mine = taken[start:]
            del taken[start:]
            self.local.depth = depth
            with self.mutex:
                self.active -= not depth
                self.last_end = time.monotonic()
            try:
                self._settle(mine, ok, outer, backward)
            except Exception as exc:
                self.hook.warn("inductor single-flight release", exc)

    def _settle(self, keys, ok, outer, backward):
        release, keep = [], False
        with self.mutex:
            for key in keys:
                lock, aot, folder = self.held.get(key, (None, False, ""))
                if lock is None:
                    continue
                if aot and ok and not outer:
                    self._taken().append(key)  # the outer call decides
                elif aot and ok:
                    del self.held[key]
                    self.awaiting[key] = lock
                    self.stats["awaited_backward"] += 1
                    keep = True
                else:  # a graph compiled without a save (unpicklable), or a failed compile
                    del self.held[key]
                    release.append((lock, ok and bool(_names(folder))))
            if backward and not ok:
                release += [(lock, False) for lock in self.awaiting.values()]
                self.awaiting.clear()
            if keep and (self.watchdog is None or not self.watchdog.is_alive()):
                self.watchdog = threading.Thread(target=self._watch, name="gpu-cache-inductor",
                                                 daemon=True)
                self.watchdog.start()
        for lock, wrote in release:
            lock.release(wrote=wrote)

    def _watch(self):
        """Free the AOTAutograd keys kept for a lazy backward once this process has compiled
        nothing (waits for others' keys do not count) for AWAIT_BACKWARD seconds."""
        while True:
            time.sleep(1.0)
            with self.mutex:
                if not self.awaiting:
                    self.watchdog = None
                    return
                idle = self.active - self.waiting <= 0
                if not idle:
                    self.last_end = time.monotonic()
                if not idle or time.monotonic() - self.last_end < AWAIT_BACKWARD:
                    continue
                locks = list(self.awaiting.values())
                self.awaiting.clear()
                self.stats["backward_bound_expired"] += len(locks)
            for lock in locks:
                lock.release(wrote=False)
