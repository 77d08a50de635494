"""The real AlphaFold 3 network's Python (issue 39): the Python 3.12 venv that .ci/install-af3.sh
makes in .ci-cache/py312-af3 (``GPU_CACHE_TEST_AF3_PYTHON`` names another), and jaxlib's CUDA
plugin apart from it (``GPU_CACHE_TEST_AF3_CUDA_PLUGIN``), for lowering jax-triton kernels for CUDA
on this CPU."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import REPO, unavailable

PYTHON = Path(os.environ.get("GPU_CACHE_TEST_AF3_PYTHON")
              or REPO / ".ci-cache" / "py312-af3" / "bin" / "python")
CUDA_PLUGIN = Path(os.environ.get("GPU_CACHE_TEST_AF3_CUDA_PLUGIN")
                   or REPO / ".ci-cache" / "py312-af3-cuda-plugin")
#: AlphaFold 3's run_alphafold.py for the tests: the wheel's real network behind upstream's flags.
RUN_ALPHAFOLD = REPO / "tests" / "fixtures" / "af3_run_alphafold.py"
#: The smallest network that is still the whole of it: 1 recycle, 1 sample, 2 diffusion steps,
#: XLA attention (tokamax's Triton attention needs a GPU); the token bucket is the shape.
REDUCED = ("--num_recycles=1", "--num_diffusion_samples=1", "--num_sampling_steps=2",
           "--flash_attention_implementation=xla")


def needs_af3(plugin: bool = False) -> Path:
    """The venv's Python; skips (fails under CI) where .ci/install-af3.sh has not run."""
    probe = "import alphafold3.model.model, haiku, tokamax, jax_triton"
    if not PYTHON.is_file():
        unavailable(f"no AlphaFold 3 test Python at {PYTHON} (.ci/install-af3.sh makes it)")
    done = subprocess.run([str(PYTHON), "-c", probe], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ""})
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:]
        unavailable(f"{PYTHON} cannot import AlphaFold 3's network ({said}); run .ci/install-af3.sh")
    if plugin and not (CUDA_PLUGIN / "jax_cuda12_plugin").is_dir():
        unavailable(f"no jax-cuda12-plugin in {CUDA_PLUGIN} (.ci/install-af3.sh installs it there)")
    return PYTHON
