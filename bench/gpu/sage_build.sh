#!/usr/bin/env bash
# Step 8a of gpu_check.sh: SageAttention 2 (sage-fp16, sage-fp8) built with nvcc from a source archive
# in the bundle, within H3GPU_SAGE_BUILD_S seconds, and installed into the check's site folder (over
# the bundled 1.0.6), so that step 8b measures its kernels. PyPI has only SageAttention 1.x: the
# archive (e.g. SageAttention-2.2.0.tar.gz, a release's source) is put at .gpu-wheels/sdist/ by hand.
# Skipped, with the reason, where there is no archive, no nvcc, or less than 60 s; exits 0 then.
# Runs with the variables setup.sh exports (PY, WHEELS, SITE, H3GPU_WORK, H3GPU_DRY).
set -uo pipefail
budget=${H3GPU_SAGE_BUILD_S:-0}
rm -f "$H3GPU_WORK/sage-built"
echo "## SageAttention 2 from source (sage-fp16, sage-fp8)"
echo
skip() { echo "skipped: $1"; echo "sage-fp16 and sage-fp8 stay unverified (never executed on a GPU by h3core's check)"; exit 0; }
sdist=$(ls -d "$WHEELS"/sdist/*.tar.gz "$WHEELS"/sdist/*.zip "$WHEELS"/sdist/*/setup.py 2>/dev/null | head -1)
[ -n "$sdist" ] || skip "no source archive in $WHEELS/sdist/ (PyPI has only SageAttention 1.x; put a 2.x release's source there)"
[ -n "${H3GPU_DRY:-}" ] && skip "dry run (nothing to build for a CPU)"
NVCC=$(command -v nvcc || ls "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" 2>/dev/null)
[ -n "$NVCC" ] || skip "no nvcc on PATH or in \${CUDA_HOME:-/usr/local/cuda}/bin"
[ "$budget" -ge 60 ] || skip "${budget} s left of the check's budget (set H3GPU_SAGE_BUILD_S=400 to give the build its own time)"
cap=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null) || skip "torch sees no CUDA device"
echo "building $(basename "${sdist%/setup.py}") with $NVCC ($("$NVCC" --version | tail -1)) for sm_${cap/./}, within ${budget} s"
out="$H3GPU_WORK/sage-wheel"
rm -rf "$out" && mkdir -p "$out"
src=$sdist
if [ "${sdist##*/}" = setup.py ]; then src=$(dirname "$sdist"); fi
t0=$(date +%s)
# No network: the machine's torch and setuptools build it (no isolation); only this device's architecture.
if TORCH_CUDA_ARCH_LIST="$cap" MAX_JOBS=$(nproc) EXT_PARALLEL=4 NVCC_APPEND_FLAGS="--threads 4" CUDA_HOME=$(dirname "$(dirname "$NVCC")") \
    timeout -k 5 $(( budget - 10 )) "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$out" "$src"; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade "$out"/*.whl || skip "the wheel did not install"
    echo "built and installed in $(( $(date +%s) - t0 )) s: $(ls "$out")"
    touch "$H3GPU_WORK/sage-built"
else
    skip "the build failed or ran out of time after $(( $(date +%s) - t0 )) s (run.log has its output)"
fi
