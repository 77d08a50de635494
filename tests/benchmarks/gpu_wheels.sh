#!/usr/bin/env bash
# Fetch, into .whl/, the Python 3.12 wheels that gpu_benchmark.py needs on the H200 image
# (which has jax, triton, torch, einops, pandas, pyyaml, but no snakemake; filelock, wrapt, psutil
# and typing_extensions were missing on some of its machines, so they travel too):
# snakemake 9.27.1 and the dependencies the image lacks, and fla-core for the Triton library
# workload. connection_pool has no wheel on the registry, so it is built here (pure Python).
# Then, on the device: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl \
    snakemake==9.27.1 immutables==0.21 ConfigArgParse==1.9.0 docutils==0.22.4 GitPython==3.2.1 \
    gitdb==4.0.12 smmap==5.0.3 humanfriendly==10.0 jsonschema==4.26.0 \
    jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0 nbformat==5.11.1 \
    fastjsonschema==2.22.3 jupyter_core==5.9.1 traitlets==5.15.0 PuLP==3.3.2 tenacity==9.2.1 \
    smart_open==7.7.1 snakemake-interface-executor-plugins==9.4.0 argparse-dataclass==2.0.0 \
    snakemake-interface-common==1.23.0 throttler==1.2.3 snakemake-interface-storage-plugins==4.4.1 \
    snakemake-interface-report-plugins==1.3.0 snakemake-interface-logger-plugins==2.1.0 \
    snakemake-interface-scheduler-plugins==2.0.2 yte==1.9.4 dpath==2.2.0 conda-inject==1.3.2 \
    sqlmodel==0.0.37 SQLAlchemy==2.0.58 greenlet==3.5.6 pydantic==2.13.4 annotated-types==0.7.0 \
    pydantic_core==2.46.4 typing-inspection==0.4.2 platformdirs==4.14.8 fla-core==0.6.0 \
    filelock==3.20.0 wrapt==1.17.3 psutil==7.1.3 typing_extensions==4.15.0
python3 -m pip wheel -q --no-deps -w .whl connection_pool==0.0.3
du -sh .whl
