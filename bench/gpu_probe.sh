#!/usr/bin/env bash
# `h3core capacity probe` on a GPU, as one script for the `device` tool: the released geometry
# (33 B-parameter transformer, random weights, bf16) on one device. With --memory-cap 80 the
# allocator is limited to an 80 GiB card's worth, so an out-of-memory boundary is reached in a
# few points (~13 GiB above the weights: about 75k tokens at 1344x768 by field notes §5b) and the
# whole run fits one 10-minute call. Uses the python that already has a CUDA torch and diffusers.
# Results go to $OUT (or ./bench-gpu-out).
#   run: bash bench/gpu_probe.sh [extra probe options]
. "$(dirname "$0")/_gpu_setup.sh"
# tomli-w writes the profile; where that python lacks it, carry only it from the venv
# (run's carry: .venv/lib/python3.11/site-packages/tomli_w) and it is found here.
if ! "$PY" -c 'import tomli_w' 2>/dev/null; then
    for d in .venv/lib/python3*/site-packages; do if [ -d "$d/tomli_w" ]; then export PYTHONPATH="$PYTHONPATH:$PWD/$d"; fi; done
fi
"$PY" -m h3core.cli capacity probe --device cuda --dtype bfloat16 --resolution 1344x768 \
    --start-frames 124 --max-frames 532 --memory-cap 80 -o "$OUT/probed-80gib.toml" "$@" 2>&1 | tee "$OUT/probe.txt"
cat "$OUT/probed-80gib.toml"
