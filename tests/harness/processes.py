"""This machine's processes as the tests' daemons harness (tests/harness/daemons.py) sees them:
an executable found where daemons live, a process alive by pid and start time, its command line
and children, the processes that mention a path or sit in a network namespace, termination
with a grace period, a free port and who listens on it, and what is mounted at a path."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def which(name: str) -> str | None:
    """Find ``name`` on PATH or in the sbin folders (root's PATH may lack them)."""
    return shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(_SBIN_DIRS))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    return [child for child in _pids()
            if (fields := _stat_fields(child)) and fields[0] != "Z" and fields[1] == str(pid)]


def _ancestors(pid: int) -> set[int]:
    chain = {pid}
    while pid > 1 and (fields := _stat_fields(pid)):
        pid = int(fields[1])
        chain.add(pid)
    return chain


def processes_referencing(marker: str) -> list[int]:
    """Pids whose command line mentions ``marker``, or whose ``SLURM_CONF`` starts with it.

    Never this process or its ancestors (a shell that exported ``SLURM_CONF`` must survive)."""
    spared = _ancestors(os.getpid())
    found = []
    for pid in _pids():
        if pid in spared or not pid_alive(pid):
            continue
        if marker not in cmdline(pid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if f"SLURM_CONF={marker}" not in environ:
                continue
        found.append(pid)
    return found


def _netns_id(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def processes_in_netns(netns_path: str) -> list[int]:
    """Pids in the network namespace bound at ``netns_path`` (never this process's own)."""
    wanted = _netns_id(netns_path)
    if wanted is None or wanted == _netns_id("/proc/self/ns/net"):
        return []
    return [pid for pid in _pids() if _netns_id(f"/proc/{pid}/ns/net") == wanted and pid_alive(pid)]


def terminate(pid: int, proc: subprocess.Popen[Any] | None = None, grace: float = 10.0) -> bool:
    """SIGTERM, wait up to ``grace`` s, then SIGKILL. True if the process is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if (proc.poll() is not None) if proc is not None else not pid_alive(pid):
                break
            time.sleep(0.05)
        else:
            continue
        break
    if proc is not None:
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        return proc.poll() is not None
    return not pid_alive(pid)


def terminate_all(pids: Iterable[int], grace: float = 5.0) -> list[int]:
    """SIGTERM to all of ``pids`` at once, SIGKILL to those left after ``grace`` s; the survivors."""
    left = [pid for pid in pids if pid_alive(pid)]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while (left := [pid for pid in left if pid_alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not left:
            break
    return left


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"  ({path} does not exist)"
    return "\n".join("  " + line for line in text.splitlines()[-lines:])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for daemons on :data:`HOST`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(pid: int, port: int) -> bool:
    """True if a socket in ``pid``'s network namespace listens on TCP ``port`` (read from
    ``/proc/<pid>/net``, so it works for a daemon in any namespace, without connecting)."""
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def _unescape(field: str) -> str:
    """A /proc/mounts field with its octal escapes (``\\040`` for a space) decoded."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounted_type(point: str | os.PathLike[str], pid: int | str = "self") -> str | None:
    """The file system type mounted exactly at ``point`` (the last mount there) in ``pid``'s
    mount namespace, or None."""
    target = os.path.abspath(point)
    found = None
    try:
        with open(f"/proc/{pid}/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3 and _unescape(fields[1]) == target:
                    found = fields[2]
    except OSError:
        return None
    return found

