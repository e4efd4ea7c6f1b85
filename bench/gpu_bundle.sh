#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on a GPU machine that has no network, into .gpu-wheels/
# (git-ignored; the device tool carries it: carry [".gpu-wheels"], 64 MiB at most). Run where pip
# reaches an index:
#
#   bash bench/gpu_bundle.sh                      # for CPython 3.12, manylinux x86_64 (the last GPU image's)
#   H3GPU_PYVER="3.12 3.13" bash bench/gpu_bundle.sh   # several interpreters: the per-version wheels of each
#
# What it was made for goes to .gpu-wheels/manifest.json; the check compares the machine's python
# with it first and stops, naming both, where they differ (bench/gpu/wheels.py check).
#
# The GPU image has torch 2.11 (CUDA 13.0), triton 3.6, transformers 5.17, accelerate, numpy, pillow,
# anyio, typer, rich and httpx. Bundled, every one pinned: what the check imports beyond those, at the
# versions the suite tests here (transformers 5.24 and huggingface-hub 2.4: pyproject's floor is what
# is tested, so the image's 5.17 is shadowed, not trusted) and their dependencies (installed only where
# the machine lacks them or has older ones). SageAttention 2 (sage-fp16, sage-fp8) is not on PyPI:
# put its source archive at .gpu-wheels/sdist/ (the check builds it with nvcc, bench/gpu/sage_build.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.gpu-wheels}
PY=${PYTHON:-python3}
PYVERS=${H3GPU_PYVER:-3.12}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64)
# Pure Python or abi3: one wheel for every interpreter.
COMMON=(
    diffusers==0.42.1 transformers==5.24.0 huggingface-hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0
    httpx2==2.16.2 sageattention==1.0.6 pydantic==2.14.4 annotated-types==0.8.0
    typing-inspection==0.4.5 typing-extensions==4.16.0 sqlite-utils==4.2.1 sqlite-fts4==1.0.3
    click-default-group==1.2.4 click==8.5.1 requests==2.34.2 certifi==2026.10.19.post1 idna==3.20
    urllib3==2.8.0 python-dateutil==4.0.0 tabulate==0.10.0 pluggy==1.7.0 httpx-sse==0.4.3 tomli-w==1.2.0
    tenacity==9.2.1 filelock==3.32.7 fsspec==2026.9.0 tqdm==4.70.1 packaging==26.4
)  # httpx-sse: h3core.cli imports it; tomli-w: capacity probe; tenacity: the core's retries
# Left out to stay under the device tool's 64 MiB carry: hf-xet (4 MiB; huggingface-hub imports it only to download).
# Compiled per Python version.
PER_VERSION=(pydantic-core==2.50.5 av==18.1.0 charset-normalizer==3.5.3 pyyaml==6.0.4 regex==2026.11.19)
download() {  # download PYVER SPEC...
    local pyver=$1
    shift
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
        "${PLATFORMS[@]/#/--platform=}" -d "$DEST" "$@"
}
mkdir -p "$DEST"
rm -f "$DEST"/*.whl "$DEST/manifest.json"
first=${PYVERS%% *}
download "$first" "${COMMON[@]}"
for v in $PYVERS; do download "$v" "${PER_VERSION[@]}"; done
pythons=$(printf '"%s",' $PYVERS)
cat > "$DEST/manifest.json" <<JSON
{"implementation": "cp", "pythons": [${pythons%,}], "machine": "x86_64", "platforms": "$(IFS=' '; echo "${PLATFORMS[*]}")",
 "made": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "commit": "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"}
JSON
ls "$DEST" | sed 's/^/  /'
mib=$(( $(du -sb "$DEST" | cut -f1) / 1048576 ))
echo "$mib MiB in $DEST"
[ "$mib" -lt 64 ] || echo "WARNING: $mib MiB: over the 64 MiB the device tool carries (carry [\".gpu-wheels\"])"
