#!/usr/bin/env bash
# Build, in .carry/af3/, what tests/benchmarks/alphafold3_gpu.py needs on the GPU machine beyond
# its image (Python 3.12, jax 0.11.2 with CUDA, triton 3.6.0, numpy, scipy, ml_dtypes, opt_einsum,
# absl-py, pyyaml, typing_extensions), 50 MiB in all, under run's 64 MiB carry:
#   wheels/      cp312 wheels of ColabFold's AlphaFold 3, dm-haiku, tokamax, jax-triton and what
#                they import (the versions of .ci/af3-constraints.txt; rdkit is 31 MB of it), and
#                jsonschema's closure (gpu-cache's config check: outputs_proof.py's --af3 runs the CLI);
#   dictionary/  the chemical components the wheel lacks, built from biotite's dictionary with
#                AlphaFold 3's own parser (.ci/af3_dictionary.py), with the AlphaFold 3 test
#                Python (.ci/install-af3.sh; AF3_PYTHON names another);
#   stub/xprof   a stand-in for xprof (32 MB, with google-cloud and duckdb behind it): tokamax
#                imports its kernel-stats tool at import, for tokamax's own benchmarking only.
# The device command is in alphafold3_gpu.py's docstring.
set -euo pipefail
cd "$(dirname "$0")/../.."
AF3_PYTHON="${AF3_PYTHON:-.ci-cache/py312-af3/bin/python}"
OUT=.carry/af3
rm -rf "$OUT" && mkdir -p "$OUT/wheels" "$OUT/dictionary" "$OUT/stub/xprof/cli"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -c .ci/af3-constraints.txt -d "$OUT/wheels" \
    alphafold3-colabfold dm-haiku dm-tree etils jmp tabulate tokamax einshape immutabledict jaxtyping \
    wadler-lindig pydantic pydantic-core annotated-types typing-inspection qwix flax msgpack optax rich \
    pygments markdown-it-py mdurl treescope tqdm zstandard rdkit jax-triton charset-normalizer wrapt \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
"$AF3_PYTHON" .ci/af3_dictionary.py "$OUT/dictionary"
echo '"""A stand-in for xprof: tokamax imports its kernel-stats tool for its own benchmarking."""' \
    > "$OUT/stub/xprof/__init__.py"
: > "$OUT/stub/xprof/cli/__init__.py"
echo 'get_kernel_stats_tool = None  # tokamax/_src/benchmarking.py imports it; AlphaFold 3 never calls it' \
    > "$OUT/stub/xprof/cli/tools.py"
du -sh "$OUT"
