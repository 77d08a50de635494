"""A real, throw-away, single-node SLURM cluster for tests.

``SlurmCluster`` starts, as plain child processes (no systemd), every daemon a
small SLURM 22.05 installation on Debian 12 needs:

* ``munged`` (as the ``munge`` user, with a key it creates if missing),
* ``mariadbd`` (as root, data directory created with ``mariadb-install-db``),
* ``slurmdbd`` (so that ``sacct`` works and the Snakemake SLURM executor
  plugin, which polls ``sacct``, never hangs),
* ``slurmctld`` and ``slurmd`` (as root, ``proctrack/linuxproc``,
  ``task/none``, no ``cgroup.conf``).

The one node carries fake GPUs of several types (default ``gpu:h100:1`` and
``gpu:a100:1``): ``gres.conf`` uses ``AutoDetect=off`` and ``File=`` points at
character devices made with ``mknod c 1 3`` (the same as ``/dev/null``) in the
work directory, so jobs that ask for ``--gres=gpu:h100:1`` get
``CUDA_VISIBLE_DEVICES``.

All configuration, state, logs and pid files live in the given work directory,
except for a short runtime directory under ``/tmp`` that holds the munge and
MariaDB sockets (UNIX socket paths are limited to 107 bytes and ``munged``
must be able to traverse to its socket as the ``munge`` user, which pytest's
``0700`` temp directories do not allow). Clients find the cluster through the
``SLURM_CONF`` environment variable: use :attr:`SlurmCluster.env`, or
:meth:`SlurmCluster.activate` to put it into ``os.environ``.

Outside the work directory the cluster touches only: its runtime directory
``/tmp/gcslurm-*`` (removed by ``stop()``), and the symlink
``/run/slurm/conf`` -> ``<workdir>/etc`` (see ``link_default_conf``; removed
by ``stop()``), which ``srun`` inside Snakemake SLURM jobs needs because the
plugin's job step drops ``SLURM_CONF``.

:meth:`SlurmCluster.stop` kills every process it started (daemons, then any
job process that still references the cluster), then checks that none
survived. :meth:`SlurmCluster.start` first kills leftovers: a previous
cluster in the same work directory, and orphaned clusters anywhere whose
owning process died without ``stop()`` (recorded in
``/tmp/gcslurm-*/cluster.json`` with the owner's pid and start time).

Usage::

    with SlurmCluster(tmp_path / "slurm") as cluster:
        job_id = cluster.sbatch("#!/bin/sh\\necho $CUDA_VISIBLE_DEVICES", "--gres=gpu:h100:1")
        cluster.wait_job(job_id)

Run ``python tests/slurm_cluster.py DIR`` to start a cluster by hand (Ctrl-C or
SIGTERM stops it).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = [
    "SLURM_BINARIES",
    "SlurmCluster",
    "SlurmClusterError",
    "missing_binaries",
    "pid_alive",
    "processes_referencing",
]

#: Every executable the cluster needs (daemons and the clients the tests use).
SLURM_BINARIES: tuple[str, ...] = (
    "munged",
    "mariadbd",
    "mariadb-install-db",
    "my_print_defaults",
    "slurmdbd",
    "slurmctld",
    "slurmd",
    "sbatch",
    "sinfo",
    "squeue",
    "sacct",
    "scontrol",
    "scancel",
)

_SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")

#: Where SLURM clients look for a configuration when ``SLURM_CONF`` is unset and
#: ``/etc/slurm/slurm.conf`` does not exist (slurmd's "configless" cache).
DEFAULT_CONF_LINK = Path("/run/slurm/conf")

# Job states after which a job never runs again.
_FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


class SlurmClusterError(RuntimeError):
    """A daemon did not start, or a cluster operation failed (message has the log tails)."""


def _which(name: str) -> str | None:
    """Find ``name`` on PATH or in the sbin directories (root's PATH may lack them)."""
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(_SBIN_DIRS)
    return shutil.which(name, path=path)


def missing_binaries() -> list[str]:
    """Return the names in :data:`SLURM_BINARIES` that are not installed."""
    return [name for name in SLURM_BINARIES if _which(name) is None]


def _free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def processes_referencing(marker: str) -> list[int]:
    """Pids whose command line or environment mention ``marker``.

    Never this process or its ancestors (a shell that exported
    ``SLURM_CONF`` for this cluster must survive).
    """
    spared = _ancestors(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared:
            continue
        pid = int(entry)
        if not pid_alive(pid):
            continue
        text = _cmdline(pid)
        if marker not in text:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if f"SLURM_CONF={marker}" not in environ:
                continue
        found.append(pid)
    return found


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _owner_alive(record: Mapping[str, object]) -> bool:
    """True if the process that started a recorded cluster still runs."""
    owner = record.get("owner")
    if not isinstance(owner, int) or not pid_alive(owner):
        return False
    return record.get("owner_start") in (None, _start_time(owner))


def _ancestors(pid: int) -> set[int]:
    """``pid`` and all its parents up to init."""
    chain = {pid}
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        chain.add(pid)
    return chain


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"  ({path} does not exist)"
    return "\n".join("  " + line for line in text.splitlines()[-lines:])


class SlurmCluster:
    """A single-node SLURM cluster with slurmdbd accounting and fake typed GPUs.

    Args:
        workdir: directory for configuration, state, logs and fake devices
            (created if missing; leftovers of a previous run there are cleaned up).
        gpus: GPU type -> count on the node, e.g. ``{"h100": 1, "a100": 1}``.
        cpus: CPUs the node claims to have. May exceed the real core count
            (``SlurmdParameters=config_overrides``), so several small jobs run
            at once on a 2-core machine.
        real_memory_mb: memory the node claims to have.
        partition: name of the (default) partition.
        cluster_name: ``ClusterName`` in slurm.conf and in the accounting DB.
        min_job_age: ``MinJobAge`` (seconds a finished job stays in slurmctld).
        start_timeout: seconds to wait for each daemon / for the node to be idle.
        link_default_conf: while running, make :data:`DEFAULT_CONF_LINK`
            (``/run/slurm/conf``) a symlink to this cluster's configuration
            directory, unless something else is there. Needed for the
            Snakemake SLURM plugin: its job step (``slurm-jobstep``) removes
            every ``SLURM_*`` variable, ``SLURM_CONF`` included, before it
            calls ``srun`` inside the job, so ``srun`` must find the
            configuration at a default path. ``/etc/slurm/slurm.conf``, if it
            exists, takes precedence over the link.
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *,
        gpus: Mapping[str, int] | None = None,
        cpus: int = 8,
        real_memory_mb: int = 16000,
        partition: str = "debug",
        cluster_name: str = "gpucache",
        min_job_age: int = 600,
        start_timeout: float = 60.0,
        link_default_conf: bool = True,
    ) -> None:
        self.workdir: Path = Path(workdir).absolute()
        self.gpus: dict[str, int] = dict(gpus if gpus is not None else {"h100": 1, "a100": 1})
        self.cpus = cpus
        self.real_memory_mb = real_memory_mb
        self.partition = partition
        self.cluster_name = cluster_name
        self.min_job_age = min_job_age
        self.start_timeout = start_timeout
        self.nodename: str = socket.gethostname().split(".")[0]
        self.conf_dir: Path = self.workdir / "etc"
        self.log_dir: Path = self.workdir / "log"
        self.run_dir: Path = self.workdir / "run"
        self.dev_dir: Path = self.workdir / "dev"
        self.slurm_conf: Path = self.conf_dir / "slurm.conf"
        self.runtime_dir: Path | None = None
        self.ports: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_handles: list[IO[bytes]] = []
        self._old_slurm_conf: str | None = None
        self._activated = False
        self.start_seconds: float | None = None
        self.link_default_conf = link_default_conf
        #: True while :data:`DEFAULT_CONF_LINK` points at this cluster's configuration.
        self.default_conf_linked = False

    # ------------------------------------------------------------------ public API

    @property
    def env(self) -> dict[str, str]:
        """A copy of ``os.environ`` with ``SLURM_CONF`` pointing at this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    @property
    def running(self) -> bool:
        """True while every started daemon is alive."""
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    def pids(self) -> dict[str, int]:
        """Daemon name -> pid of the processes this object started."""
        return {name: proc.pid for name, proc in self._procs.items()}

    def activate(self) -> None:
        """Set ``SLURM_CONF`` in ``os.environ`` (undone by :meth:`stop`)."""
        if not self._activated:
            self._old_slurm_conf = os.environ.get("SLURM_CONF")
            os.environ["SLURM_CONF"] = str(self.slurm_conf)
            self._activated = True

    def start(self) -> SlurmCluster:
        """Start all daemons and wait until the node is idle. Returns ``self``.

        Raises:
            SlurmClusterError: a binary is missing or a daemon did not come up
                (the message includes the tail of the daemons' logs). Whatever
                was started is stopped again before the error is raised.
        """
        missing = missing_binaries()
        if missing:
            raise SlurmClusterError(f"SLURM binaries not installed: {', '.join(missing)}")
        t0 = time.monotonic()
        try:
            self._cleanup_stale()
            self._prepare_dirs()
            self._write_configs()
            self._link_default_conf()
            self._start_munged()
            self._start_mariadb()
            self._start_slurmdbd()
            self._start_slurmctld()
            self._start_slurmd()
            self._wait_node_idle()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Kill every daemon this object started, verify none survived, clean up.

        Safe to call more than once. Raises :class:`SlurmClusterError` if a
        process could not be killed.
        """
        # Cancel jobs so that slurmd has no job processes left behind.
        if self._procs.get("slurmctld") and self._procs["slurmctld"].poll() is None:
            subprocess.run(
                ["scancel", "--full", "--quiet", f"--partition={self.partition}"],
                env=self.env, capture_output=True, timeout=10, check=False,
            )
        survivors: list[str] = []
        # Reverse start order: slurmd, slurmctld, slurmdbd, mariadbd, munged.
        for name in reversed(list(self._procs)):
            proc = self._procs[name]
            if not self._terminate(proc.pid, proc):
                survivors.append(f"{name} (pid {proc.pid})")
        self._procs.clear()
        # Any job processes (slurmstepd and children) reference our config dir.
        for pid in processes_referencing(str(self.workdir)):
            if not self._terminate(pid):
                survivors.append(f"{_cmdline(pid)} (pid {pid})")
        for fh in self._log_handles:
            try:
                fh.close()
            except OSError:
                pass
        self._log_handles.clear()
        (self.workdir / "pids.json").unlink(missing_ok=True)
        if self.default_conf_linked:
            try:
                if DEFAULT_CONF_LINK.is_symlink() and Path(os.readlink(DEFAULT_CONF_LINK)) == self.conf_dir:
                    DEFAULT_CONF_LINK.unlink()
            except OSError:
                pass
            self.default_conf_linked = False
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = None
        if self._activated:
            if self._old_slurm_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self._old_slurm_conf
            self._activated = False
        if survivors:
            raise SlurmClusterError("processes survived stop(): " + ", ".join(survivors))

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def run(
        self, args: Sequence[str], *, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command (e.g. ``["sinfo", "-N"]``) against this cluster."""
        return subprocess.run(
            list(args), env=self.env, capture_output=True, text=True,
            timeout=timeout, check=check,
        )

    def sbatch(self, script: str, *args: str, cwd: str | os.PathLike[str] | None = None) -> int:
        """Submit ``script`` (text with a ``#!`` line) with extra sbatch ``args``; return the job id."""
        proc = subprocess.run(
            ["sbatch", "--parsable", *args], input=script, env=self.env,
            capture_output=True, text=True, timeout=30,
            cwd=cwd if cwd is not None else self.workdir, check=False,
        )
        if proc.returncode != 0:
            raise SlurmClusterError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def job_state(self, job_id: int | str) -> str:
        """The job's state from ``scontrol`` (falls back to ``sacct``), e.g. ``COMPLETED``."""
        proc = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        match = re.search(r"\bJobState=(\S+)", proc.stdout)
        if match:
            return match.group(1)
        proc = self.run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"], check=False)
        return (proc.stdout.split() or ["UNKNOWN"])[0]

    def wait_job(self, job_id: int | str, timeout: float = 60.0) -> str:
        """Wait until the job reaches a final state and return it (``TimeoutError`` otherwise)."""
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state.split()[0] in _FINAL_STATES:
                return state
            time.sleep(0.25)
        raise TimeoutError(f"job {job_id} still {state} after {timeout} s")

    def show_job(self, job_id: int | str) -> dict[str, str]:
        """``scontrol -o show job`` as a dict of its ``Key=Value`` fields."""
        out = self.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout
        return dict(re.findall(r"(\S+?)=(\S*)", out))

    def sacct(self, job_id: int | str,
              fields: Iterable[str] = ("JobID", "State", "AllocTRES")) -> list[dict[str, str]]:
        """``sacct -P`` rows (job and steps) for ``job_id`` as dicts."""
        names = list(fields)
        out = self.run(
            ["sacct", "-n", "-P", "-j", str(job_id), "-o", ",".join(names)]
        ).stdout
        return [dict(zip(names, line.split("|"), strict=False)) for line in out.splitlines() if line]

    def wait_accounted(
        self,
        job_id: int | str,
        fields: Iterable[str] = ("JobID", "State", "AllocTRES"),
        timeout: float = 30.0,
    ) -> list[dict[str, str]]:
        """Like :meth:`sacct`, after waiting until slurmdbd has the job's final state.

        slurmctld sends accounting records to slurmdbd asynchronously, so right
        after a job ends ``sacct`` may still show it PENDING or RUNNING.
        """
        names = list(dict.fromkeys(["JobID", "State", *fields]))
        deadline = time.monotonic() + timeout
        rows: list[dict[str, str]] = []
        while time.monotonic() < deadline:
            rows = self.sacct(job_id, names)
            main = [r for r in rows if r["JobID"] == str(job_id)]
            if main and main[0]["State"].split()[0] in _FINAL_STATES:
                return rows
            time.sleep(0.25)
        raise TimeoutError(f"sacct has no final state for job {job_id} after {timeout} s: {rows}")

    def logs(self, lines: int = 25) -> str:
        """Tails of all daemon logs, for error messages."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"--- {path.name}\n{_tail(path, lines)}")
        return "\n".join(parts)

    # ----------------------------------------------------------------- internals

    def _cleanup_stale(self) -> None:
        """Kill what a previous run left behind; drop old state.

        Two kinds of leftovers: a previous cluster in this work directory
        (whatever its owner), and orphans anywhere: clusters whose owning
        process died without ``stop()`` (e.g. a SIGKILLed pytest), found
        through the ``cluster.json`` record in their ``/tmp/gcslurm-*`` runtime
        directory.
        """
        records: list[dict[str, object]] = []
        own = self.workdir / "pids.json"
        for path in [own, *Path(tempfile.gettempdir()).glob("gcslurm-*/cluster.json")]:
            try:
                data = json.loads(path.read_text())
            except (ValueError, OSError):
                continue
            if not isinstance(data, dict):
                continue
            if path == own or data.get("workdir") == str(self.workdir) or not _owner_alive(data):
                records.append(data)
        for data in records:
            self._kill_recorded(data)
        own.unlink(missing_ok=True)
        # Old state (job ids, node state, database, pid files) must not leak in.
        for sub in ("etc", "log", "run", "dev", "state", "spool", "mysql"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)

    def _kill_recorded(self, data: Mapping[str, object]) -> None:
        """Kill the daemons (and job processes) of a recorded cluster, remove its runtime dir."""
        workdir = str(data.get("workdir") or "")
        runtime = str(data.get("runtime_dir") or "")
        markers = [m for m in (workdir, runtime) if m]
        if not markers:
            return
        pids = data.get("pids")
        if isinstance(pids, dict):
            for pid in pids.values():
                if pid_alive(int(pid)) and any(m in _cmdline(int(pid)) for m in markers):
                    self._terminate(int(pid))
        for marker in markers:
            for pid in processes_referencing(marker):
                self._terminate(pid)
        if runtime.startswith(tempfile.gettempdir() + "/gcslurm-"):
            shutil.rmtree(runtime, ignore_errors=True)
        if workdir:
            Path(workdir, "pids.json").unlink(missing_ok=True)
            try:
                ours = str(Path(workdir, "etc"))
                if DEFAULT_CONF_LINK.is_symlink() and os.readlink(DEFAULT_CONF_LINK) == ours:
                    DEFAULT_CONF_LINK.unlink()
            except OSError:
                pass

    def _prepare_dirs(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for path in (self.conf_dir, self.log_dir, self.run_dir, self.dev_dir,
                     self.workdir / "state", self.workdir / "spool"):
            path.mkdir(parents=True, exist_ok=True)
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="gcslurm-", dir=tempfile.gettempdir()))
        self.runtime_dir.chmod(0o755)
        munge_dir = self.runtime_dir / "munge"
        munge_dir.mkdir()
        munge_dir.chmod(0o755)  # munged requires o+x on its socket directory
        munge = pwd.getpwnam("munge")
        os.chown(munge_dir, munge.pw_uid, munge.pw_gid)
        for name in ("slurmctld", "slurmd", "slurmdbd", "mysql"):
            self.ports[name] = _free_port()
        self._save_record()

    def _save_record(self) -> None:
        """Write what :meth:`_cleanup_stale` of a later run needs if we never stop."""
        me = os.getpid()
        record = json.dumps({
            "owner": me,
            "owner_start": _start_time(me),
            "workdir": str(self.workdir),
            "runtime_dir": str(self.runtime_dir) if self.runtime_dir else None,
            "pids": self.pids(),
        })
        (self.workdir / "pids.json").write_text(record)
        if self.runtime_dir is not None:
            (self.runtime_dir / "cluster.json").write_text(record)

    def _link_default_conf(self) -> None:
        """Point /run/slurm/conf at our configuration (see ``link_default_conf``)."""
        if not self.link_default_conf:
            return
        link = DEFAULT_CONF_LINK
        if link.is_symlink():
            target = Path(os.readlink(link))
            record = target.parent / "pids.json"
            live = False
            if target.exists() and record.exists():
                try:
                    live = _owner_alive(json.loads(record.read_text()))
                except (ValueError, OSError):
                    live = False
            if live and target != self.conf_dir:
                return  # another running cluster owns it; leave it alone
            link.unlink()  # stale link of a previous run
        elif link.exists():
            warnings.warn(f"{link} exists and is not ours: srun inside Snakemake SLURM jobs may not find "
                          "this cluster", stacklevel=2)
            return  # a real slurmd configless cache; not ours to replace
        if Path("/etc/slurm/slurm.conf").exists():
            warnings.warn("/etc/slurm/slurm.conf exists and takes precedence over the /run/slurm/conf link",
                          stacklevel=2)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(self.conf_dir, target_is_directory=True)
        self.default_conf_linked = True

    def _gpu_devices(self) -> list[tuple[str, Path]]:
        """(type, device path) for every fake GPU; creates the character devices."""
        devices = []
        index = 0
        for gpu_type, count in self.gpus.items():
            for _ in range(count):
                dev = self.dev_dir / f"nvidia{index}"
                if not dev.exists():
                    os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR, like /dev/null
                devices.append((gpu_type, dev))
                index += 1
        return devices

    def _write_configs(self) -> None:
        assert self.runtime_dir is not None
        w = self.workdir
        munge_socket = self.runtime_dir / "munge" / "munge.socket.2"
        devices = self._gpu_devices()
        gres = ",".join(f"gpu:{t}:{n}" for t, n in self.gpus.items() if n > 0)
        tres = ",".join(["gres/gpu"] + [f"gres/gpu:{t}" for t in self.gpus])
        node = (f"NodeName={self.nodename} NodeAddr=127.0.0.1 CPUs={self.cpus} "
                f"RealMemory={self.real_memory_mb} Gres={gres} State=UNKNOWN")
        slurm_conf = f"""\
# Written by tests/slurm_cluster.py; single node, everything as root.
ClusterName={self.cluster_name}
SlurmctldHost={self.nodename}(127.0.0.1)
SlurmctldPort={self.ports['slurmctld']}
SlurmdPort={self.ports['slurmd']}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool/slurmd-%n
SlurmctldPidFile={self.run_dir}/slurmctld.pid
SlurmdPidFile={self.run_dir}/slurmd-%n.pid
SlurmctldLogFile={self.log_dir}/slurmctld.log
SlurmdLogFile={self.log_dir}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge={self.min_job_age}
InactiveLimit=0
KillWait=2
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=20
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={self.ports['slurmdbd']}
AccountingStorageTRES={tres}
# For the slurmdbd connection the munge socket comes from AccountingStoragePass, not AuthInfo.
AccountingStoragePass={munge_socket}
MailProg=/bin/true
JobCompType=jobcomp/none
{node}
PartitionName={self.partition} Nodes={self.nodename} Default=YES MaxTime=INFINITE State=UP
"""
        self.slurm_conf.write_text(slurm_conf)
        gres_lines = ["AutoDetect=off"] + [
            f"NodeName={self.nodename} Name=gpu Type={t} File={dev}" for t, dev in devices
        ]
        (self.conf_dir / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        dbd_conf = self.conf_dir / "slurmdbd.conf"
        dbd_conf.write_text(
            f"""\
AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.ports['slurmdbd']}
SlurmUser=root
PidFile={self.run_dir}/slurmdbd.pid
LogFile={self.log_dir}/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.ports['mysql']}
StorageUser=root
StorageLoc=slurm_acct_db
"""
        )
        dbd_conf.chmod(0o600)  # slurmdbd refuses a config that others can read

    def _spawn(self, name: str, argv: Sequence[str], *, user: str | None = None) -> subprocess.Popen[bytes]:
        """Start a daemon in the foreground as a child in its own session."""
        binary = _which(argv[0])
        if binary is None:
            raise SlurmClusterError(f"{argv[0]} not installed")
        cmd = [binary, *argv[1:]]
        uid: int | None = None
        gid: int | None = None
        groups: list[int] | None = None
        if user is not None:  # a direct child (not under runuser), so that we can reap it
            entry = pwd.getpwnam(user)
            uid, gid, groups = entry.pw_uid, entry.pw_gid, []
        out = open(self.log_dir / f"{name}.stdout.log", "ab")  # noqa: SIM115 - closed by stop()
        self._log_handles.append(out)
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=self.env, cwd=self.workdir, start_new_session=True,
            user=uid, group=gid, extra_groups=groups,
        )
        self._procs[name] = proc
        self._save_record()
        return proc

    def _wait(
        self, what: str, ready: Callable[[], bool], procs: Sequence[str], timeout: float | None = None
    ) -> None:
        """Poll ``ready`` until true; fail early with log tails if a daemon dies."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while True:
            for name in procs:
                proc = self._procs[name]
                if proc.poll() is not None:
                    raise SlurmClusterError(
                        f"{name} exited with code {proc.returncode} while waiting for {what}\n{self.logs()}"
                    )
            try:
                if ready():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.1)

    def _start_munged(self) -> None:
        assert self.runtime_dir is not None
        munge_dir = self.runtime_dir / "munge"
        munge = pwd.getpwnam("munge")
        key = self.workdir / "munge.key"
        if not key.exists():  # 1024 random bytes, as ``mungekey`` writes
            key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        run_key = munge_dir / "munge.key"  # munged wants a key owned by the munge user
        shutil.copyfile(key, run_key)
        run_key.chmod(0o600)
        os.chown(run_key, munge.pw_uid, munge.pw_gid)
        socket_path = munge_dir / "munge.socket.2"
        self._spawn(
            "munged",
            ["munged", "--foreground", f"--socket={socket_path}", f"--key-file={run_key}",
             f"--pid-file={munge_dir}/munged.pid", f"--seed-file={munge_dir}/munged.seed",
             f"--log-file={munge_dir}/munged.log", "--num-threads=2"],
            user="munge",
        )
        self._wait("munged socket", socket_path.exists, ["munged"])

    def _start_mariadb(self) -> None:
        assert self.runtime_dir is not None
        datadir = self.workdir / "mysql"
        init = subprocess.run(
            [_which("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
             f"--datadir={datadir}", "--user=root", "--auth-root-authentication-method=normal",
             "--skip-test-db"],
            capture_output=True, text=True, timeout=120, check=False,
        )
        (self.log_dir / "mariadb-install-db.log").write_text(init.stdout + init.stderr)
        if init.returncode != 0:
            raise SlurmClusterError(f"mariadb-install-db failed\n{self.logs()}")
        self._spawn(
            "mariadbd",
            ["mariadbd", "--no-defaults", "--user=root", f"--datadir={datadir}",
             f"--socket={self.runtime_dir}/mysqld.sock", f"--pid-file={self.run_dir}/mariadbd.pid",
             f"--log-error={self.log_dir}/mariadbd.log", "--bind-address=127.0.0.1",
             f"--port={self.ports['mysql']}", "--skip-grant-tables", "--skip-name-resolve",
             "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=0",
             "--innodb-doublewrite=0", "--skip-log-bin"],
        )
        self._wait("mariadbd port", lambda: self._port_open(self.ports["mysql"]), ["mariadbd"])

    def _start_slurmdbd(self) -> None:
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait("slurmdbd port", lambda: self._port_open(self.ports["slurmdbd"]), ["slurmdbd"])

    def _start_slurmctld(self) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._wait(
            "slurmctld to answer",
            lambda: self.run(["scontrol", "ping"], check=False, timeout=10).stdout.count("UP") > 0,
            ["slurmctld", "slurmdbd"],
        )

    def _start_slurmd(self) -> None:
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.nodename])

    def _wait_node_idle(self) -> None:
        def idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%t"], check=False, timeout=10).stdout
            return out.strip() == "idle"

        self._wait("node to become idle in sinfo", idle, list(self._procs))

    @staticmethod
    def _port_open(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    @staticmethod
    def _terminate(pid: int, proc: subprocess.Popen[bytes] | None = None, grace: float = 10.0) -> bool:
        """SIGTERM, wait up to ``grace`` s, then SIGKILL. True if the process is gone."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if proc is not None:
                    if proc.poll() is not None:
                        break
                elif not pid_alive(pid):
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


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/slurm_cluster.py WORKDIR", file=sys.stderr)
        return 2
    cluster = SlurmCluster(argv[0])
    # Background jobs of a non-interactive shell ignore SIGINT: stop on SIGTERM too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cluster.start()
    print(f"SLURM cluster up in {cluster.start_seconds:.1f} s; export SLURM_CONF={cluster.slurm_conf}")
    print(cluster.run(["sinfo", "-N", "-O", "NodeList,StateLong,CPUs,Gres"]).stdout, end="")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
