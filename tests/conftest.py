"""Shared test helpers: a clean environment, the CLI and Snakemake as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Variables of the developer's shell that would leak into what a test measures (the
#: container ones too: a developer's bind list would change what a container test sees).
_LEAKY_PREFIXES = ("GPU_CACHE_", "JAX_", "TRITON_", "TORCHINDUCTOR_", "CUDA_CACHE_", "XLA_",
                   "APPTAINER_", "APPTAINERENV_", "SINGULARITY_", "SINGULARITYENV_")
#: ... except these, which configure the test infrastructure, not gpu-cache
#: (GPU_CACHE_TEST_ROOTS: where .ci/build-roots.sh put the container roots).
_KEPT_PREFIXES = ("GPU_CACHE_TEST_",)


def clean_environ(**extra: str) -> dict[str, str]:
    """os.environ without any cache variable, plus ``extra``."""
    environ = {k: v for k, v in os.environ.items()
               if (k.startswith(_KEPT_PREFIXES) or not k.startswith(_LEAKY_PREFIXES))
               and k != "PYTHONPATH"}
    environ["PYTHONPATH"] = str(SCRIPTS)
    environ.update(extra)
    return environ


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m gpu_cache ARGS`` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "gpu_cache", *args], env=env or clean_environ(),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_snakemake(workdir: Path, *args: str, env: dict[str, str] | None = None,
                  timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The real ``snakemake`` CLI in ``workdir``."""
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir,
                          env=env or clean_environ(), capture_output=True, text=True, timeout=timeout)


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


#: A small built-in workload for tests: one short sequence keeps each JAX process ~2 s.
SMALL = {"workloads": {"jax-transformer": {"shapes": [16]}}}


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    return tmp_path / "cache root"  # a space, on purpose: paths must be quoted everywhere


# --- the real SLURM cluster (tests/slurm_cluster.py) -------------------------------------

from slurm_cluster import SlurmCluster, missing_binaries  # noqa: E402


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


# --- container roots and the apptainer stand-in (tests/containers.py, tests/bin/apptainer) ---

import containers  # noqa: E402


@pytest.fixture(scope="session")
def container_root() -> "containers.ContainerRoot":
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
