"""gpu-cache's ptxas shim, the run of the real ptxas on a call the cache missed, whose result
it keeps. Loaded by ``kinds.ptxas.shim`` only then, so a hit pays for none of it. Standard
library only, Python 3.9+."""

import os
import time

from ...names import LOCKS_VAR
from . import shim


def _spawn(real, args, actions):
    """Run the real ptxas with ``actions`` on its descriptors; its exit code (128 + n for
    signal n, as a shell reports it)."""
    pid = os.posix_spawn(real, [real, *args], shim.real_environ(), file_actions=actions)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _anonymous(folder):
    """A temporary file in the cache folder, already unlinked: somewhere to catch a stream."""
    name = f"{shim.TMP_PREFIX}{os.uname().nodename[:60]}.{os.getpid()}.{os.urandom(6).hex()}"
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=folder.fd)
    os.unlink(name, dir_fd=folder.fd)
    return fd


def _read_back(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    return shim.read_all(fd)


def capture(real, args, folder):
    """Run the real ptxas with stdout and stderr caught: ``(exit code, stdout, stderr,
    seconds)``; None where nothing can be caught (a read-only folder)."""
    fds = []
    try:
        for _ in range(2):
            fds.append(_anonymous(folder))
    except OSError:
        for fd in fds:
            os.close(fd)
        return None
    try:
        started = time.monotonic()
        code = _spawn(real, args, [(os.POSIX_SPAWN_DUP2, fds[0], 1), (os.POSIX_SPAWN_DUP2, fds[1], 2)])
        seconds = time.monotonic() - started
        return code, _read_back(fds[0]), _read_back(fds[1]), seconds
    finally:
        for fd in fds:
            os.close(fd)


def _keep(folder, key, run, meta, source, output, ptx_digest):
    """Keep a successful run as the key's entry; why it was not kept ("" when it was)."""
    code, stdout, stderr, seconds = run
    if code != 0:
        return f"exit code {code}: not kept"
    try:
        if shim.sha256(shim.read_input(source)).digest() != ptx_digest:
            return "the input changed while ptxas ran: not kept"
    except shim.Pass as why:
        return f"{why}: not kept"
    fd = os.open(output, os.O_RDONLY | os.O_CLOEXEC)
    try:
        binary = shim.read_all(fd)
    finally:
        os.close(fd)
    if not binary or len(binary) > shim.MAX_BYTES:
        return "output empty or over 256 MiB: not kept"
    data = shim.pack_entry(key, shim.keep_names(stdout, source, output),
                           shim.keep_names(stderr, source, output), binary, seconds, meta)
    return "" if folder.write(key + shim.ENTRY_SUFFIX, data) else "written by another process meanwhile"


def _flight():
    """Single-flight (``gpu_cache_hook.flight``) where ``$GPU_CACHE_LOCKS`` is set."""
    if not os.path.isabs(os.environ.get(LOCKS_VAR, "")):
        return None
    from ... import flight

    flight.configure(lambda what, exc: None)  # never a line in ptxas's stderr
    return flight


def _wait_for_leader(folder, key, source, output, started, name, meta):
    """Single-flight: another process's entry (replayed: True), or the lock this process then
    holds while it runs the real ptxas (None: run without one)."""
    flight = _flight()
    if flight is None:
        return None, None
    found, lock = flight.lead("ptxas", key, folder.path, read=lambda: shim.lookup(folder, key),
                              peek=lambda: shim.lookup(folder, key))
    if found is None:
        return None, lock
    shim.replay(found, source, output)
    spent = time.monotonic() - started
    shim.tally("hit", key, name, spent, found[3] - spent, meta, "after waiting for another process")
    return True, None


def miss(real, args, folder, key, meta, source, output, started, ptx_digest):
    """The key is not in the cache: run the real ptxas once (or wait for the process that
    runs it), keep its result, and answer as it did. Returns the exit code. Raises only
    before the real ptxas ran."""
    name = meta.split(shim.META_SEP, 1)[0]
    try:
        done, lock = _wait_for_leader(folder, key, source, output, started, name, meta)
    except Exception:
        done, lock = None, None
    if done:
        return 0
    try:
        run = capture(real, args, folder)
    except BaseException:
        if lock is not None:
            lock.release(wrote=False)
        raise
    if run is None:  # nowhere to catch its streams: it runs as the caller's, uncached
        if lock is not None:
            lock.release(wrote=False)
        shim.run_through(real, args, "not kept: the cache folder is read-only", "miss")
    try:
        why = _keep(folder, key, run, meta, source, output, ptx_digest)
    except Exception as exc:
        why = f"not kept: {exc!r}"
    if lock is not None:
        try:
            lock.release(wrote=not why)
        except Exception:
            pass
    code, stdout, stderr, seconds = run
    for stream, data in ((1, stdout), (2, stderr)):
        if data:
            try:
                shim.write_all(stream, data)
            except OSError:
                pass
    shim.tally("miss", key, name, seconds, 0.0, meta, why)
    return code
