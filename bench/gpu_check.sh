#!/usr/bin/env bash
# The pipeline on a real GPU, in one command, on a machine with no network:
#
#   bash bench/gpu_bundle.sh          # once, where there is a network: wheels into .gpu-wheels/ (git-ignored)
#   bash bench/gpu_check.sh           # on the GPU machine, from the repository root, .gpu-wheels/ beside it
#   H3GPU_DRY=cpu bash bench/gpu_check.sh   # the same steps on a CPU at toy sizes: the wiring, here
#
# Steps (each under `timeout`; the limits add up to 410 s, so it ends inside 7 minutes even if every
# step hangs): the bundled wheels into a temporary site folder (CORE ones always, the rest where the
# machine lacks them); the environment; what `auto` decides at start; the kernel table (time, peak
# memory, error at 8k-128k tokens and at lengths that are not multiples of 64); bench_pipeline.py's
# stage table; the placement matrix; one job per attention choice. Tables go to $OUT (default
# ./gpu-out): env.md, probe.md, kernels.md (+ kernels.jsonl), stages.md, placement.md, jobs.md,
# run.log (everything, tracebacks included).
. "$(dirname "${BASH_SOURCE[0]}")/gpu/setup.sh"

main() {
    echo "h3core GPU check: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+changes'); $(date -u); host ${HOSTNAME:-?}; dry run: ${H3GPU_DRY:-no}"
    rm -f "$OUT"/{env.md,probe.md,kernels.md,kernels.jsonl,stages.md,placement.md,jobs.md}
    mkdir -p "$H3GPU_WORK" && rm -rf "$H3GPU_WORK"/kernels-*.jsonl "$H3GPU_WORK"/attention-cache.json
    local T0
    T0=$(date +%s)
    step "1 wheels" 40 env.md bash -c install_wheels
    export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    if command -v nvidia-smi >/dev/null; then
        step "1a nvidia-smi" 10 env.md nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv
    fi
    step "1b environment" 20 env.md "$PY" "$ROOT/bench/gpu/env.py"
    step "2 what auto decides at start" 60 probe.md "$PY" "$ROOT/bench/gpu/probe.py"
    step "3 kernel table" 120 kernels.md env H3GPU_KERNELS_BUDGET=$(( 108 * SCALE )) "$PY" "$ROOT/bench/gpu/kernels.py"
    step "4 stage table" 45 stages.md "$PY" "$ROOT/bench/gpu/stages.py"
    step "5 placement matrix" 45 placement.md "$PY" "$ROOT/bench/gpu/placement.py"
    step "6 one job per attention choice" 70 jobs.md "$PY" "$ROOT/bench/gpu/jobs.py"
    echo
    echo "=================== summary: $(( $(date +%s) - T0 )) s in all ==================="
    printf '%s\n' "${SUMMARY[@]}"
    ls -la "$OUT"
}

main 2>&1 | tee "$OUT/run.log"
