#!/usr/bin/env bash
# Fetch, into .whl/registry/, what tests/benchmarks/registry_start.py needs on the H200 image
# (Python 3.12, jax 0.11.2, no registry, nothing reachable): the Python 3.12 wheels of oras-py and
# of what it and gpu-cache's config check import (requests and its dependencies, jsonschema and
# its, fastjsonschema for unpack, filelock), and Debian's docker-registry binary (the CNCF
# distribution server, about 20 MB, linked against libc only; .ci/install-registry.sh installs it
# here). Then, on the device:
#   pip install --no-index --no-deps --target /tmp/site .whl/registry/*.whl
#   PYTHONPATH=/tmp/site python3 tests/benchmarks/registry_start.py --model twelve \
#       --registry-binary .whl/registry/bin/docker-registry --out "$OUT"
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/install-registry.sh >/dev/null
mkdir -p .whl/registry/bin
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl/registry \
    oras==0.2.43 requests==2.32.5 urllib3==2.5.0 idna==3.11 charset-normalizer==3.4.4 certifi==2025.11.12 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0 \
    attrs==25.4.0 fastjsonschema==2.22.3 filelock==3.20.0 typing_extensions==4.15.0
cp /usr/bin/docker-registry .whl/registry/bin/docker-registry
du -sh .whl/registry
