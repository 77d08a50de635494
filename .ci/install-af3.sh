#!/usr/bin/env bash
# The real AlphaFold 3 network's test environment (issue 39): a Python 3.12 venv in
# .ci-cache/py312-af3 (ignored by git) with ColabFold's wheel of AlphaFold 3's model code
# (alphafold3-colabfold: cp312 only; its metadata omits jax, dm-haiku, tokamax and rdkit), jax,
# dm-haiku, tokamax, jax-triton 0.4.x and triton, and the chemical components the wheel lacks,
# built here from biotite's bundled dictionary with AlphaFold 3's own parser (.ci/af3_dictionary.py):
# nothing is fetched when the tests run. jaxlib's CUDA plugin goes apart from the venv, into
# .ci-cache/py312-af3-cuda-plugin, for the tests that lower jax-triton kernels for CUDA on this
# CPU (installed in the venv, every `import jax` there would print CUDA warnings).
# triton 3.9.0: tokamax 0.0.17's Triton GLU passes its strides as tuple constants, which Triton
# 3.6.0 and 3.7.1 cannot unpack ("cannot convert (128, 1) of type <class 'tuple'> to tensor").
# Measured here (2 shared cores): about 1 min on a warm pip cache; 1.9 GB on disk.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.ci-cache/py312-af3
PYTHON312="${PYENV_ROOT:-$HOME/.pyenv}/versions/3.12.1/bin/python"
[ -x "$VENV/bin/python" ] || "$PYTHON312" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c .ci/af3-constraints.txt \
    "alphafold3-colabfold==3.1.18" "jax==0.11.2" "jaxlib==0.11.2" "dm-haiku==0.0.17" \
    "tokamax==0.0.17" "jax-triton==0.4.1" "triton==3.9.0" "rdkit==2026.9.1" "biotite==2.0.0"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target .ci-cache/py312-af3-cuda-plugin --upgrade "jax-cuda12-plugin==0.11.2"
"$VENV/bin/python" .ci/af3_dictionary.py
