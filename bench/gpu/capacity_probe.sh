#!/usr/bin/env bash
# `h3core capacity probe` on a GPU, as one script for the `device` tool, with the wheels
# gpu_bundle.sh made (.gpu-wheels/ carried): the released geometry (33 B-parameter transformer,
# random weights, bf16) on one device. With --memory-cap 80 the allocator is limited to an 80 GiB
# card's worth, so an out-of-memory boundary is reached in a few points (~13 GiB above the weights:
# about 75k tokens at 1344x768 by docs/design.md §5b) and the run fits one 10-minute call.
#   run(command="bash bench/gpu/capacity_probe.sh", carry=[".gpu-wheels"], timeout_s=600)
# Results in $OUT: probe.txt (every point), probed-80gib.toml (the profile).
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
step "wheels" 40 env.md bash -c install_wheels
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
step "capacity probe" 540 probe.txt "$PY" -m h3core.cli capacity probe --device cuda --dtype bfloat16 \
    --resolution 1344x768 --start-frames 124 --max-frames 532 --memory-cap 80 -o "$OUT/probed-80gib.toml" "$@"
printf '%s\n' "${SUMMARY[@]}"
