"""Two compute nodes, a head node and a storage node on this machine, for tests of what a
cluster of several nodes sees (fixtures ``two_nodes`` and ``slurm_two_nodes``).

:class:`TwoNodes` starts, on the harness of tests/harness/daemons.py:

* a :class:`daemons.Network` of four namespaced nodes on one bridge in ``10.251.0.0/24``:
  ``head`` (hostname ``gc-head``, ``.1``), ``storage`` (``gc-storage``, ``.2``), ``a``
  (``gcnode-a``, ``.11``) and ``b`` (``gcnode-b``, ``.12``). Each has its own hostname, its own
  ``/tmp`` (a tmpfs: node-local scratch) and an ``/etc/hosts`` that names them all;
* on ``storage``, a private sshd that exports one folder (:class:`sshfs_mount.SshfsMount`),
  mounted over sshfs at the same path, :attr:`TwoNodes.shared`, on ``head``, ``a`` and ``b``:
  each mount its own FUSE client with its own locks and caches, as the nodes of a cluster see a
  network file system. ``flock`` through one node's mount excludes nothing on another's.

Everything lives in one folder under ``daemons.RUNTIME_BASE`` (:attr:`TwoNodes.workdir`: keys,
logs, the exported folder), which every node sees at the same path; the host's ``/tmp``
(pytest's ``tmp_path``) no node sees. The host sees the share's contents in
:attr:`TwoNodes.server_dir` (:meth:`TwoNodes.host_path` maps a path under ``shared`` there).

A test runs commands on a node with ``node.run(argv, env=...)`` (returns the completed process,
output captured as text) or starts one with ``node.popen(argv, env=..., stdout=...)``; ``cwd=``
is a folder as the node sees it::

    def test_both_nodes_see_one_share(two_nodes):
        script = two_nodes.shared / "hello.py"
        two_nodes.host_path(script).write_text("import socket; print(socket.gethostname())")
        for node in (two_nodes.a, two_nodes.b):
            done = node.run([sys.executable, str(script)], env=clean_environ())
            assert done.stdout.strip() == node.hostname

``slurm_two_nodes`` is a :class:`slurm_cluster.SlurmCluster` on these nodes: slurmctld,
slurmdbd and MariaDB on ``head``, one slurmd on ``a`` and one on ``b`` (NodeNames ``gcnode-a``
and ``gcnode-b``, each with fake ``gpu:h100:1`` and ``gpu:a100:1``); submit from ``head``
(``cluster.sbatch``, ``cluster.run``, ``two_nodes.head.run(["snakemake", ...], cwd=...)``).

Run ``python tests/harness/nodes.py [--slurm]`` to start them by hand (Ctrl-C or SIGTERM stops them).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from daemons import DaemonError, Daemons, NamespaceNode, Network
from sshfs_mount import SshfsMount, missing_requirements

__all__ = ["TwoNodes", "missing"]

#: (name, hostname, last octet) of each node.
NODES = (("head", "gc-head", 1), ("storage", "gc-storage", 2), ("a", "gcnode-a", 11), ("b", "gcnode-b", 12))


def missing() -> list[str]:
    """What this machine lacks for :class:`TwoNodes` (empty if nothing)."""
    return list(dict.fromkeys([*Network.missing(), *missing_requirements()]))


class TwoNodes:
    """Nodes ``a`` and ``b``, ``head`` and ``storage``, and one share (see the module's docstring)."""

    def __init__(self, *, start_timeout: float = 30.0) -> None:
        self.start_timeout = start_timeout
        self._daemons = Daemons("nodes", None, error=DaemonError, start_timeout=start_timeout)
        self._network: Network | None = None
        self.share: SshfsMount | None = None
        self.nodes: dict[str, NamespaceNode] = {}
        self.start_seconds: float | None = None

    @property
    def workdir(self) -> Path:
        """The folder of everything, which every node sees at the same path."""
        assert self._daemons.workdir is not None, "start() first"
        return self._daemons.workdir

    @property
    def shared(self) -> Path:
        """The mount point of the share, the same on ``head``, ``a`` and ``b``."""
        return self.workdir / "shared"

    @property
    def server_dir(self) -> Path:
        """The share's contents as the host sees them (the storage node's folder)."""
        assert self.share is not None, "start() first"
        return self.share.server_dir

    def host_path(self, path: str | os.PathLike[str]) -> Path:
        """Where the host sees ``path`` (a path under :attr:`shared`) on the storage node."""
        return self.server_dir / Path(path).relative_to(self.shared)

    @property
    def head(self) -> NamespaceNode:
        return self.nodes["head"]

    @property
    def storage(self) -> NamespaceNode:
        return self.nodes["storage"]

    @property
    def a(self) -> NamespaceNode:
        return self.nodes["a"]

    @property
    def b(self) -> NamespaceNode:
        return self.nodes["b"]

    def start(self) -> TwoNodes:
        """Make the nodes and mount the share on ``head``, ``a`` and ``b``. Returns ``self``.

        Raises:
            DaemonError: a requirement is missing, or a node or the share did not come up. What
                was started is stopped again."""
        lacking = missing()
        if lacking:
            raise DaemonError(f"two namespaced nodes need: {', '.join(lacking)}")
        t0 = time.monotonic()
        try:
            runtime = self._daemons.open()
            self._network = Network(self._daemons, "gc" + runtime.name.rsplit("-", 1)[-1][:8])
            self.nodes = self._network.start(NODES)
            self.share = SshfsMount(self.workdir / "sshfs", server=self.storage,
                                    start_timeout=self.start_timeout).start(mount=False)
            for node in (self.head, self.a, self.b):
                self.share.mount(self.shared, node=node)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Unmount the share, stop sshd, end every process on the nodes, delete their namespaces.
        Safe to call more than once; raises :class:`DaemonError` if something survived."""
        survivors = []
        if self.share is not None:
            try:
                self.share.stop()
            except Exception as error:  # noqa: BLE001 - the nodes must go away all the same
                survivors.append(str(error))
            self.share = None
        if self._network is not None:
            survivors += self._network.stop()
            self._network = None
        survivors += self._daemons.stop()
        self._daemons.close()
        self.nodes = {}
        if survivors:
            raise DaemonError("survived stop(): " + "; ".join(survivors))

    def __enter__(self) -> TwoNodes:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _main(argv: Sequence[str]) -> int:
    if argv not in ([], ["--slurm"]):
        print("usage: python tests/harness/nodes.py [--slurm]", file=sys.stderr)
        return 2
    from slurm_cluster import SlurmCluster

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with TwoNodes() as nodes:
        print(f"nodes up in {nodes.start_seconds:.1f} s; share {nodes.shared} "
              f"(on the host: {nodes.server_dir})", flush=True)
        for node in nodes.nodes.values():
            print(f"  {node.name}: {node.hostname} {node.address} netns {node.netns}: "
                  f"nsenter -t {node.holder} --net --uts --mount", flush=True)
        cluster = SlurmCluster(nodes.workdir / "slurm", head=nodes.head, nodes=[nodes.a, nodes.b]) \
            if argv else None
        try:
            if cluster is not None:
                cluster.start()
                print(f"SLURM up in {cluster.start_seconds:.1f} s; SLURM_CONF={cluster.slurm_conf}")
                print(cluster.run(["sinfo", "-N"]).stdout, end="", flush=True)
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            if cluster is not None:
                cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
