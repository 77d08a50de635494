"""Single-flight across nodes (``flight`` in ``cluster`` mode): a lease per key in
the shared lock folder, beside the node's ``flock``. The node's leader of a key takes the
key's lease (``<lock>.<n>.lease``, made by the lock rules of ``locks``) or waits
for the node that holds it; a holder rewrites its beat every LEASE_BEAT seconds, and a lease
whose beat has not changed for LEASE_STALE seconds (or whose holder is dead) is passed over.
Standard library only, Python 3.9+.
"""

import os
import threading
import time

from .. import locks as lock_files

#: Longest sleep between two polls of a lease on the shared folder.
MAX_LEASE_POLL = 0.25
#: A lease holder rewrites its beat every LEASE_BEAT seconds; a lease unchanged for
#: LEASE_STALE seconds (the waiter's own clock) is passed over. A waiter on another node thus
#: goes on at most LEASE_STALE + MAX_LEASE_POLL seconds after its holder stopped or died.
LEASE_BEAT = 1.0
LEASE_STALE = 10.0


class Lease:
    """A lease this process holds: the open file, its content, the beat count."""

    def __init__(self, path, fd, head):
        self.path, self.fd, self.head, self.count = path, fd, head, 0

    def beat(self):
        """Rewrite the beat counter (in place, the same length: a reader sees the old or the
        new content) and flush it to the server, where a waiter on another node reads it."""
        self.count += 1
        os.pwrite(self.fd, self.head + b"beat %012d\n" % self.count, 0)
        try:
            os.fsync(self.fd)
        except OSError:
            pass

    def remove(self):
        try:
            if not lock_files.stale(self.fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            try:
                os.close(self.fd)
            except OSError:
                pass
        lower = lease_number(self.path)
        for n in range(lower):  # passed over before this one was made: stale, all of them
            try:
                os.unlink(lease_path(self.path, n))
            except OSError:
                pass


def lease_path(lock_path, n):
    """Lease number ``n`` of the key whose lock file (or any lease) is at ``lock_path``."""
    stem = lock_path[:-len(".lock")] if lock_path.endswith(".lock") else lock_path.rsplit(".", 2)[0]
    return f"{stem}.{n}.lease"


def lease_number(lease_path):
    return int(lease_path.rsplit(".", 2)[1])


def take(flight, path, group_bits):
    """Create the lease at ``path``; the held ``Lease``, or None where the create failed
    (whatever the error: it may exist, look again)."""
    try:
        fd = lock_files.create(path, group_bits)
    except OSError:
        return None
    me = lock_files.self_id()
    import uuid

    fields = "".join(f"{name} {me[name]}\n" for name in ("host", "boot", "pidns", "pid", "start"))
    head = lock_files.MAGIC + fields.encode("utf-8", "replace") + b"nonce %s\n" % uuid.uuid4().hex.encode()
    lease = Lease(path, fd, head)
    try:
        lease.beat()
    except OSError:
        lease.remove()
        return None
    with flight.mutex:
        flight.leases.add(lease)
        if flight.beat is None or not flight.beat.is_alive():
            flight.beat = threading.Thread(target=beat_loop, args=(flight,), name="gpu-cache-lease",
                                           daemon=True)
            flight.beat.start()
    return lease


def beat_loop(flight):
    """Beat every held lease every LEASE_BEAT seconds; ends when none is held."""
    while True:
        time.sleep(LEASE_BEAT)
        with flight.mutex:
            leases = list(flight.leases)
            if not leases:
                flight.beat = None
                return
        for lease in leases:
            try:
                lease.beat()
            except (OSError, ValueError):
                pass  # removed meanwhile


def wait_or_take(flight, kind, lock, folder, read, peek, deadline, stats, waiting):
    """Holding the node's lock of a key: take the key's lease across nodes, or wait for the
    node that holds it (``waiting``: the call's ``Waiting``). Returns ``(entry, go_on)``: the
    entry when it appeared (or was written meanwhile); else ``go_on`` True (this process
    compiles; ``lock.lease`` is set when it won the lease)."""
    n = 0
    seen = None  # (number, content, since) of the lease watched
    missing = 0
    delay = 0.01
    while True:
        path = lease_path(lock.path, n)
        lease = take(flight, path, folder[1])
        if lease is not None:
            lock.lease = lease
            waiting.look()
            found = read()
            return found, True
        looked = lock_files.read_small(path)
        if looked is None:  # the create failed, yet nothing is there: again, then give up
            missing += 1
            if missing > 20:
                flight.no_leases.setdefault(kind, f"cannot create lease files in {folder[0][:300]}")
                return None, True
            time.sleep(0.01)
            continue
        content, info = looked  # empty until its maker's first beat: judged by its beat alone
        why = lock_files.private(info, folder[1], folder[2])
        if why is not None:
            try:
                lock_files.set_aside(path, info)  # not a lease of ours: never waited on
                stats["replaced"] += 1
                continue
            except OSError:
                flight.no_leases.setdefault(kind, f"{os.path.basename(path)} is {why}")
                return None, True
        now = time.monotonic()
        if seen is None or seen[0] != n or seen[1] != content:
            seen = (n, content, now)
        waiting.begin(stats)
        if lock_files.holder_dead(lock_files.parse(content)) or now - seen[2] >= LEASE_STALE:
            stats["leases_passed"] += 1
            n += 1
            delay = 0.01
            continue
        if lock_files.read_small(lease_path(lock.path, n + 1)) is not None:  # another waiter passed it
            n += 1
            delay = 0.01
            continue
        waiting.look()
        found = peek() if peek is not None else None
        if found is not None:
            stats["hits_after_wait"] += 1
            return found, False
        if now >= deadline:
            stats["gave_up"] += 1
            return None, True
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 1.5, MAX_LEASE_POLL)
