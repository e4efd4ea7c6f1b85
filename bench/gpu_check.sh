#!/usr/bin/env bash
# The pipeline on a real GPU, in one command, on a machine with no network:
#
#   bash bench/gpu_bundle.sh          # once, where there is a network: wheels into .gpu-wheels/ (git-ignored)
#   bash bench/gpu_check.sh           # on the GPU machine, from the repository root, .gpu-wheels/ beside it
#   H3GPU_DRY=cpu bash bench/gpu_check.sh   # the same steps on a CPU at toy sizes: the wiring, here
#
# Through the device tool: run(command="bash bench/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=420).
# The python: $PYTHON, else $ROOT/.venv/bin/python where it exists, else python3 (bench/gpu/setup.sh).
#
# Budget on one H200: every step runs under `timeout`; the limits add up to 300 s (0 interpreter 10,
# 1 wheels 25, 1a nvidia-smi 5, 1b environment 15, 2 auto at start 30, 3 kernel table 45, 4 stages 20,
# 5 placement 25, 6 jobs 25, 7 full size 100: a step more, for its checkpoint), so the check ends inside 5 minutes even if every step
# hangs, and a rerun after a fix fits the device's 15 minutes with its start-up. Step 7b (the quality levels
# at the released geometry) runs in what is left of those 300 s, at most 90 s, and step 7c (a long video's
# assembly at the released size: segment files, continuation frames, the join) in what is left then, at
# most 60 s. Step 8 (SageAttention 2 built with nvcc from a bundled source archive, then its kernels measured) runs only in what is left
# of those 300 s, or in H3GPU_SAGE_BUILD_S seconds when that is set (then the check takes longer).
#
# Steps 0, 1 and 1b stop the check where it cannot run (the bundle made for another python; no torch;
# no CUDA device): later steps would only fail the same way. Tables go to $OUT (default ./gpu-out):
# env.md, probe.md, kernels.md (+ kernels.jsonl), stages.md, placement.md, jobs.md, fullsize.md,
# quality.md, segments.md, sage.md, run.log (everything, tracebacks included).
. "$(dirname "${BASH_SOURCE[0]}")/gpu/setup.sh"

BUDGET_S=300

stop() {  # stop STEP WHY: no later step runs
    echo
    echo "=================== STOPPED after $1: $2; later steps not run ==================="
    SUMMARY+=("STOPPED after $1: $2")
    printf '%s\n' "${SUMMARY[@]}"
}

main() {
    echo "h3core GPU check: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+changes'); $(date -u); host ${HOSTNAME:-?}; dry run: ${H3GPU_DRY:-no}; python $PY"
    rm -f "$OUT"/{env.md,probe.md,kernels.md,kernels.jsonl,stages.md,placement.md,jobs.md,fullsize.md,quality.md,segments.md,sage.md}
    mkdir -p "$H3GPU_WORK" && rm -rf "$H3GPU_WORK"/kernels-*.jsonl "$H3GPU_WORK"/attention-cache.json
    local T0 rc
    T0=$(date +%s)
    step "0 interpreter against the bundle" 10 env.md bash -c check_python
    rc=$LAST_RC
    if [ "$rc" != 0 ]; then
        if [ -n "$H3GPU_DRY" ] && [ "$rc" = 3 ]; then
            echo "(dry run: the bundle is for another python; the venv's own packages are used)"
            export H3GPU_WHEELS=/nonexistent WHEELS=/nonexistent
        else
            stop "0 interpreter" "this python cannot use the bundle (rc $rc)"
            return 1
        fi
    fi
    step "1 wheels" 25 env.md bash -c install_wheels
    [ "$LAST_RC" = 0 ] || { stop "1 wheels" "the bundle did not install (rc $LAST_RC)"; return 1; }
    export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    if command -v nvidia-smi >/dev/null; then
        step "1a nvidia-smi" 5 env.md nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv
    fi
    step "1b environment" 15 env.md "$PY" -m bench.gpu.env
    [ "$LAST_RC" = 0 ] || { stop "1b environment" "no torch, no CUDA device, or an import every later step needs fails (env.md says which)"; return 1; }
    step "2 what auto decides at start" 30 probe.md "$PY" -m bench.gpu.probe
    step "3 kernel table" 45 kernels.md env H3GPU_KERNELS_BUDGET=$(( 40 * SCALE )) "$PY" -m bench.gpu.kernels
    step "4 stage table" 20 stages.md "$PY" -m bench.gpu.stages
    step "5 placement matrix" 25 placement.md "$PY" -m bench.gpu.placement
    step "6 one job per attention choice" 25 jobs.md "$PY" -m bench.gpu.jobs
    step "7 full size through the product" 100 fullsize.md "$PY" -m bench.gpu.fullsize
    # Quality levels at the released geometry (random weights: the speed, not the quality); dry: the tiny model.
    local quality_s=$(( (BUDGET_S * SCALE - ($(date +%s) - T0)) / SCALE ))
    quality_s=$(( quality_s > 90 ? 90 : quality_s ))
    if [ "$quality_s" -lt 30 ]; then
        SUMMARY+=("7b quality levels: skipped, ${quality_s} s left of the budget")
    elif [ -n "$H3GPU_DRY" ]; then
        step "7b quality levels" "$quality_s" quality.md "$PY" -m bench.throughput.quality --attention flash --size 64x64 --frames 22 --steps 4 --layers 2
    else
        step "7b quality levels" "$quality_s" quality.md "$PY" -m bench.throughput.quality --released --device cuda \
            --dtype bfloat16 --size 768x1344 --frames 22 --steps 6
    fi
    # A long video's assembly at the released size (segment files, continuation frames, the join):
    # what segments cost beyond the model's calls, on this box's CPU; dry: a toy size.
    local assembly_s=$(( (BUDGET_S * SCALE - ($(date +%s) - T0)) / SCALE ))
    assembly_s=$(( assembly_s > 60 ? 60 : assembly_s ))
    if [ "$assembly_s" -lt 20 ]; then
        SUMMARY+=("7c long video assembly: skipped, ${assembly_s} s left of the budget")
    elif [ -n "$H3GPU_DRY" ]; then
        step "7c long video assembly" "$assembly_s" segments.md "$PY" -m bench.throughput.segments --assembly --size 128x64 --seconds 3 --window 1
    else
        step "7c long video assembly" "$assembly_s" segments.md "$PY" -m bench.throughput.segments --assembly --size 1344x768 --seconds 15 --window 5
    fi
    local left=$(( BUDGET_S * SCALE - ($(date +%s) - T0) ))
    local build_s=${H3GPU_SAGE_BUILD_S:-$left}
    step "8a SageAttention 2 from source" $(( build_s > 0 ? (build_s + SCALE - 1) / SCALE : 1 )) sage.md \
        env H3GPU_SAGE_BUILD_S="$build_s" bash "$ROOT/bench/gpu/sage_build.sh"
    if [ "$LAST_RC" = 0 ] && [ -f "$H3GPU_WORK/sage-built" ]; then
        step "8b sage-fp16 / sage-fp8 kernels" 60 sage.md env H3GPU_KERNELS_ONLY=sage-fp16,sage-fp8 \
            H3GPU_KERNELS_BUDGET=$(( 55 * SCALE )) "$PY" -m bench.gpu.kernels
    fi
    echo
    echo "=================== summary: $(( $(date +%s) - T0 )) s in all ==================="
    printf '%s\n' "${SUMMARY[@]}"
    ls -la "$OUT"
}

main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
