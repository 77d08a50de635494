"""The one harness for the tests' daemons (SLURM, sshd) and for the nodes they run on.

Processes (:class:`Daemons`). Each daemon is a direct child in its own session, so that its pid
is the daemon's (``munged --foreground``, ``slurmd -D``, ``sshd -D``, ``sshfs -f``), with its
output in ``<log_dir>/<name>.log``. :meth:`Daemons.wait` polls a readiness check and fails at
once, with the tail of every log, when a daemon it waits on dies; :meth:`Daemons.stop` ends the
daemons in reverse start order (SIGTERM, then SIGKILL) and says which survived.

Records. Each :class:`Daemons` keeps ``record.json`` in its own runtime folder under
:data:`RUNTIME_BASE` (``/var/tmp/gpu-cache-tests``): the owner's pid and start time, the pid and
start time of every process it started, the network namespaces it made, the host mounts it
made, and markers (paths that its job processes mention). Runtime files (munge's socket,
records) live there, outside ``/tmp``, because a node hides ``/tmp`` behind its own tmpfs, and
UNIX socket paths must stay under 108 bytes. Before it starts anything, :meth:`Daemons.open`
sweeps: a record whose owner died (a SIGKILLed pytest), or that names the same work folder, is
taken for leftovers; exactly its processes (pid and start time must match), the processes in
its namespaces, and those that mention its markers are killed, its mounts unmounted, its
namespaces deleted, its folder removed. Nothing else is touched.

Nodes (:class:`Node`). Every daemon is started on a node: :data:`HOST` (this machine, as it
is) or a :class:`NamespaceNode`: its own network, UTS and mount namespaces (its own hostname,
its own tmpfs on ``/tmp``, its own ``/etc/hosts``), entered for each command with ``nsenter``
into a holder process that was started as ``nsenter --net=/run/netns/X unshare --uts --mount
--propagation private``. (``ip netns exec`` would remount ``/sys``, and slurmd then finds no
cgroup filesystem.) Everything a node needs besides ``/tmp`` (the Python, this checkout, the
SLURM configuration, the runtime folders) is the host's file system as it is. A
:class:`Network` puts namespaced nodes on one bridge, in a private ``/24`` that exists only
inside their namespaces: no interface and no route on the host, nothing reaches out.

``node.run(argv, env=...)`` runs a command on a node and returns the completed process;
``node.popen(...)`` starts one. The two-node set-up the tests share (fixture ``two_nodes``:
nodes ``a`` and ``b``, a head node and a storage node that exports one shared folder over
sshfs) is :class:`nodes.TwoNodes`; its docstring shows how tests use it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from processes import (
    cmdline,
    mounted_type,
    pid_alive,
    processes_in_netns,
    processes_referencing,
    start_time,
    tail,
    terminate,
    terminate_all,
    which,
)

__all__ = ["HOST", "RUNTIME_BASE", "DaemonError", "Daemons", "NamespaceNode", "Network", "Node",
           "live_record_for", "unmount"]

#: Where runtime folders and records live (outside /tmp: a node may hide it behind a tmpfs).
RUNTIME_BASE = Path(os.environ.get("GPU_CACHE_TEST_RUNTIME") or "/var/tmp/gpu-cache-tests")
_RECORD = "record.json"


class DaemonError(RuntimeError):
    """A daemon or node did not start, or did not stop (the message has the log tails)."""


# ------------------------------------------------------------------ nodes


class Node:
    """Where a process runs: this class is this machine (:data:`HOST`); see :class:`NamespaceNode`."""

    name = "host"
    hostname: str = socket.gethostname().split(".")[0]
    address = "127.0.0.1"
    #: Folders this node has of its own (not the host's): keep shared files elsewhere.
    local_paths: tuple[str, ...] = ()

    def command(self, argv: Sequence[str], *, user: str | None = None, cwd: str | None = None) -> list[str]:
        """``argv`` as run on this node (as ``user`` when given; a namespaced node also changes to
        ``cwd`` after entering, as it sees that folder)."""
        as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user else []
        return [*as_user, *argv]

    def _cwd(self, cwd: str | os.PathLike[str] | None) -> str | None:
        """The cwd to give Popen (a namespaced node changes folder after entering)."""
        return None if cwd is None else str(cwd)

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None, user: str | None = None,
              **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on this node (``env`` as given, else this process's)."""
        return subprocess.Popen(self.command(argv, user=user, cwd=None if cwd is None else str(cwd)),
                                env=dict(env) if env is not None else None, cwd=self._cwd(cwd), **popen)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None, timeout: float = 120, check: bool = False,
            input: str | None = None, user: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this node and return it, its output captured as text."""
        return subprocess.run(self.command(argv, user=user, cwd=None if cwd is None else str(cwd)),
                              env=dict(env) if env is not None else None, cwd=self._cwd(cwd),
                              input=input, capture_output=True, text=True, timeout=timeout, check=check)

    def mounted_type(self, point: str | os.PathLike[str]) -> str | None:
        """The file system type mounted at ``point`` as this node sees it."""
        return mounted_type(point)

    def sees(self, path: str | os.PathLike[str]) -> bool:
        """False if ``path`` lies in a folder this node has of its own (e.g. its ``/tmp``)."""
        path = os.path.abspath(path)
        return not any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.local_paths)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.hostname}, {self.address})>"


#: This machine, as it is.
HOST = Node()


class NamespaceNode(Node):
    """A node in its own network, UTS and mount namespaces, entered through its holder process.

    Its hostname is ``hostname``, its address ``address`` on the :class:`Network`'s bridge, its
    ``/tmp`` a tmpfs of its own (``local_paths``), its ``/etc/hosts`` names every node of the
    network. A mount made on it (``node.run(["mount", ...])``) stays on it."""

    local_paths = ("/tmp",)

    def __init__(self, name: str, hostname: str, address: str, netns: str, holder: int) -> None:
        self.name, self.hostname, self.address = name, hostname, address
        self.netns, self.holder = netns, holder

    def command(self, argv: Sequence[str], *, user: str | None = None, cwd: str | None = None) -> list[str]:
        enter = ["nsenter", "-t", str(self.holder), "--net", "--uts", "--mount"]
        if cwd is not None:
            enter.append(f"--wdns={cwd}")  # a folder as the node sees it (e.g. on its own mount)
        return [*enter, "--", *super().command(argv, user=user)]

    def _cwd(self, cwd: str | os.PathLike[str] | None) -> str | None:
        return None

    def mounted_type(self, point: str | os.PathLike[str]) -> str | None:
        return mounted_type(point, self.holder)

    def processes(self) -> list[int]:
        """Every process on this node (in its network namespace)."""
        return processes_in_netns(f"/run/netns/{self.netns}")


# ------------------------------------------------------------------ records and daemons


def _owner_alive(record: Mapping[str, Any]) -> bool:
    owner = record.get("owner")
    if not isinstance(owner, int) or not pid_alive(owner):
        return False
    return record.get("owner_start") in (None, start_time(owner))


def records() -> list[tuple[Path, dict[str, Any]]]:
    """(runtime folder, record) of every harness object that has a record, dead or alive."""
    found = []
    for folder in sorted(RUNTIME_BASE.glob("*/")) if RUNTIME_BASE.is_dir() else []:
        try:
            data = json.loads((folder / _RECORD).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            found.append((folder, data))
    return found


def live_record_for(workdir: Path) -> bool:
    """True if a harness object whose owner still runs records ``workdir``."""
    return any(data.get("workdir") == str(workdir) and _owner_alive(data) for _f, data in records())


def _clean(folder: Path, data: Mapping[str, Any]) -> None:
    """Remove what one (dead) record names: see the module's docstring."""
    for pid, started in dict(data.get("pids") or {}).values():
        if isinstance(pid, int) and pid_alive(pid) and start_time(pid) == started:
            terminate(pid, grace=5.0)
    for netns in data.get("netns") or []:
        terminate_all(processes_in_netns(f"/run/netns/{netns}"), grace=2.0)
        subprocess.run(["ip", "netns", "delete", str(netns)], capture_output=True, timeout=30, check=False)
    for marker in data.get("markers") or []:
        if marker:
            for pid in processes_referencing(str(marker)):
                terminate(pid, grace=5.0)
    for point in data.get("mounts") or []:
        unmount(HOST, str(point))
    shutil.rmtree(folder, ignore_errors=True)


def unmount(node: Node, point: str) -> str | None:
    """Unmount ``point`` on ``node`` if something is mounted there: ``fusermount3 -u`` for a FUSE
    mount (fails with EBUSY while a process uses it), else or then a lazy ``umount -l``. Why it
    failed, or None."""
    kind = node.mounted_type(point)
    if kind is None:
        return None
    errors = []
    fusermount = which("fusermount3") or which("fusermount")
    attempts = ([[fusermount, "-u", point]] if fusermount and kind.startswith("fuse") else [])
    for argv in [*attempts, ["umount", "-l", point]]:
        result = node.run(argv, timeout=30)
        if node.mounted_type(point) is None:
            return None
        errors.append(f"{' '.join(argv)}: {(result.stderr or result.stdout).strip()}")
    return "; ".join(errors)


class Daemons:
    """The processes one harness object starts, and its record (see the module's docstring).

    Args:
        kind: a short name for the runtime folder (``slurm``, ``sshfs``, ``nodes``).
        workdir: the folder of configuration and logs; an earlier object's record that names the
            same folder is swept whatever its owner. None: the runtime folder itself.
        log_dir: where each daemon's output goes (default ``<workdir>/log``).
        error: the exception type to raise.
    """

    def __init__(self, kind: str, workdir: Path | None, *, log_dir: Path | None = None,
                 error: type[Exception] = DaemonError, start_timeout: float = 60.0) -> None:
        self.kind = kind
        self.workdir = Path(workdir).absolute() if workdir is not None else None
        self.log_dir = log_dir or (self.workdir / "log" if self.workdir is not None else None)
        self.error = error
        self.start_timeout = start_timeout
        self.runtime_dir: Path | None = None
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self._nodes: dict[str, Node] = {}
        self._extra: dict[str, list[str]] = {"netns": [], "mounts": [], "markers": []}
        self._handles: list[IO[bytes]] = []

    def open(self) -> Path:
        """Sweep leftovers, make the runtime folder (0755) and write the record. Returns the folder."""
        for folder, data in records():
            same = self.workdir is not None and data.get("workdir") == str(self.workdir)
            if same or not _owner_alive(data):
                _clean(folder, data)
        RUNTIME_BASE.mkdir(parents=True, exist_ok=True)
        RUNTIME_BASE.chmod(0o755)  # munged walks to its socket as the munge user
        self.runtime_dir = Path(tempfile.mkdtemp(prefix=f"{self.kind}-", dir=RUNTIME_BASE))
        self.runtime_dir.chmod(0o755)
        if self.workdir is None:
            self.workdir = self.runtime_dir
        if self.log_dir is None:
            self.log_dir = self.workdir / "log"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.save()
        return self.runtime_dir

    def note(self, key: str, value: str) -> None:
        """Record a network namespace (``netns``), a host mount (``mounts``) or a ``markers`` path."""
        self._extra[key].append(value)
        self.save()

    def noted(self, key: str) -> list[str]:
        return list(self._extra[key])

    def forget(self, key: str, value: str) -> None:
        if value in self._extra[key]:
            self._extra[key].remove(value)
            self.save()

    def save(self) -> None:
        if self.runtime_dir is None:
            return
        me = os.getpid()
        record = {"owner": me, "owner_start": start_time(me), "kind": self.kind, "workdir": str(self.workdir),
                  "pids": {name: [p.pid, start_time(p.pid)] for name, p in self.procs.items()},
                  **self._extra}
        temp = self.runtime_dir / f".{_RECORD}.tmp"
        temp.write_text(json.dumps(record, indent=1))
        temp.replace(self.runtime_dir / _RECORD)

    def spawn(self, name: str, argv: Sequence[str], *, node: Node = HOST, user: str | None = None,
              env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
              ) -> subprocess.Popen[Any]:
        """Start a daemon in the foreground on ``node``, in a session of its own; its output goes to
        ``<log_dir>/<name>.log``."""
        binary = which(argv[0])
        if binary is None:
            raise self.error(f"{argv[0]} is not installed")
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the daemon writes it until stop()
        self._handles.append(log)
        proc = node.popen([binary, *argv[1:]], env=env, cwd=cwd if cwd is not None else self.workdir,
                          user=user, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True)
        self.procs[name] = proc
        self._nodes[name] = node
        self.save()
        return proc

    def wait(self, what: str, ready: Callable[[], bool], names: Iterable[str] = (),
             timeout: float | None = None) -> None:
        """Poll ``ready`` until it is true; fail early, with the log tails, if a daemon in ``names``
        (default: all) dies."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        names = list(names) or list(self.procs)
        while True:
            for name in names:
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise self.error(f"{name} exited with code {proc.returncode} while waiting for "
                                     f"{what}\n{self.logs()}")
            try:
                if ready():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            if time.monotonic() > deadline:
                raise self.error(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, lines: int = 25, folders: Iterable[Path] = ()) -> str:
        """The tails of the logs in the log folder (and ``folders``)."""
        parts = []
        for folder in [self.log_dir, *folders]:
            for path in sorted(folder.glob("*.log")) if folder.is_dir() else []:
                name = path.name if folder == self.log_dir else f"{folder.name}/{path.name}"
                parts.append(f"--- {name}\n{tail(path, lines)}")
        return "\n".join(parts)

    def end(self, name: str, grace: float = 10.0) -> str | None:
        """Stop one daemon; its description if it survived."""
        proc = self.procs.pop(name, None)
        self._nodes.pop(name, None)
        self.save()
        if proc is None or terminate(proc.pid, proc, grace):
            return None
        return f"{name} (pid {proc.pid})"

    def stop(self) -> list[str]:
        """End every daemon, newest first; what survived."""
        survivors = [s for name in reversed(list(self.procs)) if (s := self.end(name))]
        return survivors

    def close(self) -> None:
        """Close the logs, remove the runtime folder (with the record). Call after :meth:`stop`."""
        for handle in self._handles:
            try:
                handle.close()
            except OSError:
                pass
        self._handles.clear()
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = None


class Network:
    """Namespaced nodes on one bridge (see the module's docstring).

    The bridge lives in a namespace of its own (``<prefix>-sw``); each node's ``eth0`` is one end
    of a veth pair whose other end is on the bridge. Both ends are made inside the namespaces,
    so the host never has an interface, an address or a route of this network.

    Args:
        daemons: records the namespaces and holds the node's holder processes.
        prefix: short, unique: the namespaces are ``<prefix>-<node name>`` in ``/run/netns``.
        subnet: the first three octets of the private ``/24``.
        local_tmp_size: size of each node's ``/tmp`` tmpfs.
    """

    def __init__(self, daemons: Daemons, prefix: str, *, subnet: str = "10.251.0",
                 local_tmp_size: str = "2g") -> None:
        self.daemons, self.prefix, self.subnet, self.local_tmp_size = daemons, prefix, subnet, local_tmp_size
        self.nodes: dict[str, NamespaceNode] = {}
        self.hosts_file = daemons.workdir / "hosts"

    @staticmethod
    def missing() -> list[str]:
        """What this machine lacks for namespaced nodes (empty if nothing)."""
        missing = [name for name in ("ip", "nsenter", "unshare", "setpriv", "sleep") if which(name) is None]
        if os.geteuid() != 0:
            missing.append("root")
        elif not missing:  # e.g. a container without CAP_SYS_ADMIN
            probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True,
                                   text=True, timeout=30, check=False)
            if probe.returncode != 0:
                missing.append(f"namespaces ({probe.stderr.strip()})")
        return missing

    def _ip(self, *args: str) -> None:
        result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
        if result.returncode != 0:
            raise self.daemons.error(f"ip {' '.join(args)}: {result.stderr.strip()}")

    def _netns(self, name: str) -> str:
        netns = f"{self.prefix}-{name}"
        self.daemons.note("netns", netns)  # recorded first: a crash now still deletes it
        self._ip("netns", "add", netns)
        self._ip("-n", netns, "link", "set", "lo", "up")
        return netns

    def start(self, nodes: Sequence[tuple[str, str, int]]) -> dict[str, NamespaceNode]:
        """Make the bridge and one node per (name, hostname, last octet); return them by name."""
        switch = self._netns("sw")
        self._ip("-n", switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", switch, "link", "set", "br0", "up")
        hosts = ["127.0.0.1 localhost", *(f"{self.subnet}.{octet} {host}" for _n, host, octet in nodes)]
        self.hosts_file.write_text("\n".join(hosts) + "\n")
        # A node's holder: sets the hostname and the node's own mounts, then keeps the namespaces.
        setup = ('set -e; hostname "$1"; mount -t tmpfs -o "size=$2,mode=1777" gc-node-local /tmp; '
                 'mount --bind "$3" /etc/hosts; echo ready; exec sleep infinity')
        for name, hostname, octet in nodes:
            netns = self._netns(name)
            port = f"v{name}"[:15]
            self._ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                     "netns", netns)
            self._ip("-n", switch, "link", "set", port, "master", "br0")
            self._ip("-n", switch, "link", "set", port, "up")
            self._ip("-n", netns, "addr", "add", f"{self.subnet}.{octet}/24", "dev", "eth0")
            self._ip("-n", netns, "link", "set", "eth0", "up")
            holder = self.daemons.spawn(
                f"node-{name}",
                ["nsenter", f"--net=/run/netns/{netns}", "unshare", "--uts", "--mount", "--propagation",
                 "private", "--", "sh", "-c", setup, "sh", hostname, self.local_tmp_size,
                 str(self.hosts_file)])
            log = self.daemons.log_dir / f"node-{name}.log"
            self.daemons.wait(f"node {name}", lambda log=log: "ready" in log.read_text(), [f"node-{name}"])
            self.nodes[name] = NamespaceNode(name, hostname, f"{self.subnet}.{octet}", netns, holder.pid)
        return self.nodes

    def stop(self) -> list[str]:
        """Kill every process on the nodes, delete the namespaces; what survived."""
        survivors = []
        for node in self.nodes.values():
            others = [pid for pid in node.processes() if pid != node.holder]
            survivors += [f"{cmdline(pid)} (pid {pid}, on {node.name})" for pid in terminate_all(others)]
            if survivor := self.daemons.end(f"node-{node.name}", grace=2.0):
                survivors.append(survivor)
        for netns in self.daemons.noted("netns"):
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True, timeout=30, check=False)
            if Path(f"/run/netns/{netns}").exists():
                survivors.append(f"network namespace {netns}")
            else:
                self.daemons.forget("netns", netns)
        self.nodes.clear()
        return survivors
