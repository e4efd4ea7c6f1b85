#!/usr/bin/env bash
# The GPU check's rehearsal on a CPU, against a stand-in for the GPU image: a bare virtualenv of this
# machine's python holding only packages the image has (bench/gpu/image.txt; `--no-deps`, so nothing
# else slips in; CPU torch in place of the image's CUDA build; the image's versions where the list
# gives them), a bundle made for this python (gpu_bundle.sh), then the whole check at toy sizes
# (H3GPU_DRY=cpu). What the real run would lack (a wheel the bundle forgot, a version the image's
# copy refuses) stops it here, at step 1 or at an import, instead of on a lent device.
#
#   bash bench/gpu/standin.sh            # 1 min 47 s here, the venv and the downloads included
#
# Where: $H3GPU_STANDIN (default /tmp/h3gpu-standin): venv/, wheels/, work/, out/ (the tables).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=${H3GPU_STANDIN:-/tmp/h3gpu-standin}
PY=${PYTHON:-python3}
# What the check's imports reach on the image, each on its list; numbers are the image's where known.
IMAGE=(
    torch==2.13.0 numpy pillow accelerate==1.15.0 typer rich tokenizers==0.23.2 safetensors==0.8.0
    huggingface-hub==1.33.0 pyyaml requests python-dateutil tabulate pluggy h11 packaging anyio click
    filelock fsspec idna tqdm typing-extensions certifi charset-normalizer urllib3 psutil sympy mpmath
    networkx jinja2 markupsafe markdown-it-py mdurl pygments shellingham annotated-doc pip
)
for spec in "${IMAGE[@]}"; do
    name=${spec%%==*}
    grep -qiE "^${name}(==|$)" "$ROOT/bench/gpu/image.txt" || { echo "STOP: $name is not on bench/gpu/image.txt" >&2; exit 2; }
done
rm -rf "$HERE/venv" "$HERE/work" "$HERE/out"
mkdir -p "$HERE"
"$PY" -m venv "$HERE/venv"
# torch==2.13.0: the CPU build on this machine's disk (its dependencies are on the list above).
"$HERE/venv/bin/python" -m pip install -q --no-deps "${IMAGE[@]}"
me=$("$HERE/venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
H3GPU_PYVER=$me PYTHON=$PY bash "$ROOT/bench/gpu_bundle.sh" "$HERE/wheels" | tail -3
PYTHON=$HERE/venv/bin/python H3GPU_WHEELS=$HERE/wheels H3GPU_WORK=$HERE/work OUT=$HERE/out H3GPU_DRY=cpu \
    bash "$ROOT/bench/gpu_check.sh"
