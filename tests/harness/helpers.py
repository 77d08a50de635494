"""Helpers the tests share: paths, a clean environment, the CLI and Snakemake as real subprocesses,
configs and working directories, and a JAX job's environment. (Fixtures live in conftest.py.)"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
HOOK = SCRIPTS / "gpu_cache" / "_hook"
SNAKEFILE = str(REPO / "workflow" / "Snakefile")
PROFILE = str(REPO / "profiles" / "gpu-cache")
#: The example host pipeline that includes gpu-cache as a module, and the --config that points it here.
HOST = REPO / "tests" / "example_host"
MODULE = f"gpu_cache_snakefile={SNAKEFILE}"

#: A small built-in workload for tests: one short sequence keeps each JAX process ~2 s.
SMALL = {"workloads": {"jax-transformer": {"shapes": [16]}}}

#: Inductor's CPU-feature probes taken as passed in the tests' processes: six g++ builds, each
#: loaded in a process of its own, that torch.compile on the CPU makes in every fresh Inductor
#: folder (7 of the 29 CPU seconds a cold compile of the small torch-compile workload took here).
#: Every test compiles the same kernels with it; test_inductor_cuda.py, whose root must hold the
#: probes, runs without it.
INDUCTOR_PROBES_PASSED = {"TORCHINDUCTOR_VEC_ISA_OK": "1"}

#: Variables of the developer's shell that would leak into what a test measures.
#: (the container ones too: a developer's bind list would change what a container test sees)
_LEAKY_PREFIXES = ("GPU_CACHE_", "JAX_", "TRITON_", "TORCHINDUCTOR_", "CUDA_CACHE_", "XLA_",
                   "APPTAINER_", "APPTAINERENV_", "SINGULARITY_", "SINGULARITYENV_")
#: ... except these, which configure the test infrastructure, not gpu-cache
#: (GPU_CACHE_TEST_ROOTS: where .ci/build-roots.sh put the container roots).
_KEPT_PREFIXES = ("GPU_CACHE_TEST_",)


def unavailable(message: str) -> NoReturn:
    """Skip a test whose component (SLURM, sshd, a root filesystem, a mount) is missing on a
    developer's machine; fail it under CI (``CI`` set), where .ci/run installs everything, so a
    missing install step can never pass green."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def hook_source(name: str) -> Path:
    """The file of the startup hook's module ``name``: ``sitecustomize``, or a module of its
    package named as the hook names it (``tier.files`` is ``gpu_cache_hook/tier/files.py``)."""
    if name == "sitecustomize":
        return HOOK / "sitecustomize.py"
    path = HOOK.joinpath("gpu_cache_hook", *name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def hook_piece(name: str) -> types.ModuleType:
    """The module ``name`` of the startup hook's package (``names``, ``tier.files``, a kind's
    piece ``kinds.jax``), loaded in this process as a job loads it: ``gpu_cache_hook.<name>``,
    from the hook's folder (its imports are relative: the package and the leaf come with it)."""
    sys.path.insert(0, str(HOOK))
    try:
        return importlib.import_module(f"gpu_cache_hook.{name}")
    finally:
        sys.path.remove(str(HOOK))


def clean_environ(**extra: str) -> dict[str, str]:
    """os.environ without any cache variable, plus :data:`INDUCTOR_PROBES_PASSED` and ``extra``."""
    environ = {k: v for k, v in os.environ.items()
               if (k.startswith(_KEPT_PREFIXES) or not k.startswith(_LEAKY_PREFIXES))
               and k != "PYTHONPATH"}
    environ["PYTHONPATH"] = str(SCRIPTS)
    environ.update(INDUCTOR_PROBES_PASSED)
    environ.update(extra)
    return environ


def fake_sinfo(folder: Path, script: str) -> dict[str, str]:
    """A clean environment whose ``sinfo`` (first on PATH, in ``folder``) is the sh ``script``:
    what a cluster says, without one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sinfo").write_text(f"#!/bin/sh\n{script}\n")
    (folder / "sinfo").chmod(0o755)
    return clean_environ(PATH=f"{folder}{os.pathsep}{os.environ['PATH']}")


def jax_job_env(jax_dir: Path, *, records: Path | None = None, extra_path: Sequence[str] = (),
                shared_fs: bool = False, **extra: str) -> dict[str, str]:
    """A clean environment for a JAX process with its persistent cache in ``jax_dir``, writing
    every compile (no minimum compile time).

    records: also load the stats hook (first on PYTHONPATH), writing its records there;
      ``extra_path`` goes between the hook and scripts/ ("" entries are dropped).
    shared_fs: also what gpu-cache exports on a shared filesystem: no minimum entry size and
      no XLA caches inside the cache folder.
    ``extra`` is set last and wins.
    """
    environ = {"JAX_COMPILATION_CACHE_DIR": str(jax_dir), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    if shared_fs:
        environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
        environ["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] = "none"
    hook = [str(HOOK)] if records is not None else []
    if records is not None:
        environ["GPU_CACHE_RECORDS"] = str(records)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (*hook, *extra_path, str(SCRIPTS)) if p)
    return clean_environ(**(environ | extra))


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m gpu_cache ARGS`` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "gpu_cache", *args], env=env or clean_environ(),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_cli_here(*args: str) -> subprocess.CompletedProcess[str]:
    """``gpu-cache ARGS`` in this process (no interpreter start: a tenth of a fresh process's
    time), in a clean environment, its stdout and stderr captured, as :func:`run_cli` gives them."""
    import contextlib
    import io

    from gpu_cache.cli import main

    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_environ())
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    texts = [stream.buffer.getvalue().decode("utf-8", "surrogateescape") for stream in (out, err)]
    return subprocess.CompletedProcess(["gpu-cache", *args], code, *texts)


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


def workdir_with_config(tmp_path: Path, extra: dict) -> Path:
    """A working directory holding the embedded default config, changed by ``extra``."""
    work = tmp_path / "work"
    (work / "config").mkdir(parents=True)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text()) | extra
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return work


def host_copy(tmp_path: Path) -> Path:
    """A copy of the example host pipeline, without what earlier runs left in it."""
    work = tmp_path / "host"
    shutil.copytree(HOST, work, ignore=shutil.ignore_patterns(".snakemake", "results", "logs", "predictions"))
    return work


#: A JAX program that reloads 12 cached programs (jnp.sin(x) * (i + 1)) round after round, printing
#: "ready" after the first, until the file named by its argument exists: a reader under load.
READER = ("import jax, jax.numpy as jnp, numpy as np, pathlib, sys\n"
          "stop = pathlib.Path(sys.argv[1])\n"
          "rounds = 0\n"
          "while not stop.exists() or rounds < 2:\n"
          "    for i in range(12):\n"
          "        jax.jit(lambda x, i=i: jnp.sin(x) * (i + 1))(np.ones(8, np.float32)).block_until_ready()\n"
          "    jax.clear_caches()  # the next round reads the disk cache again\n"
          "    rounds += 1\n"
          "    if rounds == 1:\n"
          "        print('ready', flush=True)\n")


# --- several JAX processes at once (the concurrency and network-filesystem tests) ---------

#: Three tiny programs, one cache entry each: fast on 2 cores, distinct keys.
TINY = ("import jax, jax.numpy as jnp, numpy as np\n"
        "for i in range(3):\n"
        "    jax.jit(lambda x, i=i: jnp.tanh(x @ x.T) * (i + 1))(np.ones((32, 32), np.float32))"
        ".block_until_ready()\n")
#: ``N`` programs (the first argument), one small entry each; READER reloads the first 12.
FILLER = ("import jax, jax.numpy as jnp, numpy as np, sys\n"
          "for i in range(int(sys.argv[1])):\n"
          "    jax.jit(lambda x, i=i: jnp.sin(x) * (i + 1))(np.ones(8, np.float32)).block_until_ready()\n")


def start_many(n: int, command: list[str], env: dict[str, str]) -> list[subprocess.Popen]:
    """Start ``n`` copies of ``command`` together, their output piped."""
    return [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(n)]


def finish(processes: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str]]:
    """Each process's exit code and stderr, once all have ended."""
    return [(p.wait(timeout=timeout), p.communicate()[1]) for p in processes]


def records(root: Path, kind: str) -> list[dict]:
    """The ``kind`` section of each hook record under ``root/records`` (none where no hook ran)."""
    found = [json.loads(p.read_text()) for p in sorted((root / "records").glob("*.json"))]
    return [r[kind] for r in found if kind in r]
