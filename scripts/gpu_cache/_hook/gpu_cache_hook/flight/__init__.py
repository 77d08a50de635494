"""gpu-cache single-flight: when several processes miss one cache key at once, one compiles it.

Part of gpu-cache's startup hook (standard library only; Python 3.7+ syntax). The hook wraps
JAX's persistent-cache read and write with it, and the Triton cache manager in
``kinds.triton.seed`` its ``get_group``/``put_group`` (kernels) and ``get_file``/``put``
(launcher libraries, autotune results). Configured by the environment:

- ``GPU_CACHE_LOCKS``: an absolute folder for the lock files (unset, empty or relative: off);
- ``GPU_CACHE_LOCK_TIMEOUT``: seconds a process waits for another one's compile before it
  compiles itself (default 600);
- ``GPU_CACHE_LOCK_MODE``: ``node`` (default: ``flock`` alone) or ``cluster`` (``flock`` within
  a node, and a lease file per key across the nodes that share the folder).

Per key, in ``$GPU_CACHE_LOCKS/<kind>/`` (``<kind>`` made ``0700``, ``2770`` where the lock
folder is a team's): ``<key>-<where>.lock``, an advisory ``flock`` lock, and in cluster mode
``<key>-<where>.<n>.lease`` files. ``<where>``: 8 hex digits of the cache folder the entry
goes to, relative to the folder above ``$GPU_CACHE_LOCKS`` (the cache root), so nodes that
mount the share at different paths agree on the names. Outside every cache folder:
inventory, stats and prune never see them. After a process missed a key:

1. it takes the key's ``flock`` lock, polling with short sleeps (never a blocking flock),
   until the lock is ours, the entry appears (``peek``: a read that is safe while the entry is
   written), or the timeout (then it compiles without a lock: a suspended leader holds nobody
   past the bound);
2. with the lock it reads the cache again (a leader may just have written the entry): a hit is
   returned and the lock released;
3. cluster mode: the node's leader then creates lease ``0`` with an exclusive create, naming
   itself (host, boot id, pid namespace, pid and start time, a random nonce). Any failed create
   means "maybe it exists": it opens the lease to look. A lease it sees is watched, by reading
   its content (attributes may be cached on a network filesystem; content read after ``open``
   is fresh): the holder rewrites a beat counter every ``LEASE_BEAT`` seconds while it
   compiles. A lease whose content has not changed for ``LEASE_STALE`` seconds of the waiter's
   own clock (no clocks are compared across nodes), or whose holder is a dead process of this
   very host, is passed over by creating lease ``n + 1``: exactly one waiter wins each number,
   so breaking a lease never makes two leaders. The winner reads the cache again, compiles,
   and removes its lease and the lower ones once the entry is written. While it waits, a waiter
   peeks for the entry and stops as soon as it is there;
4. a leader unlinks the lock file before it unlocks, so the folder only holds the keys being
   compiled now. A waiter that then gets the lock of an unlinked file re-reads the cache; on a
   miss it opens the file again. A leader that ends without writing the entry (a compile error,
   an entry the tool decided not to write) first writes ``abandoned`` into the lock file: its
   waiters then compile side by side instead of one after another.

Lock rules (docs/guarantees.md, "Locks"): nobody but you (and, in a team's lock folder, its
group) can open a lock or lease file: they are made with an exclusive create, mode ``0600``
(``0660`` in a team's folder) whatever the umask, in a kind folder others cannot enter. A lock
or lease file that is not so (another user's file, a symlink, a FIFO, a device, a folder, a
file others could have opened) is never waited on: it is replaced (renamed over, never
followed) or, where it cannot be, this process compiles without single-flight for that key.

The kernel releases a dead process's locks at once (its lock file stays until the next leader
of that key removes it). A filesystem where ``flock`` fails turns single-flight off for the
process (the record says so, one warning line at most). Lock order: a JAX compile may hold a
JAX key while Triton kernels compile inside it; a Triton compile never waits for a JAX key; the
timeout bounds every wait anyway.
"""

import errno
import os
import stat
import threading
import time

from .. import locks as lock_files
from ..names import CLUSTER, LOCK_MODE_VAR, LOCK_TIMEOUT_VAR, LOCKS_VAR, NODE
from . import leases

DEFAULT_TIMEOUT = 600.0
#: What a leader that wrote no entry leaves in its lock file for the processes waiting on it.
ABANDONED = b"abandoned\n"
#: Longest sleep between two polls of a held lock.
MAX_POLL = 0.02
#: Errors of flock that mean "held by another process" (everything else: locks do not work).
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
#: The record keeps this many of a kind's waits, the longest, each with its key.
MAX_WAITS = 10


def _stat_fields():
    return {"state": "on", "mode": NODE, "led": 0, "waited": 0, "hits_after_wait": 0,
            "gave_up": 0, "abandoned": 0, "wait_seconds": 0.0, "leases_passed": 0, "replaced": 0,
            "waits": []}


class Waiting:
    """One ``lead`` call's wait: whether it waited, and when its latest look at the cache began.
    The look that finds the entry is loading it, not waiting: a wait ends where that look begins."""

    __slots__ = ("looked", "on")

    def __init__(self):
        self.on, self.looked = False, None

    def begin(self, stats):
        if not self.on:
            self.on = True
            stats["waited"] += 1

    def look(self):
        self.looked = time.monotonic()


class _Flight:
    """The process-wide state: where the locks are, the timeout, whether it is off, counts."""

    def __init__(self, environ):
        self.mutex = threading.Lock()
        self.stats = {}
        self.off = {}  # kind (or "*") -> why single-flight is off
        self.no_leases = {}  # kind -> why leases are off (flock still works)
        self.held = {}  # (kind, name) -> _Lock held by this process
        self.folders = {}  # kind -> (its lock folder, group mode bits of its files, its group)
        self.leases = set()  # leases.Lease objects this process holds (the beat thread's work)
        self.beat = None  # the beat thread
        self.warn = None
        self.local = threading.local()  # seconds each thread waited, per kind
        folder = environ.get(LOCKS_VAR) or ""
        self.folder = os.path.normpath(folder) if os.path.isabs(folder) else None
        if self.folder is None:
            self.off["*"] = f"{LOCKS_VAR} is not set" if not folder else \
                f"{LOCKS_VAR} is not an absolute path: {folder[:200]!r}"
        self.cluster = environ.get(LOCK_MODE_VAR) == CLUSTER
        try:
            self.timeout = max(0.0, float(environ.get(LOCK_TIMEOUT_VAR) or DEFAULT_TIMEOUT))
        except ValueError:
            self.timeout = DEFAULT_TIMEOUT
        if self.timeout != self.timeout or self.timeout == float("inf"):  # nan, inf
            self.timeout = DEFAULT_TIMEOUT
        try:
            import fcntl  # noqa: F401  (Unix only)
        except ImportError:
            self.off["*"] = "no fcntl.flock on this platform"

    def kind_stats(self, kind):
        with self.mutex:
            return self.stats.setdefault(kind, _stat_fields())

    def reason(self, kind):
        return self.off.get("*") or self.off.get(kind)

    def leasing(self, kind):
        return self.cluster and kind not in self.no_leases


_FLIGHT = None
_INIT = threading.Lock()


def _flight():
    global _FLIGHT
    if _FLIGHT is None:
        with _INIT:
            if _FLIGHT is None:
                _FLIGHT = _Flight(os.environ)
                if hasattr(os, "register_at_fork"):
                    os.register_at_fork(after_in_child=_forget_in_child)
    return _FLIGHT


def _forget_in_child():
    """A forked child shares its parent's open lock files: close its copies (the parent's
    locks and leases stay held by the parent) and forget them."""
    flight = _FLIGHT
    if flight is None:
        return
    for lock in list(flight.held.values()):
        for fd in (lock.fd, lock.lease.fd if lock.lease is not None else None):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        lock.fd = None
        lock.lease = None
    flight.held.clear()
    flight.leases = set()
    flight.beat = None
    flight.mutex = threading.Lock()


def configure(warn=None):
    """Set the function that prints the process's one warning line (``warn(what, exc)``)."""
    _flight().warn = warn


def enabled(kind):
    """Whether single-flight is on for ``kind`` in this process."""
    return _flight().reason(kind) is None


def disable(kind, why):
    """Turn single-flight off for ``kind`` ("*": every kind) in this process, saying why."""
    flight = _flight()
    flight.off.setdefault(kind, why)


def stats(kind):
    """What single-flight did for ``kind`` in this process, for its record: ``state`` is "on"
    or "off: <why>"; ``mode`` "node" or "cluster" (or "node: <why leases are off>"); counts of
    keys it compiled as leader (``led``), waited for, found after the wait, gave up on after the
    timeout, leaders' abandoned compiles it saw, stale leases it passed over, and lock or lease
    files not made by the lock rules that it replaced; ``wait_seconds`` (each wait ends where the
    look that found the entry began: loading it is not waiting) and ``waits``, the longest
    MAX_WAITS waits with their keys, seconds and outcome."""
    flight = _flight()
    out = dict(flight.kind_stats(kind))
    why = flight.reason(kind)
    if why:
        out["state"] = f"off: {why}"
    if flight.cluster:
        out["mode"] = f"{NODE}: {flight.no_leases[kind]}" if kind in flight.no_leases else CLUSTER
    out["wait_seconds"] = round(out["wait_seconds"], 3)
    out["waits"] = [dict(w) for w in out["waits"]]
    out["timeout"] = flight.timeout
    return out


def thread_wait_seconds(kind):
    """Seconds this thread has waited so far for other processes' compiles of ``kind``: a
    caller that times a compile step subtracts the part of it that was waiting."""
    return getattr(_flight().local, "waits", {}).get(kind, 0.0)


def _count_wait(flight, kind, key, seconds, outcome, stats):
    """Add one wait to the kind's totals, to this thread's, and to the longest waits kept
    (``outcome``: "hit", the entry was loaded; "led", this process compiles it under the lock;
    "unlocked", it compiles without one: a timeout, an abandoned compile, locks that fail)."""
    local = flight.local
    waits = getattr(local, "waits", None)
    if waits is None:
        waits = local.waits = {}
    waits[kind] = waits.get(kind, 0.0) + seconds
    with flight.mutex:
        stats["wait_seconds"] += seconds
        kept = stats["waits"]
        if len(kept) < MAX_WAITS or seconds > kept[-1]["seconds"]:
            kept.append({"key": str(key)[:200], "seconds": round(seconds, 3), "outcome": outcome})
            kept.sort(key=lambda w: -w["seconds"])
            del kept[MAX_WAITS:]


def lock_name(key, where):
    """The lock file's name for cache key ``key`` of the cache folder ``where``: the same on
    every node, wherever it mounts the share (``where`` counts relative to the folder above
    the lock folder, the cache root, when it lies below it)."""
    import zlib

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(key))
    if len(safe) > 180:  # keys end in their hash: keep the end
        safe = safe[-180:]
    where = os.path.normpath(str(where or ""))
    folder = _flight().folder
    if folder is not None:
        root = os.path.dirname(folder)
        if where == root or where.startswith(root.rstrip(os.sep) + os.sep):
            where = os.path.relpath(where, root)
    return f"{safe}-{zlib.crc32(os.fsencode(where)):08x}.lock"


# --- the lock rules ----------------------------------------------------------------------

def _kind_folder(flight, kind):
    """``(folder, group_bits, gid)``: ``$GPU_CACHE_LOCKS/<kind>``, made and checked by the
    lock rules, the group mode bits its lock files get (0o060 in a team's folder, else 0) and
    its group; None (single-flight off for ``kind``, said once) where the rules cannot hold."""
    known = flight.folders.get(kind)
    if known is not None:
        return known
    parent = flight.folder
    folder = os.path.join(parent, kind)
    try:
        if not os.path.lexists(parent):
            os.makedirs(parent, 0o700, exist_ok=True)
        above = os.stat(parent)
        if not stat.S_ISDIR(above.st_mode):
            raise OSError(errno.ENOTDIR, "not a folder")
        team = bool(above.st_mode & stat.S_IWGRP)
        if above.st_mode & stat.S_IWOTH or (above.st_uid not in (os.geteuid(), 0) and not team):
            raise OSError(errno.EPERM, f"writable by others (owner uid {above.st_uid}, mode "
                          f"{stat.S_IMODE(above.st_mode):04o})")
        mode = 0o2770 if team else 0o700
        try:
            os.mkdir(folder, 0o700)
            os.chmod(folder, mode)  # whatever the umask; setgid keeps the team's group
        except FileExistsError:
            pass
        info = os.lstat(folder)
        why = lock_files.folder_problem(info, above, team, folder)
        if why and info.st_uid == os.geteuid() and stat.S_ISDIR(info.st_mode):
            os.chmod(folder, mode)  # ours, made by an older gpu-cache or under another umask
            info = os.lstat(folder)
            why = lock_files.folder_problem(info, above, team, folder)
        if why:
            raise OSError(errno.EPERM, why)
    except OSError as exc:
        _give_up_on_locks(flight, kind, folder, exc, doing="keep lock files private")
        return None
    known = flight.folders[kind] = (folder, 0o060 if team else 0, info.st_gid)
    return known


#: What ``_open`` returns where the lock file was made and unlinked under it at every attempt:
#: leaders of this key (ours: the folder is private) finishing one after another, each entry
#: likely written. Single-flight stays on; the caller looks at the cache (a peek: a new leader
#: may be writing the entry) and tries again.
_CHURNED = object()


def _open(flight, kind, path, folder):
    """The lock file at ``path``, opened (made) by the lock rules; :data:`_CHURNED`; or None
    (and single-flight off for ``kind``) where that cannot be done."""
    stats = flight.kind_stats(kind)
    why = None
    for _attempt in range(4):
        try:
            named = os.lstat(path)
        except FileNotFoundError:
            try:
                return lock_files.create(path, folder[1])
            except FileExistsError:
                continue
            except OSError as exc:
                return _give_up_on_locks(flight, kind, path, exc)
        except OSError as exc:
            return _give_up_on_locks(flight, kind, path, exc)
        # a folder, link or device is never opened: set aside like a lock file of someone else's
        fd, why = lock_files.open_named(path, named, folder[1], folder[2])
        if fd is not None:
            return fd
        if why is None:  # replaced meanwhile: look again
            continue
        try:
            lock_files.set_aside(path, named)
            stats["replaced"] += 1
        except OSError as exc:
            return _give_up_on_locks(flight, kind, path, OSError(
                exc.errno, f"{os.path.basename(path)} is {why} and cannot be replaced "
                f"({exc.strerror or exc})"))
    if why is None:
        return _CHURNED
    return _give_up_on_locks(flight, kind, path, OSError(errno.EAGAIN, f"keeps being replaced ({why})"))


def _give_up_on_locks(flight, kind, path, exc, doing="create lock files"):
    why = f"cannot {doing} in {os.path.dirname(path)[:300]}: {exc.strerror or exc}"
    disable(kind, why)
    if flight.warn is not None:
        flight.warn(f"single-flight off for {kind}", OSError(exc.errno, why))
    return None


# --- held locks ---------------------------------------------------------------------------

class _Lock:
    """A held lock of one key: release it once the entry is written (or will not be)."""

    def __init__(self, flight, kind, name, path, fd):
        self.flight, self.kind, self.name, self.path, self.fd = flight, kind, name, path, fd
        self.thread = threading.get_ident()
        self.lease = None

    def release(self, wrote=True):
        """Unlock (idempotent; never raises). ``wrote``: the entry is in the cache now; else
        the waiters learn that this compile was abandoned and compile for themselves."""
        try:
            self._release(wrote)
        except Exception as exc:  # the kernel drops the lock at exit at the latest
            if self.flight.warn is not None:
                self.flight.warn("single-flight release", exc)

    def _release(self, wrote):
        with self.flight.mutex:
            fd, self.fd = self.fd, None
            lease, self.lease = self.lease, None
            if self.flight.held.get((self.kind, self.name)) is self:
                del self.flight.held[(self.kind, self.name)]
            self.flight.leases.discard(lease)
        if lease is not None:
            lease.remove()
        if fd is None:
            return
        if not wrote:
            self.flight.kind_stats(self.kind)["abandoned"] += 1
        _unlock(fd, self.path, wrote)

    def abandon(self):
        self.release(wrote=False)


def _unlock(fd, path, wrote, unlink=True):
    import fcntl

    try:
        if not wrote:
            try:
                os.pwrite(fd, ABANDONED, 0)
            except OSError:
                pass
        if unlink and not lock_files.stale(fd, path):
            try:
                os.unlink(path)
            except OSError:
                pass  # the next leader reuses the file
        fcntl.flock(fd, fcntl.LOCK_UN)  # releases it for forked children's copies too
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def _try_lock(flight, kind, fd, path):
    """True: locked; False: another process holds it; None: flock does not work here."""
    import fcntl

    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno in _BUSY:
                return False
            os.close(fd)
            _give_up_on_locks(flight, kind, path, exc, doing="lock files (flock)")
            return None


# --- the protocol -------------------------------------------------------------------------

def lead(kind, key, where, read, peek=None):
    """After this process missed ``key`` (of ``kind``, in cache folder ``where``): wait for the
    process compiling it, or become that process.

    ``read()`` reads the cache again: the entry, or None on a miss. ``peek()``, where given,
    is a read that is safe while another process writes the entry; it is tried while waiting.
    Returns ``(entry, lock)``: ``entry`` when the cache has it now (the caller uses it, no
    lock is held); else ``lock`` is the held lock (this process compiles and calls
    ``lock.release(wrote)`` after writing) or None (compile without a lock: single-flight is
    off, the wait timed out, or the leader abandoned its compile). Exceptions of ``read`` and
    ``peek`` propagate, with nothing held.
    """
    flight = _flight()
    if flight.reason(kind):
        return None, None
    folder = _kind_folder(flight, kind)
    if folder is None:
        return None, None
    name = lock_name(key, where)
    with flight.mutex:
        leftover = flight.held.get((kind, name))
    if leftover is not None and leftover.thread == threading.get_ident():
        leftover.abandon()  # this thread's earlier compile of the key failed without a write
    path = os.path.join(folder[0], name)
    stats = flight.kind_stats(kind)
    start = time.monotonic()
    deadline = start + flight.timeout
    waiting = Waiting()
    found = lock = None
    try:
        found, lock = _lead_node(flight, kind, name, path, folder, read, peek, deadline, stats, waiting)
        if lock is None or not flight.leasing(kind):
            stats["led"] += lock is not None
            return found, lock
        try:
            found, go_on = leases.wait_or_take(flight, kind, lock, folder, read, peek, deadline, stats,
                                               waiting)
        except BaseException:
            lock.release(wrote=False)
            raise
        if found is not None or not go_on:
            lock.release(wrote=True)
            lock = None
            return found, None
        stats["led"] += 1
        return None, lock
    finally:
        if waiting.on:
            outcome = "hit" if found is not None else "led" if lock is not None else "unlocked"
            _count_wait(flight, kind, key, (waiting.looked or time.monotonic()) - start, outcome, stats)


def _wait_once(read, peek, delay, deadline, stats, waiting):
    """One look and one pause of a wait for another process's entry: ``(True, entry)`` where
    the look found it (``peek``: a read that is safe while that process writes it; no lock is
    held here), ``(True, read())`` where the deadline has come (given up: the caller compiles
    on a miss), else ``(False, the next delay)`` after sleeping ``delay`` seconds (or until the
    deadline), the delay growing to :data:`MAX_POLL`."""
    waiting.begin(stats)
    waiting.look()
    found = peek() if peek is not None else None
    if found is not None:
        stats["hits_after_wait"] += 1
        return True, found
    now = time.monotonic()
    if now >= deadline:
        stats["gave_up"] += 1
        waiting.look()
        return True, read()
    time.sleep(min(delay, deadline - now))
    return False, min(delay * 1.5, MAX_POLL)


def _lead_node(flight, kind, name, path, folder, read, peek, deadline, stats, waiting):
    """Steps 1 and 2 of the protocol, within this node: ``(entry, None)``, ``(None, lock)``
    as the node's leader, or ``(None, None)``."""
    delay = 0.002
    while True:
        fd = _open(flight, kind, path, folder)
        if fd is _CHURNED:  # four attempts can all lose that race on a busy machine
            done, value = _wait_once(read, peek, delay, deadline, stats, waiting)
            if done:
                return value, None
            delay = value
            continue
        if fd is None:
            return None, None
        got = _try_lock(flight, kind, fd, path)
        if got is None:
            return None, None
        try:
            while not got:
                done, value = _wait_once(read, peek, delay, deadline, stats, waiting)
                if done:
                    return value, None
                delay = value
                got = _try_lock(flight, kind, fd, path)
                if got is None:
                    fd = None
                    return None, None
            stale = lock_files.stale(fd, path)
            marker = os.pread(fd, len(ABANDONED), 0) if stale else b""
            waiting.look()
            found = read()
            if found is not None:
                if waiting.on:
                    stats["hits_after_wait"] += 1
                return found, None
            if not stale:
                lock = _Lock(flight, kind, name, path, fd)
                fd = None  # the lock owns it now
                with flight.mutex:
                    flight.held[(kind, name)] = lock
                return None, lock
            if marker == ABANDONED:
                return None, None  # the leader failed: compile side by side, not in turns
        finally:
            if fd is not None:
                _unlock(fd, path, wrote=True, unlink=got is True)
        # The lock of a file its leader unlinked, and still a miss: the next round.
