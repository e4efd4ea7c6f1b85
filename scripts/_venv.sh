# Sourced by the scripts: make $ROOT/.venv (once) with the project and the extras in $EXTRAS.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "h3core needs Python >= 3.11" >&2; exit 1; }
VENV=${H3_VENV:-$ROOT/.venv}
EXTRAS=${EXTRAS:-}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
# One stamp per extra, for each extra the request brings (`test` brings `service`, which brings
# `client`): the scripts share one venv with different extras, and what one installed the other
# does not install again. A stamp older than pyproject.toml counts as missing.
extras_closure() {
    "$PY" - "$ROOT/pyproject.toml" "$EXTRAS" <<'PYTHON'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    declared = tomllib.load(f)["project"]["optional-dependencies"]
todo, seen = [e.strip() for e in sys.argv[2].split(",") if e.strip()], set()
while todo:
    extra = todo.pop()
    if extra in seen:
        continue
    if extra not in declared:
        sys.exit(f"no extra {extra!r} in pyproject.toml (known: {', '.join(declared)})")
    seen.add(extra)
    for requirement in declared[extra]:
        if match := re.match(r"h3core\[([^\]]*)\]", requirement):
            todo += [e.strip() for e in match.group(1).split(",")]
print(" ".join(sorted(seen)))
PYTHON
}
closure=$(extras_closure) || exit 1
stamps=("$VENV/.h3core-installed")
for extra in $closure; do
    stamps+=("$VENV/.h3core-installed-extra-$extra")
done
stale=0
for stamp in "${stamps[@]}"; do
    if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        stale=1
    fi
done
if [ "$stale" = 1 ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # The pipeline extra's torch: the CPU wheel unless one is installed (H3_TORCH picks another,
    # e.g. a CUDA build); a bare `torch` requirement would pull a multi-GB CUDA build.
    if [[ " $closure " == *" pipeline "* ]] && ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        "$VENV/bin/python" -m pip install -q "${H3_TORCH:-torch==2.13.0}"
    fi
    # pip (24.1+) shows its build backend's warnings even with -q: setuptools' "Editable installation"
    # banner on every set-up. That one warning is ignored; errors and other warnings still show.
    PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
        "$VENV/bin/python" -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
    touch "${stamps[@]}"
fi
# The checkout's own modules compiled once (0.8 s, then only what changed): the editable install
# has no bytecode of them, and where PYTHONDONTWRITEBYTECODE is set (as on these machines) every
# Python process compiled them again (0.13 s of CPU of each `h3core serve` start's 1.4).
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/h3core" >/dev/null
