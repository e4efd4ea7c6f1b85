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
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
WHEELS=${H3GPU_WHEELS:-$ROOT/.gpu-wheels}
export H3GPU_WORK=${H3GPU_WORK:-${TMPDIR:-/tmp}/h3gpu}
SITE=${H3GPU_SITE:-$H3GPU_WORK/site}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$H3GPU_WORK/triton-cache}  # not $HOME: it may not be writable
export HF_HOME=${HF_HOME:-$H3GPU_WORK/hf}
export OUT H3GPU_DRY=${H3GPU_DRY:-}
SCALE=1
[ -n "$H3GPU_DRY" ] && SCALE=${H3GPU_DRY_SCALE:-3}  # a shared CPU is slower than an H200; the limits hold there too
SUMMARY=()

ms() { echo $(( $(date +%s%N) / 1000000 )); }

# step NAME LIMIT_S OUTFILE CMD...: CMD under timeout; stdout to the console and OUTFILE, stderr to the console.
step() {
    local name=$1 limit=$(( $2 * SCALE )) file=$3 t0 rc took flag=""
    shift 3
    t0=$(ms)
    echo
    echo "=================== $name (limit ${limit} s) $(date -u +%H:%M:%S) ==================="
    timeout -k 5 "$limit" "$@" | tee -a "$OUT/$file"
    rc=${PIPESTATUS[0]}
    took=$(( $(ms) - t0 ))
    { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && flag=" (TIMED OUT)"
    echo "=== $name: rc $rc in $((took / 1000)).$(( (took % 1000) / 100 )) s$flag" | tee -a "$OUT/$file"
    SUMMARY+=("$name: rc $rc, $((took / 1000)) s$flag")
}

install_wheels() {
    echo "python: $(command -v "$PY") ($("$PY" -V 2>&1)); wheels: $WHEELS -> $SITE"
    rm -rf "$SITE" && mkdir -p "$SITE" || return 1
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "no wheels in $WHEELS (bash bench/gpu_bundle.sh makes them): using what the machine has"
        return 0
    fi
    PYTHONPATH= "$PY" "$ROOT/bench/gpu/wheels.py" "$WHEELS" "$H3GPU_WORK/wheels.txt" || return 1
    mapfile -t wheels < "$H3GPU_WORK/wheels.txt"
    [ ${#wheels[@]} -eq 0 ] && return 0
    if "$PY" -m pip --version >/dev/null 2>&1; then
        local pipi=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE")
        if ! "${pipi[@]}" "${wheels[@]}"; then  # one bad wheel must not keep the others out
            echo "pip refused the batch; one wheel at a time"
            for w in "${wheels[@]}"; do "${pipi[@]}" "$w" || echo "NOT INSTALLED: $(basename "$w")"; done
        fi
    else  # no pip: these wheels have no .data folders, so unpacking them is installing them
        for w in "${wheels[@]}"; do "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$SITE" || return 1; done
    fi
    echo "installed into $SITE: $(ls -d "$SITE"/*.dist-info 2>/dev/null | wc -l) distributions, $(du -sh "$SITE" | cut -f1)"
}
export -f install_wheels
export PY WHEELS SITE ROOT

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
