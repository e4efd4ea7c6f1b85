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
# The GPU image has torch 2.11 (CUDA 13.0), triton 3.6, transformers 5.17, tokenizers 0.23.2, safetensors
# 0.8.0, accelerate, numpy, pillow, typer, rich and more (bench/gpu/image.txt lists them). Bundled, every
# one pinned: what the check imports beyond those, at the versions the suite tests here (transformers
# 5.24 and huggingface-hub 2.4: pyproject's floor is what is tested, so the image's 5.17 is shadowed,
# not trusted), and what those need where a requirement names a version the image's list does not
# give (installed only where the machine lacks them or has older ones). Then `wheels.py needs` follows
# every requirement through the bundle and the image's list, and the travelling size is checked: the
# device tool carries the working tree and the bundle together, 64 MiB at most. SageAttention 2
# (sage-fp16, sage-fp8) is not on PyPI: put its source archive at .gpu-wheels/sdist/ (the check builds
# it with nvcc, bench/gpu/sage_build.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=${1:-$ROOT/.gpu-wheels}
PY=${PYTHON:-python3}
PYVERS=${H3GPU_PYVER:-3.12}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64)
# Pure Python or abi3: one wheel for every interpreter.
COMMON=(
    diffusers==0.42.1 transformers==5.24.0 huggingface-hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2
    truststore==0.10.5 sageattention==1.0.6 pydantic==2.14.4 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4 anyio==4.16.0
    sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4 click==8.5.1 idna==3.20
    httpx-sse==0.4.3 tomli-w==1.2.0 tenacity==9.2.1 filelock==3.32.7 fsspec==2026.9.0 tqdm==4.70.1 packaging==26.4
)  # httpx-sse: h3core.cli imports it; tomli-w: capacity probe; tenacity: the core's retries
# Left out to stay under the 64 MiB: hf-xet (4 MiB; huggingface-hub imports it only to download) and
# what the image has at versions every requirement takes (tokenizers 0.23.2, safetensors 0.8.0, and
# unversioned needs: requests, python-dateutil, tabulate, pluggy, pyyaml).
# Compiled per Python version.
PER_VERSION=(pydantic-core==2.50.5 av==18.1.0 regex==2026.11.19)
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
"$PY" "$ROOT/bench/gpu/wheels.py" needs "$DEST" "$ROOT/bench/gpu/image.txt"
# What travels with `run`: the tracked files, the untracked ones git does not ignore, and the bundle.
tree=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
bundle=$(du -sb "$DEST" | cut -f1)
total=$(( tree + bundle ))
echo "$(( bundle / 1048576 )) MiB in $DEST; with the working tree ($(( tree / 1024 )) KiB) $(( total / 1048576 )).$(( total % 1048576 * 10 / 1048576 )) MiB travel"
if [ "$total" -ge $(( 64 * 1048576 )) ]; then
    echo "STOP: over the 64 MiB the device tool carries with the working tree (carry [\".gpu-wheels\"]): leave a wheel out" >&2
    exit 5
fi
