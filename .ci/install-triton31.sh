#!/usr/bin/env bash
# A venv with Triton 3.1 for tests/test_jax_triton_t31.py: the AlphaFold 3.0.x generation (jax
# and jaxlib 0.4.34, jax-triton 0.2.0, and jaxlib's CUDA plugin, without which jax-triton does
# not import; installed with --no-deps, as .ci/run does for the host's). Triton 3.1 has no
# triton.knobs. Idempotent: a venv that imports these versions is left alone.
# Measured here: 16 s from PyPI, 1.2 GB on disk.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GPU_CACHE_TEST_TRITON31_VENV:-.ci-cache/triton31}"
if "$VENV/bin/python" -c 'import triton, jax_triton, jax_cuda12_plugin; assert triton.__version__ == "3.1.0"' \
        2>/dev/null; then
    exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "triton==3.1.0" "jax==0.4.34" "jaxlib==0.4.34" "jax-triton==0.2.0"
"$VENV/bin/python" -m pip install --quiet --no-deps "jax-cuda12-plugin==0.4.34"
