"""Shared pytest fixtures for gpu-cache.

``slurm_cluster`` (session scope) starts one real single-node SLURM cluster
(see ``tests/slurm_cluster.py``) for the whole test session, with
``SLURM_CONF`` exported in ``os.environ`` so that subprocesses (``sbatch``,
``snakemake --executor slurm``) talk to it. It skips only when the SLURM,
munge or MariaDB binaries are not installed (install them with
``.ci/install-slurm.sh``); any other failure to start is an error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurm_cluster import SlurmCluster, missing_binaries  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs the real SLURM test cluster (slurm_cluster fixture)")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running SLURM cluster with fake ``gpu:h100:1`` and ``gpu:a100:1`` on one node."""
    missing = missing_binaries()
    if missing:
        pytest.skip(
            "SLURM test cluster needs binaries that are not installed: "
            + ", ".join(missing)
            + " (run .ci/install-slurm.sh)"
        )
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    with cluster:
        cluster.activate()
        yield cluster
