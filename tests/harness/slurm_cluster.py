"""A real, throw-away SLURM cluster for tests: on this machine, or on namespaced nodes.

``SlurmCluster`` starts, on the harness of tests/harness/daemons.py (plain child processes, no
systemd), every daemon a small SLURM 22.05 installation on Debian 12 needs:

* ``munged`` on every node (as the ``munge`` user, one key for all, created if missing),
* ``mariadbd`` on the head (as root, data folder made with ``mariadb-install-db``),
* ``slurmdbd`` on the head (so that ``sacct`` works and the Snakemake SLURM executor plugin,
  which polls ``sacct``, never hangs),
* ``slurmctld`` on the head and ``slurmd`` on every compute node (as root,
  ``proctrack/linuxproc``, ``task/none``, no ``cgroup.conf``).

By default the head and the one compute node are this machine (:data:`daemons.HOST`), on
127.0.0.1 and free ports. With ``head=`` and ``nodes=`` namespaced nodes (see
:class:`nodes.TwoNodes`), each daemon runs on its node, on the standard ports of the node's
own address; every node sees the one configuration at the same path, and its own munged's
socket at the same path (the node's runtime folder bound there), as on a real cluster.

Each compute node carries fake GPUs of several types (default ``gpu:h100:1`` and
``gpu:a100:1``): ``gres.conf`` uses ``AutoDetect=off`` and ``File=`` points at character
devices made with ``mknod c 1 3`` (the same as ``/dev/null``) in the work folder, so jobs that
ask for ``--gres=gpu:h100:1`` get ``CUDA_VISIBLE_DEVICES``.

Configuration, state, logs and the database live in the work folder (on namespaced nodes it
must not be under ``/tmp``, which each node has of its own); munge's sockets and the record in
a runtime folder under ``daemons.RUNTIME_BASE``. Clients find the cluster through
``SLURM_CONF``: use :attr:`SlurmCluster.env`, or :meth:`SlurmCluster.activate`; on namespaced
nodes run them on the head (:meth:`SlurmCluster.run`, ``cluster.head.run``). The plugin's job
step (``slurm-jobstep``) drops ``SLURM_CONF`` before it calls ``srun``, which then looks at a
default path: on this machine ``SlurmCluster`` links ``/run/slurm/conf`` to its configuration
(``link_default_conf``; removed by ``stop()``); on a namespaced node it binds its
configuration folder onto ``/etc/slurm`` there.

:meth:`SlurmCluster.stop` kills every process it started (daemons, then any job process that
still references the cluster), then checks that none survived. :meth:`SlurmCluster.start`
first sweeps leftovers (tests/harness/daemons.py): a previous cluster in the same work folder, and
clusters anywhere whose owner died without ``stop()``.

Usage::

    with SlurmCluster(tmp_path / "slurm") as cluster:
        job_id = cluster.sbatch("#!/bin/sh\\necho $CUDA_VISIBLE_DEVICES", "--gres=gpu:h100:1")
        cluster.wait_job(job_id)

Run ``python tests/harness/slurm_cluster.py DIR`` to start a cluster by hand (Ctrl-C or SIGTERM stops
it).
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import slurm_config
from daemons import HOST, Daemons, Node, live_record_for, unmount
from processes import free_port, listening, pid_alive, processes_referencing, terminate, which

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

#: Where SLURM clients look for a configuration when ``SLURM_CONF`` is unset and
#: ``/etc/slurm/slurm.conf`` does not exist (slurmd's "configless" cache).
DEFAULT_CONF_LINK = Path("/run/slurm/conf")

#: The daemons' ports on a namespaced node (its network is ours alone).
_STANDARD_PORTS = {"slurmctld": 6817, "slurmd": 6818, "slurmdbd": 6819, "mysql": 3306}

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


def missing_binaries() -> list[str]:
    """Return the names in :data:`SLURM_BINARIES` that are not installed."""
    return [name for name in SLURM_BINARIES if which(name) is None]


class SlurmCluster:
    """A SLURM cluster with slurmdbd accounting and fake typed GPUs.

    Args:
        workdir: folder for configuration, state, logs and fake devices (created if missing;
            leftovers of a previous run there are cleaned up).
        gpus: GPU type -> count on each compute node, e.g. ``{"h100": 1, "a100": 1}``.
        cpus: CPUs each node claims to have. May exceed the real core count
            (``SlurmdParameters=config_overrides``), so several small jobs run at once on a
            2-core machine.
        real_memory_mb: memory each node claims to have.
        partition: name of the (default) partition.
        cluster_name: ``ClusterName`` in slurm.conf and in the accounting DB.
        min_job_age: ``MinJobAge`` (seconds a finished job stays in slurmctld).
        start_timeout: seconds to wait for each daemon / for the nodes to be idle.
        link_default_conf: on this machine, while running, make :data:`DEFAULT_CONF_LINK`
            (``/run/slurm/conf``) a symlink to this cluster's configuration folder, unless
            something else is there. ``srun`` inside Snakemake SLURM jobs needs it (see the
            module's docstring). ``/etc/slurm/slurm.conf``, if it exists, takes precedence.
        head: the node of slurmctld, slurmdbd and MariaDB, where clients run.
        nodes: the compute nodes (one slurmd each; NodeName is the node's hostname).
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
        head: Node = HOST,
        nodes: Sequence[Node] = (HOST,),
    ) -> None:
        self.workdir: Path = Path(workdir).absolute()
        self.gpus: dict[str, int] = dict(gpus if gpus is not None else {"h100": 1, "a100": 1})
        self.cpus = cpus
        self.real_memory_mb = real_memory_mb
        self.partition = partition
        self.cluster_name = cluster_name
        self.min_job_age = min_job_age
        self.start_timeout = start_timeout
        self.head = head
        self.nodes: list[Node] = list(nodes)
        #: The NodeName of each compute node, in order.
        self.nodenames: list[str] = [node.hostname for node in self.nodes]
        self.nodename: str = self.nodenames[0]
        self.conf_dir: Path = self.workdir / "etc"
        self.log_dir: Path = self.workdir / "log"
        self.run_dir: Path = self.workdir / "run"
        self.dev_dir: Path = self.workdir / "dev"
        self.slurm_conf: Path = self.conf_dir / "slurm.conf"
        self.ports: dict[str, int] = {}
        self._daemons = Daemons("slurm", self.workdir, log_dir=self.log_dir, error=SlurmClusterError,
                                start_timeout=start_timeout)
        self._binds: list[tuple[Node, str]] = []  # mounts made on namespaced nodes
        self._old_slurm_conf: str | None = None
        self._activated = False
        self.start_seconds: float | None = None
        self.link_default_conf = link_default_conf and head is HOST
        #: True while :data:`DEFAULT_CONF_LINK` points at this cluster's configuration.
        self.default_conf_linked = False

    # ------------------------------------------------------------------ public API

    @property
    def runtime_dir(self) -> Path | None:
        """The runtime folder (munge's sockets, the record) while the cluster runs."""
        return self._daemons.runtime_dir

    @property
    def munge_dir(self) -> Path:
        """munged's folder, at the same path on every node."""
        assert self.runtime_dir is not None
        return self.runtime_dir / "munge"

    @property
    def env(self) -> dict[str, str]:
        """A copy of ``os.environ`` with ``SLURM_CONF`` pointing at this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    @property
    def running(self) -> bool:
        """True while every started daemon is alive."""
        procs = self._daemons.procs
        return bool(procs) and all(p.poll() is None for p in procs.values())

    def pids(self) -> dict[str, int]:
        """Daemon name -> pid of the processes this object started."""
        return {name: proc.pid for name, proc in self._daemons.procs.items()}

    def activate(self) -> None:
        """Set ``SLURM_CONF`` in ``os.environ`` (undone by :meth:`stop`)."""
        if not self._activated:
            self._old_slurm_conf = os.environ.get("SLURM_CONF")
            os.environ["SLURM_CONF"] = str(self.slurm_conf)
            self._activated = True

    def start(self) -> SlurmCluster:
        """Start all daemons and wait until every node is idle. Returns ``self``.

        Raises:
            SlurmClusterError: a binary is missing or a daemon did not come up
                (the message includes the tail of the daemons' logs). Whatever
                was started is stopped again before the error is raised.
        """
        missing = missing_binaries()
        if missing:
            raise SlurmClusterError(f"SLURM binaries not installed: {', '.join(missing)}")
        hidden = [node.name for node in (self.head, *self.nodes) if not node.sees(self.workdir)]
        if hidden:
            raise SlurmClusterError(f"{self.workdir} is a folder of its own on {', '.join(hidden)}: "
                                    "give a work folder every node sees")
        t0 = time.monotonic()
        try:
            self._daemons.open()
            self._daemons.note("markers", str(self.workdir))  # job processes mention it
            self._prepare_dirs()
            self._write_configs()
            self._link_default_conf()
            self._start_munged()
            self._start_mariadb()
            self._start_slurmdbd()
            self._start_slurmctld()
            self._start_slurmd()
            self._wait_nodes_idle()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _write_configs(self) -> None:
        """Write the daemons' configuration files (a test's subclass adds a line of its own)."""
        slurm_config.write(self)

    def stop(self) -> None:
        """Kill every daemon this object started, verify none survived, clean up.

        Safe to call more than once. Raises :class:`SlurmClusterError` if a
        process could not be killed.
        """
        # Cancel jobs so that slurmd has no job processes left behind.
        ctld = self._daemons.procs.get(self._name("slurmctld", self.head))
        if ctld is not None and ctld.poll() is None:
            self.head.run(["scancel", "--full", "--quiet", f"--partition={self.partition}"],
                          env=self.env, timeout=10)
        # Reverse start order: slurmd, slurmctld, slurmdbd, mariadbd, munged.
        survivors = self._daemons.stop()
        # Any job processes (slurmstepd and children) reference our configuration folder.
        for pid in processes_referencing(str(self.workdir)):
            if not terminate(pid):
                survivors.append(f"{pid}")
        for node, point in reversed(self._binds):
            if failure := unmount(node, point):
                survivors.append(f"the mount on {point} on {node.name}: {failure}")
        self._binds.clear()
        if self.default_conf_linked:
            try:
                if DEFAULT_CONF_LINK.is_symlink() and Path(os.readlink(DEFAULT_CONF_LINK)) == self.conf_dir:
                    DEFAULT_CONF_LINK.unlink()
            except OSError:
                pass
            self.default_conf_linked = False
        self._daemons.close()
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
        """Run a SLURM client command (e.g. ``["sinfo", "-N"]``) on the head."""
        return self.head.run(list(args), env=self.env, timeout=timeout, check=check)

    def sbatch(self, script: str, *args: str, cwd: str | os.PathLike[str] | None = None) -> int:
        """Submit ``script`` (text with a ``#!`` line) with extra sbatch ``args`` from the head;
        return the job id."""
        proc = self.head.run(["sbatch", "--parsable", *args], input=script, env=self.env, timeout=30,
                             cwd=cwd if cwd is not None else self.workdir)
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

    def finish(self, process: subprocess.Popen[str], timeout: float, what: str = "the pipeline") -> str:
        """The output of ``process`` (a Snakemake run on this cluster, started in a session of its
        own, its output piped) once it ends. Past ``timeout`` seconds its whole process group is
        stopped (SIGTERM, then SIGKILL after 10 s), the partition's jobs are cancelled, and the
        test fails with the end of the output."""
        import pytest

        try:
            return process.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                log = process.communicate(timeout=10)[0]
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                log = process.communicate()[0]
            self.run(["scancel", "--full", "-p", self.partition], check=False)
            pytest.fail(f"{what} did not finish in {timeout} s:\n{log[-5000:]}")

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
        munge = [self._munge_source(node) for node in self._all_nodes()] if self.runtime_dir else []
        return self._daemons.logs(lines, folders=munge)

    # ----------------------------------------------------------------- internals

    @staticmethod
    def _name(daemon: str, node: Node) -> str:
        """A daemon's name: plain on this machine, with its node's name on a namespaced node."""
        return daemon if node is HOST else f"{daemon}-{node.name}"

    def _all_nodes(self) -> list[Node]:
        """The head, then every compute node, each once."""
        return list(dict.fromkeys([self.head, *self.nodes]))

    def _prepare_dirs(self) -> None:
        # Old state (job ids, node state, database, pid files) must not leak in.
        for sub in ("etc", "log", "run", "dev", "state", "spool", "mysql"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        for path in (self.conf_dir, self.log_dir, self.run_dir, self.dev_dir,
                     self.workdir / "state", self.workdir / "spool"):
            path.mkdir(parents=True, exist_ok=True)
        munge = pwd.getpwnam("munge")
        for node in self._all_nodes():
            folder = self._munge_source(node)
            folder.mkdir(exist_ok=True)
            folder.chmod(0o755)  # munged requires o+x on its socket folder
            os.chown(folder, munge.pw_uid, munge.pw_gid)
        for name in ("slurmctld", "slurmd", "slurmdbd", "mysql"):
            self.ports[name] = free_port() if self.head is HOST else _STANDARD_PORTS[name]

    def _munge_source(self, node: Node) -> Path:
        """The host folder of ``node``'s munged (bound onto :attr:`munge_dir` on the node)."""
        return self.munge_dir if node is HOST else self.munge_dir.with_name(f"munge-{node.name}")

    def _bind(self, node: Node, source: Path | str, target: Path | str) -> None:
        result = node.run(["mount", "--bind", str(source), str(target)], timeout=30)
        if result.returncode != 0:
            raise SlurmClusterError(f"mount --bind {source} {target} on {node.name}: {result.stderr.strip()}")
        self._binds.append((node, str(target)))

    def _link_default_conf(self) -> None:
        """Point /run/slurm/conf at our configuration (see ``link_default_conf``); on a
        namespaced node bind it onto /etc/slurm."""
        for node in self._all_nodes():
            if node is not HOST and Path("/etc/slurm").is_dir():
                self._bind(node, self.conf_dir, "/etc/slurm")
        if not self.link_default_conf:
            return
        link = DEFAULT_CONF_LINK
        if link.is_symlink():
            target = Path(os.readlink(link))
            if target != self.conf_dir and target.exists() and live_record_for(target.parent):
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

    def _spawn(self, daemon: str, argv: Sequence[str], node: Node, *, user: str | None = None) -> str:
        name = self._name(daemon, node)
        self._daemons.spawn(name, argv, node=node, user=user, env=self.env)
        return name

    def _start_munged(self) -> None:
        munge = pwd.getpwnam("munge")
        key = self.workdir / "munge.key"
        if not key.exists():  # 1024 random bytes, as ``mungekey`` writes
            key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        folder = self.munge_dir  # as every node sees it
        for node in self._all_nodes():
            source = self._munge_source(node)
            run_key = source / "munge.key"  # munged wants a key owned by the munge user
            shutil.copyfile(key, run_key)
            run_key.chmod(0o600)
            os.chown(run_key, munge.pw_uid, munge.pw_gid)
            if node is not HOST:
                folder.mkdir(exist_ok=True)
                self._bind(node, source, folder)
            name = self._spawn(
                "munged",
                ["munged", "--foreground", f"--socket={folder}/munge.socket.2",
                 f"--key-file={folder}/munge.key", f"--pid-file={folder}/munged.pid",
                 f"--seed-file={folder}/munged.seed", f"--log-file={folder}/munged.log", "--num-threads=2"],
                node, user="munge",
            )
            socket_path = source / "munge.socket.2"
            self._daemons.wait(f"munged's socket on {node.name}", socket_path.exists, [name])

    def _start_mariadb(self) -> None:
        datadir = self.workdir / "mysql"
        init = self.head.run(
            [which("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
             f"--datadir={datadir}", "--user=root", "--auth-root-authentication-method=normal",
             "--skip-test-db"],
            timeout=120,
        )
        (self.log_dir / "mariadb-install-db.log").write_text(init.stdout + init.stderr)
        if init.returncode != 0:
            raise SlurmClusterError(f"mariadb-install-db failed\n{self.logs()}")
        name = self._spawn(
            "mariadbd",
            ["mariadbd", "--no-defaults", "--user=root", f"--datadir={datadir}",
             f"--socket={self.runtime_dir}/mysqld.sock", f"--pid-file={self.run_dir}/mariadbd.pid",
             f"--log-error={self.log_dir}/mariadbd.log", "--bind-address=127.0.0.1",
             f"--port={self.ports['mysql']}", "--skip-grant-tables", "--skip-name-resolve",
             "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=0",
             "--innodb-doublewrite=0", "--skip-log-bin"],
            self.head,
        )
        self._wait_listening(name, self.ports["mysql"])

    def _wait_listening(self, name: str, port: int) -> None:
        pid = self._daemons.procs[name].pid
        self._daemons.wait(f"{name} on port {port}", lambda: listening(pid, port), [name])

    def _start_slurmdbd(self) -> None:
        self._wait_listening(self._spawn("slurmdbd", ["slurmdbd", "-D"], self.head), self.ports["slurmdbd"])

    def _start_slurmctld(self) -> None:
        name = self._spawn("slurmctld", ["slurmctld", "-D", "-i"], self.head)
        self._daemons.wait(
            "slurmctld to answer",
            lambda: self.run(["scontrol", "ping"], check=False, timeout=10).stdout.count("UP") > 0,
            [name, self._name("slurmdbd", self.head)],
        )

    def _start_slurmd(self) -> None:
        for node in self.nodes:
            self._spawn("slurmd", ["slurmd", "-D", "-N", node.hostname], node)

    def _wait_nodes_idle(self) -> None:
        def idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%t"], check=False, timeout=10).stdout
            return out.split() == ["idle"] * len(self.nodes)

        self._daemons.wait("every node to become idle in sinfo", idle)


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/harness/slurm_cluster.py WORKDIR", file=sys.stderr)
        return 2
    cluster = SlurmCluster(argv[0])
    # Background jobs of a non-interactive shell ignore SIGINT: stop on SIGTERM too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cluster.start()
    print(f"SLURM cluster up in {cluster.start_seconds:.1f} s; export SLURM_CONF={cluster.slurm_conf}")
    print(cluster.run(["sinfo", "-N", "-O", "NodeList,StateLong,CPUs,Gres"]).stdout, end="", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
