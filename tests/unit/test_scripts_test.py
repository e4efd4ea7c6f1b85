"""./scripts/test runs the Ray phase whatever the first phase did, and fails if either failed,
saying which: run as CI runs it, on a venv whose python and ruff are stubs that record each call."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A venv's python: records each `-m pytest` call and exits as the test asks for that phase.
PYTHON = """#!/bin/sh
calls="$(dirname "$0")/../calls"
if [ "$1" = "-m" ] && [ "$2" = "pytest" ]; then
    echo "pytest $*" >> "$calls"
    case "$*" in
        *"not ray"*) exit "${FIRST_EXIT:-0}" ;;
        *) exit "${RAY_EXIT:-0}" ;;
    esac
fi
if [ "$1" = "-m" ] && [ "$2" = "mypy" ]; then echo "mypy" >> "$calls"; fi
exit 0
"""


@pytest.fixture
def venv(tmp_path) -> Path:
    (tmp_path / "bin").mkdir()
    for name, text in (("python", PYTHON), ("ruff", "#!/bin/sh\nexit 0\n")):
        stub = tmp_path / "bin" / name
        stub.write_text(text)
        stub.chmod(0o755)
    return tmp_path


def run(venv: Path, first: int, ray: int) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("H3_")},
        "H3_VENV": str(venv),
        "H3_CHROMIUM": "/bin/true",  # an executable: the script installs no browser
        "H3_PG_BIN": "/bin",  # nor PostgreSQL
        "FIRST_EXIT": str(first),
        "RAY_EXIT": str(ray),
    }
    return subprocess.run(["bash", str(ROOT / "scripts" / "test")], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("first", "ray", "code"), [(0, 0, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1)])
def test_the_ray_phase_runs_whatever_the_first_did_and_either_failing_fails_the_run(venv, first, ray, code):
    done = run(venv, first, ray)
    calls = (venv / "calls").read_text().splitlines()
    assert calls[0] == "mypy", "the type check comes first"
    assert [c for c in calls if c.startswith("pytest")] == [
        "pytest -m pytest -m not ray --durations=15",
        "pytest -m pytest -m ray -n 0 --durations=10",
    ]
    assert done.returncode == code, done.stderr
    if code:
        assert f"all but Ray: exit {first}; the Ray tests: exit {ray}" in done.stderr
