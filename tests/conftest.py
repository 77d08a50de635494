"""Fixtures only; what the tests share besides is in harness/ (pyproject's pytest ``pythonpath``
puts this checkout's scripts/, tests/ and tests/harness/ first)."""

from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import carried
import containers
import publishing
from gpu_cache.core.kinds import jax_format as jax_cache
from helpers import FILLER, SCRIPTS, jax_job_env, read_json, run_cli, unavailable
from nodes import TwoNodes
from nodes import missing as nodes_missing
from registry import RegistryServer
from slurm_cluster import SlurmCluster, missing_binaries
from sshfs_mount import SshfsMount, missing_requirements

#: A test that uses one of these is marked ``slow``: it needs a daemon, a mount or a container, or
#: shares a module's cache that takes seconds to compile (the first user pays for it).
SLOW_FIXTURES = frozenset({
    "slurm_cluster", "slurm_two_nodes", "two_nodes", "sshfs_mount", "sshfs_root", "container_root",
    "unbound_dir", "mounts", "private_tmpfs", "registry_server", "published", "carry_root", "warmed",
    "validated", "built", "compiled_root", "template_cache", "twelve_entries", "zstd_cache", "recorded",
})


#: Daemons that exist once per session (SLURM links /run/slurm/conf; the two nodes' SLURM sits on
#: them): under pytest-xdist their tests run one after another in one worker (``--dist loadgroup``).
ONE_WORKER_FIXTURES = frozenset({"slurm_cluster", "two_nodes", "slurm_two_nodes"})


#: Set-ups that take seconds and serve the tests of several modules (a warmed root, its archive),
#: session-scoped: made once, in the one worker that runs every test that uses them (the group).
SHARED_FIXTURES = {"carry_root": "carry", "registry_server": "registry"}


def xdist_group(item: pytest.Item) -> str | None:
    """The worker group of a test that shares a fixture with others: ``cluster`` for the daemons
    of :data:`ONE_WORKER_FIXTURES`, a set-up's group for those of :data:`SHARED_FIXTURES`, else
    its module for a module-scoped fixture (a warmed cache that takes seconds to make, made once
    per worker that runs one of its tests)."""
    used = getattr(item, "fixturenames", ())
    if ONE_WORKER_FIXTURES.intersection(used):
        return "cluster"
    for name in used:
        if name in SHARED_FIXTURES:
            return SHARED_FIXTURES[name]
    definitions = getattr(item, "_fixtureinfo", None)
    for name in used:
        found = definitions.name2fixturedefs.get(name) if definitions else None
        if found and found[-1].scope in ("module", "package"):
            return item.nodeid.split("::", 1)[0]
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Compile this checkout's package to bytecode once (pytest-xdist's workers leave it to the
    controller): the tests start it in hundreds of fresh processes, which, where the environment
    sets PYTHONDONTWRITEBYTECODE as images often do, would each compile every module they import
    again. Best effort: a read-only checkout runs as before."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(SCRIPTS / "gpu_cache", quiet=2)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):
    """Keep the test modules' bytecode as pytest rewrites their asserts: where the environment
    sets PYTHONDONTWRITEBYTECODE, every worker of every run rewrote every test module again (5 of
    the 8 seconds a collection took here). pytest reads what it kept whatever that setting says,
    and writes a module's file whole or not at all; best effort, as above."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = saved


#: Most pytest-xdist workers ``-n auto`` starts: a test may start 8 compiling processes, and more
#: workers than this were never measured (docs/testing.md).
MOST_WORKERS = 4


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Two workers a core this process may use, at most :data:`MOST_WORKERS`: the tests wait on
    SLURM, leases and their jobs more than they compute: with a worker a core, a machine like CI's
    sat idle a quarter of the run (docs/testing.md). PYTEST_XDIST_AUTO_NUM_WORKERS, when set,
    is left to pytest-xdist."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return min(2 * len(os.sched_getaffinity(0)), MOST_WORKERS)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups and ``-m`` the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that uses a fixture of :data:`SLOW_FIXTURES` (the tests that take
    more than 2 s without one carry the mark themselves), and put the tests that share a fixture
    in one ``xdist_group`` (:func:`xdist_group`)."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    return tmp_path / "cache root"  # a space, on purpose: paths must be quoted everywhere


# --- other users' view: a folder they can reach, a group, a user with a user-private group ---


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder other users can reach (pytest's own folders are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="gpu-cache-reachable-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def team_group() -> Iterator[str]:
    """A real group, made for the test and deleted after it."""
    name = f"gpucachet{os.getpid() % 100000}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


@pytest.fixture
def private_user(base: Path) -> Iterator[str]:
    """A real user with a user-private group (useradd --user-group) and a home under ``base``."""
    name = f"gpucacheu{os.getpid() % 100000}"
    home = base / "home" / name
    subprocess.run(["useradd", "--user-group", "--no-create-home", "--home-dir", str(home),
                    "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


# --- real SLURM clusters (harness/slurm_cluster.py) and namespaced nodes (harness/nodes.py) --------


#: The session cluster's GPUs: two types of one each, and a type of two on one node.
SESSION_GPUS = {"h100": 1, "a100": 1, "3090": 2}


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A running single-node SLURM cluster on this machine with fake ``gpu:h100:1``,
    ``gpu:a100:1`` and two of one model, ``gpu:3090:2`` (CUDA_VISIBLE_DEVICES 2 and 3), on a
    node of 16000 MB (too little for some jobs: tests/test_slurm_not_cold.py).

    ``SLURM_CONF`` is exported into os.environ for the session so that sbatch and
    ``snakemake --executor slurm`` reach it. Without the SLURM binaries the tests skip on a
    developer's machine, and fail under CI (where .ci/install-slurm.sh installs them).
    """
    missing = missing_binaries()
    if missing:
        unavailable(f"the SLURM test cluster needs {', '.join(missing)} (run .ci/install-slurm.sh)")
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), gpus=SESSION_GPUS) as cluster:
        cluster.activate()
        yield cluster


@pytest.fixture(scope="session")
def two_nodes():
    """Nodes ``a`` and ``b`` (plus ``head`` and ``storage``), each in its own network, UTS and
    mount namespace, with one sshfs share at the same path on each (tests/harness/nodes.py says how to
    use them). Skips on a developer's machine that lacks what they need; fails under CI."""
    missing = nodes_missing()
    if missing:
        unavailable(f"two namespaced nodes need {', '.join(missing)} (run .ci/install-sshfs.sh as root)")
    with TwoNodes() as nodes:
        yield nodes


@pytest.fixture(scope="session")
def slurm_two_nodes(two_nodes: TwoNodes):
    """A SLURM cluster on ``two_nodes``: slurmctld on ``head``, slurmd on ``a`` and ``b``
    (NodeNames ``gcnode-a`` and ``gcnode-b``, each with fake ``gpu:h100:1`` and ``gpu:a100:1``).
    Submit from the head (``cluster.sbatch``, ``cluster.run``)."""
    missing = missing_binaries()
    if missing:
        unavailable(f"the SLURM test cluster needs {', '.join(missing)} (run .ci/install-slurm.sh)")
    with SlurmCluster(two_nodes.workdir / "slurm", head=two_nodes.head,
                      nodes=[two_nodes.a, two_nodes.b]) as cluster:
        yield cluster


# --- a real network filesystem: sshfs over loopback (tests/harness/sshfs_mount.py) ---------------


@pytest.fixture
def sshfs_mount(tmp_path: Path):
    """A running loopback sshfs mount (``.mount_point`` shows ``.server_dir``), unmounted and
    its sshd stopped after the test, pass or fail. Skips on a developer's machine without
    sshd/sshfs/``/dev/fuse``/root; fails under CI (where .ci/install-sshfs.sh installs them)."""
    missing = missing_requirements()
    if missing:
        unavailable(f"the sshfs tests need {', '.join(missing)} (run .ci/install-sshfs.sh as root)")
    with SshfsMount(tmp_path / "sshfs") as share:
        yield share


@pytest.fixture
def sshfs_root(sshfs_mount: SshfsMount) -> Path:
    """The mounted folder of a fresh loopback sshfs mount (type ``fuse.sshfs``)."""
    return sshfs_mount.mount_point


# --- container roots and the apptainer stand-in (tests/harness/containers.py, tests/bin/apptainer) ---


@pytest.fixture(scope="session")
def container_root() -> containers.ContainerRoot:
    """The default isolated root (Python 3.9, jax 0.4.30; see tests/harness/containers.py).

    Its ``environ(**extra)`` gives a clean environment with tests/bin (the ``apptainer``
    stand-in) first on ``PATH``, for ``snakemake --sdm apptainer`` runs; ``exec(...)`` runs a
    command in it. Skips when the root or bwrap is missing on a developer's machine, and fails
    under CI (where .ci/build-roots.sh builds it).
    """
    root, problem = containers.find_root()
    if root is None:
        unavailable(problem)
    return root


@pytest.fixture
def unbound_dir():
    """A new host folder that containers do not see unless it is bound; removed afterwards."""
    path = containers.unbound_host_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def twelve_entries(tmp_path_factory) -> Path:
    """A JAX cache with 12 real entries, made once per test module on local disk (tests copy it
    where they need it)."""
    folder = tmp_path_factory.mktemp("twelve") / "jax"
    subprocess.run([sys.executable, "-c", FILLER, "12"], env=jax_job_env(folder, shared_fs=True), check=True)
    assert len(jax_cache.scan(folder)) == 12
    return folder


# --- a warmed root and its archive, carried by the pack/unpack tests (tests/test_carry*.py) ------


@pytest.fixture(scope="session")
def carry_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache root warmed on the CPU: JAX entries and sm_90 Triton kernels (do not change it)."""
    root = tmp_path_factory.mktemp("carry") / "warm root"
    work = root.parent
    result = run_cli("warm", "--config-json", carried.CONFIG, "--cache-root", str(root),
                     "--output", str(work / "warm.json"), "--log", str(work / "warm.log"))
    assert result.returncode == 0, result.stderr
    return root


@pytest.fixture(scope="session")
def carry_archive(carry_root: Path) -> Path:
    """``carry_root`` packed (do not change it)."""
    path = carry_root.parent / "carry.tar.gz"
    result = run_cli("pack", str(path), "--cache-root", str(carry_root))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("packed ")
    return path


# --- a real OCI registry and a validated pack published to it (tests/test_registry*.py) ----------


@pytest.fixture(scope="session")
def registry_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """Debian's ``docker-registry`` on loopback (tests/harness/registry.py)."""
    publishing.needs_registry()
    with RegistryServer(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture(scope="session")
def published(registry_server: RegistryServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Root A, warmed, validated and published to ``<registry>/lab/cache:1`` (do not change it)."""
    work = tmp_path_factory.mktemp("site-a")
    root = work / "a root"
    verdict = publishing.warm_and_validate(root, work)
    ref = f"{registry_server.host}/lab/cache:1"
    result = run_cli("publish", ref, "--cache-root", str(root), "--verdict", str(verdict),
                     "--output", str(work / "publish.json"))
    assert result.returncode == 0, result.stderr
    return {"root": root, "verdict": verdict, "ref": ref, "report": read_json(work / "publish.json"),
            "stdout": result.stdout}
