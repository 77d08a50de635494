"""A real, throw-away sshfs mount for tests: a network file system on one machine.

``SshfsMount`` starts, on the harness of tests/harness/daemons.py (nothing in ``/etc/ssh``, no systemd):

* a private ``sshd`` with its own host key and configuration in the work folder (public-key
  authentication only, root login allowed by key, the in-process ``internal-sftp`` server),
  on ``127.0.0.1`` and a free port, or, with ``server=node``, on a namespaced node's address,
  port 22,
* a client key in the work folder, authorized for that sshd only,
* ``sshfs -f`` (in the foreground, so that its pid is ours) that mounts the server-side folder
  ``<workdir>/server`` onto ``<workdir>/mnt``. The mount is ``fuse.sshfs`` in ``/proc/mounts``,
  exactly what a user's sshfs mount of a remote machine is.

:meth:`SshfsMount.mount` mounts the same server folder again elsewhere, or on another node
(``node=``): a second client, as a second node sees the share (FUSE keeps locks and caches per
mount, so this is what two machines see, not what two processes on one machine see).

:meth:`SshfsMount.stop` unmounts every mount point (``fusermount3 -u``, else ``umount -l`` when
something still holds it), waits for each ``sshfs`` to exit, then stops ``sshd`` and the
per-connection children it forked, and checks that none survived. :meth:`SshfsMount.start` first
sweeps leftovers (see tests/harness/daemons.py: an earlier session in the same work folder, and any
whose owner died). Outside the work folder it touches only its runtime folder under
``daemons.RUNTIME_BASE`` and creates ``/run/sshd`` (sshd's privilege separation folder) when it
is missing. It needs root, ``/dev/fuse`` and the binaries in :data:`SSHFS_BINARIES`
(``.ci/install-sshfs.sh`` installs them).

Usage::

    with SshfsMount(tmp_path / "sshfs") as share:
        (share.mount_point / "a").write_text("over ssh")
        assert (share.server_dir / "a").read_text() == "over ssh"

Run ``python tests/harness/sshfs_mount.py DIR`` to mount one by hand (Ctrl-C or SIGTERM unmounts it).
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from daemons import HOST, Daemons, Node, unmount
from processes import children, cmdline, free_port, listening, terminate, which
from processes import mounted_type as _mounted_type

__all__ = [
    "SSHFS_BINARIES",
    "SshfsMount",
    "SshfsMountError",
    "missing_requirements",
    "mounted_type",
]

#: Every executable the harness runs.
SSHFS_BINARIES: tuple[str, ...] = ("sshd", "ssh", "ssh-keygen", "sshfs")


class SshfsMountError(RuntimeError):
    """sshd or sshfs did not start, or a mount could not be removed (message has the log tails)."""


def missing_requirements() -> list[str]:
    """What this machine lacks for a loopback sshfs mount: binaries, ``/dev/fuse``, a
    ``fusermount``, root. Empty when everything is there."""
    missing = [name for name in SSHFS_BINARIES if which(name) is None]
    if which("fusermount3") is None and which("fusermount") is None:
        missing.append("fusermount3")
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse")
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def mounted_type(point: str | os.PathLike[str]) -> str | None:
    """The file system type mounted exactly at ``point`` (the last mount there), or None."""
    return _mounted_type(point)


def _account_locked(user: str) -> bool:
    """True if ``user``'s password field starts with ``!`` (sshd without PAM refuses such
    accounts even for key logins; with PAM it lets them in)."""
    try:
        with open("/etc/shadow") as shadow:
            for line in shadow:
                name, _, rest = line.partition(":")
                if name == user:
                    return rest.startswith("!")
    except OSError:
        pass
    return False


class SshfsMount:
    """An sshfs mount of ``<workdir>/server`` on ``<workdir>/mnt``.

    Args:
        workdir: folder for keys, configuration, logs, the server-side folder and the mount
            points (created if missing; leftovers of a previous session there are swept first).
            With ``server`` or client nodes, a folder those nodes see (not under ``/tmp``).
        sshfs_options: extra ``-o`` options for every sshfs mount (e.g. ``dir_cache=no``).
        start_timeout: seconds to wait for sshd to listen and for each mount to appear.
        server: the node sshd runs on (default: this machine, on 127.0.0.1).
    """

    def __init__(self, workdir: str | os.PathLike[str], *, sshfs_options: Sequence[str] = (),
                 start_timeout: float = 30.0, server: Node = HOST) -> None:
        self.workdir: Path = Path(workdir).absolute()
        self.server_dir: Path = self.workdir / "server"
        self.mount_point: Path = self.workdir / "mnt"
        self.log_dir: Path = self.workdir / "log"
        self.sshfs_options = tuple(sshfs_options)
        self.start_timeout = start_timeout
        self.server = server
        self.user: str = pwd.getpwuid(os.geteuid()).pw_name
        self.port: int | None = None
        self.host_key: Path = self.workdir / "ssh_host_ed25519_key"
        self.client_key: Path = self.workdir / "client_ed25519_key"
        self.sshd_config: Path = self.workdir / "sshd_config"
        self.start_seconds: float | None = None
        self._daemons = Daemons("sshfs", self.workdir, log_dir=self.log_dir, error=SshfsMountError,
                                start_timeout=start_timeout)
        #: (node, mount point) of each mount, by its daemon name, in mount order.
        self._mounts: dict[str, tuple[Node, Path]] = {}

    @property
    def runtime_dir(self) -> Path | None:
        return self._daemons.runtime_dir

    # ------------------------------------------------------------------ public API

    def start(self, *, mount: bool = True) -> SshfsMount:
        """Start sshd and (unless ``mount=False``) mount :attr:`server_dir` on
        :attr:`mount_point` on this machine. Returns ``self``.

        Raises:
            SshfsMountError: something is missing, or sshd or sshfs did not come up
                (the message has the log tails). What was started is stopped again.
        """
        missing = missing_requirements()
        if missing:
            raise SshfsMountError(f"an sshfs mount needs: {', '.join(missing)}")
        t0 = time.monotonic()
        try:
            self._daemons.open()
            self._prepare()
            self._start_sshd()
            if mount:
                self.mount(self.mount_point)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def mount(self, point: str | os.PathLike[str] | None = None, *, node: Node = HOST) -> Path:
        """Mount the server folder (again) on ``point`` (default: a new folder in the work
        folder) on ``node``, with a sshfs process of its own, and return the mount point."""
        sshd = self._daemons.procs.get("sshd")
        if sshd is None or sshd.poll() is not None:
            raise SshfsMountError("sshd is not running: call start() first")
        where = Path(point) if point is not None else self.workdir / f"mnt{len(self._mounts) + 1}"
        where = where.absolute()
        if node is HOST:
            where.mkdir(parents=True, exist_ok=True)
        else:
            node.run(["mkdir", "-p", str(where)], check=True)
        options = [f"IdentityFile={self.client_key}", "StrictHostKeyChecking=no",
                   "UserKnownHostsFile=/dev/null", f"port={self.port}", "BatchMode=yes",
                   "LogLevel=ERROR", *self.sshfs_options]
        name = f"sshfs-{node.name}-{where.name}-{len(self._mounts)}"
        if node is HOST:
            self._daemons.note("mounts", str(where))  # a mount on another node ends with the node
        argv = ["sshfs", "-f", "-o", ",".join(options),
                f"{self.user}@{self.server.address}:{self.server_dir}", str(where)]
        self._daemons.spawn(name, argv, node=node)
        self._mounts[name] = (node, where)
        self._daemons.wait(f"the sshfs mount on {where} on {node.name}",
                           lambda: node.mounted_type(where) == "fuse.sshfs", [name],
                           timeout=self.start_timeout)
        return where

    @property
    def mount_points(self) -> list[Path]:
        """Every mount point this object mounted and has not unmounted, in mount order."""
        return [point for _node, point in self._mounts.values()]

    def unmount(self, point: str | os.PathLike[str], *, node: Node = HOST) -> None:
        """Unmount one mount point on ``node`` and wait for its sshfs process to exit."""
        where = Path(point).absolute()
        failure = unmount(node, str(where))
        for name, (mounted_on, mounted_at) in list(self._mounts.items()):
            if mounted_on is node and mounted_at == where:
                del self._mounts[name]
                proc = self._daemons.procs.get(name)
                if proc is not None:
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                self._daemons.end(name)
        if node is HOST:
            self._daemons.forget("mounts", str(where))
        if failure:
            raise SshfsMountError(f"cannot unmount {where} on {node.name}: {failure}")

    def stop(self) -> None:
        """Unmount everything, stop sshd and its connection children, clean up.

        Safe to call more than once. Raises :class:`SshfsMountError` if a mount or a
        process survived."""
        survivors: list[str] = []
        for node, point in reversed(list(self._mounts.values())):
            try:
                self.unmount(point, node=node)
            except SshfsMountError as exc:
                survivors.append(str(exc))
        sshd = self._daemons.procs.get("sshd")
        connections = children(sshd.pid) if sshd is not None else []
        survivors += self._daemons.stop()
        for pid in connections:  # per-connection sshd processes (they exit with the client)
            if not terminate(pid):
                survivors.append(f"{cmdline(pid)} (pid {pid})")
        self._daemons.close()
        if survivors:
            raise SshfsMountError("survived stop(): " + "; ".join(survivors))

    def logs(self, lines: int = 20) -> str:
        """The tails of sshd's and every sshfs's log."""
        return self._daemons.logs(lines)

    def __enter__(self) -> SshfsMount:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _prepare(self) -> None:
        for folder in (self.workdir, self.server_dir, self.mount_point, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        for key in (self.host_key, self.client_key):
            if not key.exists():
                subprocess.run([which("ssh-keygen") or "ssh-keygen", "-q", "-t", "ed25519",
                                "-N", "", "-C", f"gpu-cache-test-{key.name}", "-f", str(key)],
                               check=True, capture_output=True, timeout=30)
            key.chmod(0o600)  # ssh and sshd refuse private keys others can read
        authorized = self.workdir / "authorized_keys"
        authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)

    def _write_sshd_config(self) -> None:
        # Without PAM, sshd refuses a locked account ("!" password) even for key logins.
        use_pam = _account_locked(self.user) and Path("/etc/pam.d/sshd").exists()
        self.sshd_config.write_text("\n".join([
            "# private sshd for tests/harness/sshfs_mount.py; not the system's",
            f"ListenAddress {self.server.address}:{self.port}",
            f"HostKey {self.host_key}",
            "PidFile none",
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
            "AuthenticationMethods publickey",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            f"AllowUsers {self.user}",
            f"UsePAM {'yes' if use_pam else 'no'}",
            "StrictModes no",  # pytest's temp folders are not owned the way sshd wants
            "UseDNS no",
            "X11Forwarding no",
            "PrintMotd no",
            "MaxStartups 64",
            "Subsystem sftp internal-sftp",
            "LogLevel INFO",
            "",
        ]))

    def _start_sshd(self) -> None:
        sshd = which("sshd") or "/usr/sbin/sshd"
        for attempt in range(3):  # on this machine, the free port may be taken before sshd binds it
            self.port = free_port() if self.server is HOST else 22  # a node's namespace is ours alone
            self._write_sshd_config()
            test = subprocess.run([sshd, "-t", "-f", str(self.sshd_config)], capture_output=True,
                                  text=True, timeout=30, check=False)
            if test.returncode != 0:
                raise SshfsMountError(f"sshd rejects its configuration: {test.stderr.strip()}")
            # -D: stay in the foreground (our child); -e: log to stderr (the log file).
            proc = self._daemons.spawn("sshd", [sshd, "-D", "-e", "-f", str(self.sshd_config)],
                                       node=self.server)
            try:
                self._daemons.wait(f"sshd on port {self.port}",
                                   lambda proc=proc, port=self.port: listening(proc.pid, port), ["sshd"])
                return
            except SshfsMountError:
                if proc.poll() is None or attempt == 2:
                    raise
                self._daemons.end("sshd")


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/harness/sshfs_mount.py WORKDIR", file=sys.stderr)
        return 2
    share = SshfsMount(argv[0])
    # Background jobs of a non-interactive shell ignore SIGINT: stop on SIGTERM too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    share.start()
    print(f"sshfs up in {share.start_seconds:.2f} s: {share.server_dir} on {share.mount_point} "
          f"(sshd on 127.0.0.1:{share.port})", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        share.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
