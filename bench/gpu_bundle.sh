#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on a GPU machine that has no network, into .gpu-wheels/
# (git-ignored; the device tool carries it: carry [".gpu-wheels"]). Run where pip reaches an index:
#
#   bash bench/gpu_bundle.sh                 # for the GPU machine: CPython 3.12, manylinux x86_64
#   H3GPU_PYVER=3.11 bash bench/gpu_bundle.sh   # for a dry run here (pydantic-core is per Python version)
#
# The GPU machine has torch 2.11 (CUDA 13.0), triton 3.6, transformers 5.17, accelerate, numpy,
# pillow, anyio, typer, rich and httpx. What the check imports beyond those is pinned here to what
# the project is tested with (the CORE ones are always installed there, see bench/gpu/wheels.py);
# the rest only where the machine lacks them. About 45 MiB.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.gpu-wheels}
PY=${PYTHON:-python3}
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${H3GPU_PYVER:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d "$DEST" \
    diffusers==0.42.1 sageattention==1.0.6 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0 sqlite-utils==4.2.1 sqlite-fts4==1.0.3 \
    click-default-group==1.2.4 av==18.1.0 huggingface-hub==1.33.0 requests==2.34.2 certifi charset-normalizer \
    idna urllib3 python-dateutil tabulate click pluggy httpx-sse==0.4.3 tomli-w==1.2.0 \
    tenacity==9.2.1  # httpx-sse: h3core.cli imports it; tomli-w: capacity probe; tenacity: the core's retries
ls "$DEST" | sed 's/^/  /'
du -sh "$DEST"
