"""Single-flight's host side: where the jobs' lock files go and in which mode
(:func:`plan`, which ``env.resolve`` combines with the rest), and the probes of a lock
folder that decide it: whether ``flock`` excludes there, and whether leases work (an
exclusive create that fails for a name that exists, and a write that a fresh open reads). A
diagnosis (doctor) writes no probe file: it asks for a shared lock on the folder instead.

The lock folder is ``<root>/locks``, else (a read-only or unusable root) a node-local one;
single-flight is off where ``flock`` works in neither. The mode is ``cluster`` (``flock``
within a node, a lease per key across nodes) on a filesystem that nodes may share and where
leases work, else ``node``. The job side is the startup hook's (``_hook/gpu_cache_hook/flight/__init__.py``).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from gpu_cache.config.settings import Settings
from gpu_cache.core import names
from gpu_cache.jobenv.fs import check_folder, may_write, node_local_fallback, why_not


@dataclass(frozen=True)
class LockPlan:
    """Where single-flight's locks are and in which mode, and why (what doctor and ``env
    --json`` show); ``problem``: why it is off; ``per_node``: it holds within one node only."""

    enabled: bool
    timeout_seconds: float
    locks: Path | None = None
    mode: names.LockMode | None = None
    why: str | None = None
    per_node: bool = False
    problem: str | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def as_dict(self) -> dict[str, object]:
        return {"enabled": self.enabled, "locks": None if self.locks is None else str(self.locks),
                "timeout_seconds": self.timeout_seconds, "problem": self.problem,
                "per_node": self.per_node, "mode": self.mode, "why": self.why}

    def variables(self) -> dict[str, str]:
        """What the startup hook reads in jobs (an empty lock folder: single-flight off)."""
        if not self.enabled:
            return {names.LOCKS_VAR: ""}
        return {names.LOCKS_VAR: str(self.locks), names.LOCK_TIMEOUT_VAR: f"{self.timeout_seconds:g}",
                names.LOCK_MODE_VAR: str(self.mode)}


def off(settings: Settings, why: str) -> LockPlan:
    """Single-flight off, for ``why``."""
    return LockPlan(False, settings.single_flight.timeout_seconds, problem=why)


def plan(settings: Settings, root: Path, root_problem: str | None) -> LockPlan:
    """Where single-flight's lock files go for the cache root ``root`` (``root_problem``: why
    it cannot be used), and in which mode."""
    if not settings.single_flight.enabled:
        return off(settings, "turned off in the config (single_flight.enabled: false)")
    fallback = node_local_fallback(names.LOCKS_FOLDER)
    places = [(fallback, fallback.parent, None)]
    if root_problem is None:
        places.insert(0, (root / names.LOCKS_FOLDER, root, settings.team))
    problems: list[str] = []
    for folder, above, group in places:
        check = check_folder(folder, team=group, min_free=0, trusted_above=above, probe=False)
        probes = may_write(folder, above)  # a diagnosis writes nothing: it asks without a probe file
        problem = check.problem or (flock_problem(folder) if probes else flock_refused(folder, above))
        if problem:
            problems.append(problem)
        elif problems:
            return LockPlan(True, settings.single_flight.timeout_seconds, folder, names.NODE,
                            f"node-local folder ({problems[0]})", per_node=True, warnings=(
                                f"single-flight: {problems[0]}; its locks are node-local in {folder}, "
                                "so single-flight holds within this node only",))
        else:
            return _mode(settings, folder, check.fs_type, check.network or check.family == "fuse", probes)
    return LockPlan(False, settings.single_flight.timeout_seconds, problem=problems[0], warnings=(
        f"single-flight is off (every job compiles what it misses): {'; '.join(problems)}",))


def _mode(settings: Settings, folder: Path, fs_type: str, shared: bool, probes: bool) -> LockPlan:
    """Single-flight in ``folder`` (on ``fs_type``; ``shared``: nodes may share it): ``cluster``
    where leases work on a shared filesystem (``probes``: tried; else assumed), else ``node``."""
    timeout = settings.single_flight.timeout_seconds
    if not shared:
        return LockPlan(True, timeout, folder, names.NODE, f"{fs_type} is local to this node")
    trouble = lease_problem(folder) if probes else None
    if trouble is None:
        return LockPlan(True, timeout, folder, names.CLUSTER,
                        f"{fs_type} may be shared by nodes, and flock there may lock within one node "
                        "only: flock within a node, a lease per key across nodes")
    return LockPlan(True, timeout, folder, names.NODE, f"leases do not work on {fs_type}: {trouble}",
                    per_node=True, warnings=(
                        f"single-flight: {folder} is on {fs_type}, where flock often locks within one "
                        f"node only, and {trouble}: single-flight is per node there, and jobs on two "
                        "nodes may compile the same key at once",))


#: What flock(2) answers where a filesystem does not lock (a probe file also hears EINVAL there).
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def lease_problem(folder: Path) -> str | None:
    """Whether single-flight's leases work in ``folder``: an exclusive create makes the file
    once and fails for a name that exists (with any error: sshfs often says EPERM), and what
    one descriptor writes a fresh open reads. What is wrong, in a few words, or None. Uses a
    probe file it removes; never raises."""
    import uuid

    probe = folder / f"{names.PROBE_PREFIX}lease-{uuid.uuid4().hex}"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = -1
    try:
        fd = os.open(probe, flags, 0o600)
        os.write(fd, b"beat 1\n")
        os.fsync(fd)
        try:
            os.close(os.open(probe, flags, 0o600))
            return f"an exclusive create in {folder} succeeds for a name that exists"
        except OSError:
            pass
        with open(probe, "rb") as again:
            if again.read() != b"beat 1\n":
                return f"a fresh open in {folder} does not read what was written"
        return None
    except OSError as exc:
        return f"cannot test leases in {folder}: {why_not(exc)}"
    finally:
        _remove_probe(probe, fd)


def flock_problem(folder: Path) -> str | None:
    """Whether ``flock`` locks work in ``folder`` as single-flight needs them: two open file
    descriptions of one file must exclude each other, and an unlock must let the second in.
    What is wrong, in a few words, or None. Uses a probe file it removes; never raises."""
    import fcntl
    import uuid

    probe = folder / f"{names.PROBE_PREFIX}flock-{uuid.uuid4().hex}"
    first = second = -1
    try:
        first = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        second = os.open(probe, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f"flock does not lock in {folder}: two opens of one file both got the lock"
        except BlockingIOError:
            pass
        fcntl.flock(first, fcntl.LOCK_UN)
        fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except OSError as exc:
        if exc.errno in _UNSUPPORTED or exc.errno == errno.EINVAL:
            return f"flock is not supported in {folder} ({exc.strerror or exc})"
        return f"cannot test flock in {folder}: {why_not(exc)}"
    finally:
        _remove_probe(probe, first, second)


def flock_refused(folder: Path, above: Path) -> str | None:
    """What a diagnosis learns of ``flock`` in ``folder`` (else, where it does not exist yet,
    in ``above``) without writing: a non-blocking shared lock on the folder itself, refused as
    unsupported (Lustre mounted without ``flock`` answers ENOSYS), is a problem; any other
    answer says nothing (None). Never raises."""
    import fcntl

    for place in (folder, above):
        try:
            fd = os.open(place, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:  # (not EINVAL: that may be the folder's, not the filesystem's)
                return f"flock is not supported in {folder} ({exc.strerror or exc})"
            return None
        finally:
            os.close(fd)
    return None


def _remove_probe(probe: Path, *fds: int) -> None:
    """Close a probe file's descriptors (-1: not opened) and remove it; never raises."""
    for fd in fds:
        if fd >= 0:
            os.close(fd)
    try:
        probe.unlink()
    except OSError:
        pass
