"""A real, throw-away sshfs mount over loopback for tests: a network filesystem on one machine.

``SshfsMount`` starts, as plain child processes (no systemd, nothing in ``/etc/ssh``):

* a private ``sshd`` on ``127.0.0.1`` on a free port, with its own host key and
  configuration in the work directory (public-key authentication only, root login
  allowed by key, no PAM, the in-process ``internal-sftp`` server),
* a client key in the work directory, authorized for that sshd only,
* ``sshfs -f`` (in the foreground, so that its pid is ours) that mounts the
  server-side folder ``<workdir>/server`` onto ``<workdir>/mnt``. The mount is
  ``fuse.sshfs`` in ``/proc/mounts``, exactly what a user's sshfs mount of a remote
  machine is; only the network is the loopback interface.

:meth:`SshfsMount.mount` mounts the same server folder a second time elsewhere: a
second client, as a second node would see the share (FUSE keeps locks and caches per
mount, so this is what two machines see, not what two processes on one machine see).

:meth:`SshfsMount.stop` unmounts every mount point (``fusermount3 -u``, else
``umount -l`` when something still holds it), waits for each ``sshfs`` to exit, then
stops ``sshd`` and the per-connection children it forked, and checks that none
survived. :meth:`SshfsMount.start` first cleans up leftovers: an earlier session in
the same work directory, and orphaned sessions anywhere whose owning process died
without ``stop()`` (recorded in ``/tmp/gcsshfs-*/session.json`` with the owner's pid
and start time, the mount points and the pids).

Outside the work directory it touches only its record folder ``/tmp/gcsshfs-*``
(removed by ``stop()``) and creates ``/run/sshd`` (sshd's privilege separation
directory) when it is missing. It needs root (sshd switches to the logged-in user;
mounting FUSE), ``/dev/fuse`` and the binaries in :data:`SSHFS_BINARIES`
(``.ci/install-sshfs.sh`` installs them).

Usage::

    with SshfsMount(tmp_path / "sshfs") as share:
        (share.mount_point / "a").write_text("over ssh")
        assert (share.server_dir / "a").read_text() == "over ssh"

Run ``python tests/sshfs_mount.py DIR`` to mount one by hand (Ctrl-C or SIGTERM
unmounts it).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = [
    "SSHFS_BINARIES",
    "SshfsMount",
    "SshfsMountError",
    "missing_requirements",
    "mounted_type",
]

#: Every executable the harness runs.
SSHFS_BINARIES: tuple[str, ...] = ("sshd", "ssh", "ssh-keygen", "sshfs")

_SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
_RUNTIME_PREFIX = "gcsshfs-"
_RECORD = "session.json"


class SshfsMountError(RuntimeError):
    """sshd or sshfs did not start, or a mount could not be removed (message has the log tails)."""


def _which(name: str) -> str | None:
    """Find ``name`` on PATH or in the sbin directories (root's PATH may lack them)."""
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(_SBIN_DIRS)
    return shutil.which(name, path=path)


def missing_requirements() -> list[str]:
    """What this machine lacks for a loopback sshfs mount: binaries, ``/dev/fuse``, a
    ``fusermount``, root. Empty when everything is there."""
    missing = [name for name in SSHFS_BINARIES if _which(name) is None]
    if _which("fusermount3") is None and _which("fusermount") is None:
        missing.append("fusermount3")
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse")
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def _unescape(field: str) -> str:
    """A /proc/mounts field with its octal escapes (``\\040`` for a space) decoded."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounted_type(point: str | os.PathLike[str]) -> str | None:
    """The filesystem type mounted exactly at ``point`` (the last mount there), or None."""
    target = os.path.abspath(point)
    found = None
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3 and _unescape(fields[1]) == target:
                    found = fields[2]
    except OSError:
        return None
    return found


def _free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields and fields[0] != "Z" and fields[1] == str(pid):
                found.append(int(entry))
    return found


def _terminate(pid: int, proc: subprocess.Popen[bytes] | None = None, grace: float = 5.0) -> bool:
    """SIGTERM, wait up to ``grace`` s, then SIGKILL. True if the process is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if (proc.poll() is not None) if proc is not None else not _pid_alive(pid):
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
    return not _pid_alive(pid)


def _unmount(point: str) -> str | None:
    """Unmount ``point`` if something is mounted there; why that failed, or None.

    ``fusermount3 -u`` first (the clean way, fails with EBUSY while a process has a file
    or its cwd there), then a lazy ``umount -l`` (detaches at once, frees when unused)."""
    if mounted_type(point) is None:
        return None
    errors = []
    fusermount = _which("fusermount3") or _which("fusermount")
    attempts = ([[fusermount, "-u", point]] if fusermount else []) + [["umount", "-l", point]]
    for argv in attempts:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if mounted_type(point) is None:
            return None
        errors.append(f"{' '.join(argv)}: {(result.stderr or result.stdout).strip()}")
    return "; ".join(errors)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"  ({path} does not exist)"
    return "\n".join("  " + line for line in text.splitlines()[-lines:])


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
    """A loopback sshfs mount of ``<workdir>/server`` on ``<workdir>/mnt``.

    Args:
        workdir: folder for keys, configuration, logs, the server-side folder and the
            mount points (created if missing; leftovers of a previous session there
            are cleaned up first).
        sshfs_options: extra ``-o`` options for every sshfs mount (e.g. ``cache=no``).
        start_timeout: seconds to wait for sshd to listen and for each mount to appear.
    """

    def __init__(self, workdir: str | os.PathLike[str], *, sshfs_options: Sequence[str] = (),
                 start_timeout: float = 30.0) -> None:
        self.workdir: Path = Path(workdir).absolute()
        self.server_dir: Path = self.workdir / "server"
        self.mount_point: Path = self.workdir / "mnt"
        self.log_dir: Path = self.workdir / "log"
        self.sshfs_options = tuple(sshfs_options)
        self.start_timeout = start_timeout
        self.user: str = pwd.getpwuid(os.geteuid()).pw_name
        self.port: int | None = None
        self.host_key: Path = self.workdir / "ssh_host_ed25519_key"
        self.client_key: Path = self.workdir / "client_ed25519_key"
        self.sshd_config: Path = self.workdir / "sshd_config"
        self.runtime_dir: Path | None = None
        self.start_seconds: float | None = None
        self._sshd: subprocess.Popen[bytes] | None = None
        #: mount point -> its sshfs process, in mount order.
        self._mounts: dict[str, subprocess.Popen[bytes]] = {}
        self._log_handles: list[IO[bytes]] = []

    # ------------------------------------------------------------------ public API

    def start(self) -> SshfsMount:
        """Start sshd and mount :attr:`server_dir` on :attr:`mount_point`. Returns ``self``.

        Raises:
            SshfsMountError: something is missing, or sshd or sshfs did not come up
                (the message has the log tails). What was started is stopped again.
        """
        missing = missing_requirements()
        if missing:
            raise SshfsMountError(f"a loopback sshfs mount needs: {', '.join(missing)}")
        t0 = time.monotonic()
        try:
            self._cleanup_stale()
            self._prepare()
            self._start_sshd()
            self.mount(self.mount_point)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def mount(self, point: str | os.PathLike[str] | None = None) -> Path:
        """Mount the server folder (again) on ``point`` (default: a new folder in the work
        directory) with a sshfs process of its own, and return the mount point."""
        if self._sshd is None or self._sshd.poll() is not None:
            raise SshfsMountError("sshd is not running: call start() first")
        where = Path(point) if point is not None else self.workdir / f"mnt{len(self._mounts) + 1}"
        where = where.absolute()
        where.mkdir(parents=True, exist_ok=True)
        options = [f"IdentityFile={self.client_key}", "StrictHostKeyChecking=no",
                   "UserKnownHostsFile=/dev/null", f"port={self.port}", "BatchMode=yes",
                   "LogLevel=ERROR", *self.sshfs_options]
        name = "sshfs-" + where.name
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the daemon writes it until stop()
        self._log_handles.append(log)
        proc = subprocess.Popen(
            [_which("sshfs") or "sshfs", "-f", "-o", ",".join(options),
             f"{self.user}@127.0.0.1:{self.server_dir}", str(where)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            start_new_session=True)
        self._mounts[str(where)] = proc
        self._save_record()
        deadline = time.monotonic() + self.start_timeout
        while mounted_type(where) != "fuse.sshfs":
            if proc.poll() is not None:
                raise SshfsMountError(f"sshfs exited with code {proc.returncode} before {where} "
                                      f"was mounted\n{self.logs()}")
            if time.monotonic() > deadline:
                raise SshfsMountError(f"timed out waiting for the sshfs mount on {where}\n{self.logs()}")
            time.sleep(0.05)
        return where

    @property
    def mount_points(self) -> list[Path]:
        """Every mount point this object mounted and has not unmounted, in mount order."""
        return [Path(point) for point in self._mounts]

    def unmount(self, point: str | os.PathLike[str]) -> None:
        """Unmount one mount point and wait for its sshfs process to exit."""
        key = str(Path(point).absolute())
        failure = _unmount(key)
        proc = self._mounts.pop(key, None)
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _terminate(proc.pid, proc)
        self._save_record()
        if failure:
            raise SshfsMountError(f"cannot unmount {key}: {failure}")

    def stop(self) -> None:
        """Unmount everything, stop sshd and its connection children, clean up.

        Safe to call more than once. Raises :class:`SshfsMountError` if a mount or a
        process survived."""
        survivors: list[str] = []
        for point in reversed(list(self._mounts)):
            try:
                self.unmount(point)
            except SshfsMountError as exc:
                survivors.append(str(exc))
        if self._sshd is not None:
            children = _children(self._sshd.pid)
            if not _terminate(self._sshd.pid, self._sshd):
                survivors.append(f"sshd (pid {self._sshd.pid})")
            for pid in children:  # per-connection sshd processes (they exit with the client)
                if not _terminate(pid):
                    survivors.append(f"{_cmdline(pid)} (pid {pid})")
            self._sshd = None
        for handle in self._log_handles:
            try:
                handle.close()
            except OSError:
                pass
        self._log_handles.clear()
        (self.workdir / _RECORD).unlink(missing_ok=True)
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = None
        if survivors:
            raise SshfsMountError("survived stop(): " + "; ".join(survivors))

    def logs(self, lines: int = 20) -> str:
        """The tails of sshd's and every sshfs's log."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")) if self.log_dir.is_dir() else []:
            parts.append(f"--- {path.name}\n{_tail(path, lines)}")
        return "\n".join(parts)

    def __enter__(self) -> SshfsMount:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _prepare(self) -> None:
        for folder in (self.workdir, self.server_dir, self.mount_point, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.runtime_dir = Path(tempfile.mkdtemp(prefix=_RUNTIME_PREFIX))
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        for key in (self.host_key, self.client_key):
            if not key.exists():
                subprocess.run([_which("ssh-keygen") or "ssh-keygen", "-q", "-t", "ed25519",
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
            "# private sshd for tests/sshfs_mount.py; not the system's",
            f"ListenAddress 127.0.0.1:{self.port}",
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
        sshd = _which("sshd") or "/usr/sbin/sshd"
        for attempt in range(3):  # the free port may be taken between the probe and the bind
            self.port = _free_port()
            self._write_sshd_config()
            test = subprocess.run([sshd, "-t", "-f", str(self.sshd_config)], capture_output=True,
                                  text=True, timeout=30, check=False)
            if test.returncode != 0:
                raise SshfsMountError(f"sshd rejects its configuration: {test.stderr.strip()}")
            log = open(self.log_dir / "sshd.log", "ab")  # noqa: SIM115 - the daemon writes it until stop()
            self._log_handles.append(log)
            # -D: stay in the foreground (our child); -e: log to stderr (the log file).
            self._sshd = subprocess.Popen([sshd, "-D", "-e", "-f", str(self.sshd_config)],
                                          stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=self.workdir,
                                          start_new_session=True)
            self._save_record()
            deadline = time.monotonic() + self.start_timeout
            while self._sshd.poll() is None and not _port_open(self.port):
                if time.monotonic() > deadline:
                    raise SshfsMountError(f"timed out waiting for sshd on port {self.port}\n{self.logs()}")
                time.sleep(0.05)
            if self._sshd.poll() is None:
                return
            if attempt == 2:
                raise SshfsMountError(f"sshd exited with code {self._sshd.returncode}\n{self.logs()}")

    def _save_record(self) -> None:
        record = {
            "owner": os.getpid(), "owner_start": _start_time(os.getpid()),
            "workdir": str(self.workdir),
            "sshd": self._sshd.pid if self._sshd is not None else None,
            "mounts": {point: proc.pid for point, proc in self._mounts.items()},
        }
        text = json.dumps(record, indent=1)
        (self.workdir / _RECORD).write_text(text)
        if self.runtime_dir is not None:
            (self.runtime_dir / _RECORD).write_text(text)

    def _cleanup_stale(self) -> None:
        """Remove what an earlier session left: the one in this work directory (whoever
        owns it) and every recorded session whose owner process is gone."""
        own = self.workdir / _RECORD
        if own.exists():
            self._clean_record(own, runtime_dir=None)
        for runtime in Path(tempfile.gettempdir()).glob(f"{_RUNTIME_PREFIX}*"):
            record = runtime / _RECORD
            try:
                data = json.loads(record.read_text())
            except (OSError, ValueError):
                data = None
            if data is None:
                # No record: a session that died before writing one, or one being set up
                # right now; only folders older than a minute are taken for leftovers.
                try:
                    if time.time() - runtime.stat().st_mtime > 60:
                        shutil.rmtree(runtime, ignore_errors=True)
                except OSError:
                    pass
                continue
            if data.get("workdir") == str(self.workdir) or not self._owner_alive(data):
                self._clean_record(record, runtime_dir=runtime)

    @staticmethod
    def _owner_alive(record: Mapping[str, object]) -> bool:
        owner = record.get("owner")
        if not isinstance(owner, int) or not _pid_alive(owner):
            return False
        return record.get("owner_start") in (None, _start_time(owner))

    @staticmethod
    def _clean_record(record: Path, runtime_dir: Path | None) -> None:
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            data = {}
        workdir = str(data.get("workdir", ""))
        mounts = data.get("mounts") or {}
        for point, pid in dict(mounts).items():
            _unmount(str(point))  # also a dead mount ("Transport endpoint is not connected")
            if isinstance(pid, int) and "sshfs" in _cmdline(pid) and str(point) in _cmdline(pid):
                _terminate(pid)
        sshd = data.get("sshd")
        if isinstance(sshd, int) and workdir and workdir in _cmdline(sshd):
            children = _children(sshd)
            _terminate(sshd)
            for pid in children:
                _terminate(pid)
        record.unlink(missing_ok=True)
        if runtime_dir is not None:
            shutil.rmtree(runtime_dir, ignore_errors=True)


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/sshfs_mount.py WORKDIR", file=sys.stderr)
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
