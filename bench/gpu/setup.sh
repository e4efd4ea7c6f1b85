# Sourced by the GPU scripts (bench/gpu_check.sh, bench/gpu/capacity_probe.sh): the environment of a machine with no
# network, the interpreter's check against the bundle (`check_python`), the bundled wheels'
# installer (`install_wheels`, into a temporary site folder) and `step NAME LIMIT_S OUTFILE CMD...`,
# which runs CMD under `timeout` into $OUT.
#
# The python: $PYTHON when set; else the project's virtualenv, $ROOT/.venv/bin/python, when there is
# one (a dry run here); else python3 (the GPU image's).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then
    PY=$ROOT/.venv/bin/python
else
    PY=python3
fi
WHEELS=${H3GPU_WHEELS:-$ROOT/.gpu-wheels}
export H3GPU_WORK=${H3GPU_WORK:-${TMPDIR:-/tmp}/h3gpu}
SITE=${H3GPU_SITE:-$H3GPU_WORK/site}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$H3GPU_WORK/triton-cache}  # not $HOME: it may not be writable
export HF_HOME=${HF_HOME:-$H3GPU_WORK/hf}
export OUT H3GPU_DRY=${H3GPU_DRY:-}
SCALE=1
[ -n "$H3GPU_DRY" ] && SCALE=${H3GPU_DRY_SCALE:-4}  # a shared CPU is slower than an H200; the limits hold there too
SUMMARY=()

ms() { echo $(( $(date +%s%N) / 1000000 )); }

# step NAME LIMIT_S OUTFILE CMD...: CMD under timeout; stdout to the console and OUTFILE, stderr to the console;
# its exit status in LAST_RC.
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
    LAST_RC=$rc
}

# This python against the bundle's manifest, before anything else: 0 matches (or no bundle), 3 a mismatch
# (the message names both), anything else: no usable python at all.
check_python() {
    if ! command -v "$PY" >/dev/null 2>&1; then
        echo "STOP: no python at '$PY' (set PYTHON, or make $ROOT/.venv)"
        return 4
    fi
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "python: $(command -v "$PY") ($("$PY" -V 2>&1)); no wheels in $WHEELS (bash bench/gpu_bundle.sh makes them): the machine's packages"
        return 0
    fi
    PYTHONPATH= "$PY" "$ROOT/bench/gpu/wheels.py" check "$WHEELS"
}

install_wheels() {
    echo "python: $(command -v "$PY") ($("$PY" -V 2>&1)); wheels: $WHEELS -> $SITE"
    rm -rf "$SITE" && mkdir -p "$SITE" || return 1
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "no wheels in $WHEELS (bash bench/gpu_bundle.sh makes them): using what the machine has"
        return 0
    fi
    PYTHONPATH= "$PY" "$ROOT/bench/gpu/wheels.py" select "$WHEELS" "$H3GPU_WORK/wheels.txt" || return 1
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
export -f install_wheels check_python
export PY WHEELS SITE ROOT

