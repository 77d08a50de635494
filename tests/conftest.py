"""Fixtures only; the helpers the tests share are in helpers.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The package from this checkout's scripts/ (not an installed copy), and tests/ for helpers.py.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_cluster import SlurmCluster, missing_binaries


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    return tmp_path / "cache root"  # a space, on purpose: paths must be quoted everywhere


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A running single-node SLURM cluster with fake ``gpu:h100:1`` and ``gpu:a100:1``.

    ``SLURM_CONF`` is exported into os.environ for the session so that sbatch and
    ``snakemake --executor slurm`` reach it. Without the SLURM binaries the tests skip on a
    developer's machine, and fail under CI (where .ci/install-slurm.sh installs them).
    """
    missing = missing_binaries()
    if missing:
        message = f"the SLURM test cluster needs {', '.join(missing)} (run .ci/install-slurm.sh)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        cluster.activate()
        yield cluster


# --- a real network filesystem: sshfs over loopback (tests/sshfs_mount.py) ---------------

from sshfs_mount import SshfsMount, missing_requirements  # noqa: E402


@pytest.fixture
def sshfs_mount(tmp_path: Path):
    """A running loopback sshfs mount (``.mount_point`` shows ``.server_dir``), unmounted and
    its sshd stopped after the test, pass or fail. Skips on a developer's machine without
    sshd/sshfs/``/dev/fuse``/root; fails under CI (where .ci/install-sshfs.sh installs them)."""
    missing = missing_requirements()
    if missing:
        message = f"the sshfs tests need {', '.join(missing)} (run .ci/install-sshfs.sh as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with SshfsMount(tmp_path / "sshfs") as share:
        yield share


@pytest.fixture
def sshfs_root(sshfs_mount: SshfsMount) -> Path:
    """The mounted folder of a fresh loopback sshfs mount (type ``fuse.sshfs``)."""
    return sshfs_mount.mount_point


# --- container roots and the apptainer stand-in (tests/containers.py, tests/bin/apptainer) ---

import containers  # noqa: E402


@pytest.fixture(scope="session")
def container_root() -> containers.ContainerRoot:
    """The default isolated root (Python 3.9, jax 0.4.30; see tests/containers.py).

    Its ``environ(**extra)`` gives a clean environment with tests/bin (the ``apptainer``
    stand-in) first on ``PATH``, for ``snakemake --sdm apptainer`` runs; ``exec(...)`` runs a
    command in it. Skips when the root or bwrap is missing on a developer's machine, and fails
    under CI (where .ci/build-roots.sh builds it).
    """
    root, problem = containers.find_root()
    if root is None:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    return root


@pytest.fixture
def unbound_dir():
    """A new host folder that containers do not see unless it is bound; removed afterwards."""
    import shutil

    path = containers.unbound_host_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
