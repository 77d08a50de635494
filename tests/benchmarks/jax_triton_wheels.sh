#!/usr/bin/env bash
# Fetch, into .whl/, the Python 3.12 wheels that jax_triton_gpu.py needs beyond the H200 image
# (which has jax 0.11.2 with the CUDA 13 plugin, triton 3.6.0, absl-py, attrs, pyyaml,
# typing_extensions, but not jax-triton): jax-triton 0.3.1 (needs jax >= 0.8.2 and triton >= 3.6,
# which the image has), and jsonschema's closure, which gpu-cache's config check imports where a
# case sets a key (--ptxas-shim). Then, on the device:
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl \
    jax-triton==0.3.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
    rpds-py==0.30.0
du -sh .whl
