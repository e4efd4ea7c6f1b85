# Sourced by the GPU scripts: the python that already has a CUDA torch, diffusers and transformers
# (the device machine cannot reach a registry), the output folder ($OUT, or ./bench-gpu-out), the
# GPU's name, and this checkout on the import path.
set -euo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-bench-gpu-out}
mkdir -p "$OUT"
"$PY" -c 'import torch, diffusers, transformers; assert torch.cuda.is_available(), "no CUDA device"'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
