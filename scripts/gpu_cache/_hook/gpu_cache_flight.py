"""gpu-cache single-flight: when several processes miss one cache key at once, one compiles it.

Part of gpu-cache's startup hook (standard library only; Python 3.7+ syntax). The hook wraps
JAX's persistent-cache read and write with it, and the Triton cache manager in
``gpu_cache_triton_seed`` its ``get_group``/``put_group``. Configured by the environment:

- ``GPU_CACHE_LOCKS``: an absolute folder for the lock files (unset, empty or relative: off);
- ``GPU_CACHE_LOCK_TIMEOUT``: seconds a process waits for another one's compile before it
  compiles itself (default 600).

One advisory ``flock`` lock file per key, ``$GPU_CACHE_LOCKS/<kind>/<key>-<where>.lock``
(``<where>``: 8 hex digits of the cache folder the entry goes to). Outside every cache
folder: inventory, stats and prune never see it. The protocol, after a process missed a key:

1. open (create) the lock file and try ``flock(LOCK_EX | LOCK_NB)``; while another process
   holds it, poll with short sleeps (never a blocking flock), until the lock is ours, the entry
   appears (``peek``, where reading it while it is written is safe), or the timeout: then
   compile without a lock (a suspended leader holds nobody past the bound);
2. with the lock: read the cache again (a leader may just have written the entry): a hit is
   returned and the lock released; a miss makes this process the leader, which holds the lock
   until the entry is written (or the compile failed) and then releases it;
3. a leader unlinks the lock file before it unlocks, so the folder only holds the keys being
   compiled now. A waiter that then gets the lock of an unlinked file re-reads the cache; on a
   miss it opens the file again. A leader that ends without writing the entry (a compile error,
   an entry the tool decided not to write) first writes ``abandoned`` into the file: its
   waiters then compile side by side instead of one after another.

The kernel releases a dead process's locks at once (its lock file stays until the next leader
of that key removes it). A filesystem where ``flock`` fails turns single-flight off for the
process (the record says so, one warning line at most). Lock order: a JAX compile may hold a
JAX key while Triton kernels compile inside it; a Triton compile never waits for a JAX key; the
timeout bounds every wait anyway.
"""

import errno
import os
import threading
import time

LOCKS_VAR = "GPU_CACHE_LOCKS"
TIMEOUT_VAR = "GPU_CACHE_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
#: What a leader that wrote no entry leaves in its lock file for the processes waiting on it.
ABANDONED = b"abandoned\n"
#: Longest sleep between two polls of a held lock.
MAX_POLL = 0.02
#: Errors of flock that mean "held by another process" (everything else: locks do not work).
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


def _stat_fields():
    return {"state": "on", "led": 0, "waited": 0, "hits_after_wait": 0, "gave_up": 0,
            "abandoned": 0, "wait_seconds": 0.0}


class _Flight:
    """The process-wide state: where the locks are, the timeout, whether it is off, counts."""

    def __init__(self, environ):
        self.mutex = threading.Lock()
        self.stats = {}
        self.off = {}  # kind (or "*") -> why single-flight is off
        self.held = {}  # (kind, name) -> _Lock held by this process
        self.warn = None
        folder = environ.get(LOCKS_VAR) or ""
        self.folder = folder if os.path.isabs(folder) else None
        if self.folder is None:
            self.off["*"] = f"{LOCKS_VAR} is not set" if not folder else \
                f"{LOCKS_VAR} is not an absolute path: {folder[:200]!r}"
        try:
            self.timeout = max(0.0, float(environ.get(TIMEOUT_VAR) or DEFAULT_TIMEOUT))
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
    locks stay held by the parent) and forget them."""
    flight = _FLIGHT
    if flight is None:
        return
    for lock in list(flight.held.values()):
        try:
            os.close(lock.fd)
        except OSError:
            pass
        lock.fd = None
    flight.held.clear()
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
    or "off: <why>"; counts of keys it compiled as leader (``led``), waited for, found after
    the wait, gave up on after the timeout, and leaders' abandoned compiles it saw."""
    flight = _flight()
    out = dict(flight.kind_stats(kind))
    why = flight.reason(kind)
    if why:
        out["state"] = f"off: {why}"
    out["wait_seconds"] = round(out["wait_seconds"], 3)
    out["timeout"] = flight.timeout
    return out


def lock_name(key, where):
    """The lock file's name for cache key ``key`` of the cache folder ``where``."""
    import zlib

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(key))
    if len(safe) > 180:  # keys end in their hash: keep the end
        safe = safe[-180:]
    crc = zlib.crc32(os.fsencode(str(where or "")))
    return f"{safe}-{crc:08x}.lock"


class _Lock:
    """A held lock of one key: release it once the entry is written (or will not be)."""

    def __init__(self, flight, kind, name, path, fd):
        self.flight, self.kind, self.name, self.path, self.fd = flight, kind, name, path, fd
        self.thread = threading.get_ident()

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
            if self.flight.held.get((self.kind, self.name)) is self:
                del self.flight.held[(self.kind, self.name)]
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
                pass  # a lock file opened read-only: waiters then take turns instead
        if unlink and not _stale(fd, path):
            try:
                os.unlink(path)
            except OSError:
                pass  # a sticky folder of another user: the next leader reuses the file
        fcntl.flock(fd, fcntl.LOCK_UN)  # releases it for forked children's copies too
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def _stale(fd, path):
    """Whether ``path`` no longer names the file open as ``fd`` (its holder unlinked it)."""
    mine = os.fstat(fd)
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return True
    return (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino)


def _open(flight, kind, path):
    """The lock file, opened (created) without following a symlink; None (and single-flight
    off for ``kind``) where lock files cannot be made."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    for attempt in range(2):
        try:
            return os.open(path, flags, 0o666)
        except FileNotFoundError:
            if attempt:
                break
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except OSError as exc:
                return _give_up_on_locks(flight, kind, path, exc)
        except PermissionError:  # another user's lock file: flock works on a read-only open
            try:
                return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError as exc:
                return _give_up_on_locks(flight, kind, path, exc)
        except OSError as exc:
            return _give_up_on_locks(flight, kind, path, exc)
    return _give_up_on_locks(flight, kind, path, FileNotFoundError(errno.ENOENT, "vanished"))


def _give_up_on_locks(flight, kind, path, exc, doing="create lock files"):
    why = f"cannot {doing} in {os.path.dirname(path)[:300]}: {exc.strerror or exc}"
    disable(kind, why)
    if flight.warn is not None:
        flight.warn(f"single-flight off for {kind}", OSError(exc.errno, why))
    return None


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
    name = lock_name(key, where)
    with flight.mutex:
        leftover = flight.held.get((kind, name))
    if leftover is not None and leftover.thread == threading.get_ident():
        leftover.abandon()  # this thread's earlier compile of the key failed without a write
    path = os.path.join(flight.folder, kind, name)
    stats = flight.kind_stats(kind)
    start = time.monotonic()
    deadline = start + flight.timeout
    waited = False
    delay = 0.002
    while True:
        fd = _open(flight, kind, path)
        if fd is None:
            return None, None
        got = _try_lock(flight, kind, fd, path)
        if got is None:
            return None, None
        try:
            while not got:
                if not waited:
                    waited = True
                    stats["waited"] += 1
                found = peek() if peek is not None else None
                if found is not None:
                    stats["hits_after_wait"] += 1
                    return found, None
                now = time.monotonic()
                if now >= deadline:
                    stats["gave_up"] += 1
                    return read(), None
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 1.5, MAX_POLL)
                got = _try_lock(flight, kind, fd, path)
                if got is None:
                    fd = None
                    return None, None
            stale = _stale(fd, path)
            marker = os.pread(fd, len(ABANDONED), 0) if stale else b""
            found = read()
            if found is not None:
                if waited:
                    stats["hits_after_wait"] += 1
                return found, None
            if not stale:
                lock = _Lock(flight, kind, name, path, fd)
                fd = None  # the lock owns it now
                with flight.mutex:
                    flight.held[(kind, name)] = lock
                stats["led"] += 1
                return None, lock
            if marker == ABANDONED:
                return None, None  # the leader failed: compile side by side, not in turns
        finally:
            if waited:
                stats["wait_seconds"] += time.monotonic() - start
                start = time.monotonic()
            if fd is not None:
                _unlock(fd, path, wrote=True, unlink=got is True)
        # The lock of a file its leader unlinked, and still a miss: the next round.
