# Sourced by the scripts: make $ROOT/.venv (once) with the project and the extras in $EXTRAS.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "h3core needs Python >= 3.11" >&2; exit 1; }
VENV=${H3_VENV:-$ROOT/.venv}
EXTRAS=${EXTRAS:-}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
stamp="$VENV/.h3core-installed${EXTRAS:+-$EXTRAS}"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # The pipeline extra's torch: the CPU wheel unless one is installed (H3_TORCH picks another,
    # e.g. a CUDA build); a bare `torch` requirement would pull a multi-GB CUDA build.
    if [[ ",$EXTRAS," == *",pipeline,"* || ",$EXTRAS," == *",distributed,"* ]] && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        "$VENV/bin/python" -m pip install -q "${H3_TORCH:-torch==2.13.0}"
    fi
    "$VENV/bin/python" -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
    touch "$stamp"
fi
