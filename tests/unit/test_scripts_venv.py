"""./scripts/serve and ./scripts/test share one venv with different extras: once one has set it
up, the other installs only the extras it lacks, and running them in turn installs nothing more.
scripts/_venv.sh is run as the scripts run it, on a venv whose python is a stub that records pip."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUB = """#!/bin/sh
# A venv's python: records every pip call; `-c` (is torch there?) says yes.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$*" >> "$(dirname "$0")/../pip-calls"; fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ] && [ "$4" = "-q" ] && [ "$5" = "-e" ]; then
    echo "${PYTHONWARNINGS:-}" >> "$(dirname "$0")/../editable-warnings"
fi
exit 0
"""


def extras_of(script: str) -> str:
    """The EXTRAS a script sets before it sources _venv.sh."""
    match = re.search(r"^EXTRAS=(\S+)$", (ROOT / "scripts" / script).read_text(), re.MULTILINE)
    assert match is not None, script
    return match.group(1)


@pytest.fixture
def venv(tmp_path) -> Path:
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"
    python.write_text(STUB)
    python.chmod(0o755)
    return tmp_path


def set_up(venv: Path, script: str) -> list[str]:
    """Source _venv.sh with the script's extras; the pip calls it made."""
    calls = venv / "pip-calls"
    before = calls.read_text().splitlines() if calls.exists() else []
    env = {**os.environ, "H3_VENV": str(venv), "PYTHON": sys.executable, "EXTRAS": extras_of(script)}
    run = subprocess.run(
        ["bash", "-c", "set -euo pipefail; . scripts/_venv.sh"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    after = calls.read_text().splitlines() if calls.exists() else []
    return after[len(before) :]


def test_serve_after_test_installs_nothing_and_the_other_way_only_what_is_missing(venv, tmp_path):
    assert set_up(venv, "test"), "a fresh venv is set up"
    assert set_up(venv, "serve") == [], "test's extras include serve's: nothing to install"
    assert set_up(venv, "test") == []

    other = tmp_path / "other"
    other.mkdir()
    (other / "bin").mkdir()
    (other / "bin" / "python").write_text(STUB)
    (other / "bin" / "python").chmod(0o755)
    assert set_up(other, "serve"), "a fresh venv is set up"
    installed = set_up(other, "test")
    assert any("[test,pipeline,distributed]" in call for call in installed), "test's own extras are missing: installed"
    assert set_up(other, "serve") == [] and set_up(other, "test") == [], "then neither installs again"


def test_an_extra_that_is_not_declared_is_named(venv):
    env = {**os.environ, "H3_VENV": str(venv), "PYTHON": sys.executable, "EXTRAS": "service,nope"}
    run = subprocess.run(["bash", "-c", ". scripts/_venv.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "no extra 'nope' in pyproject.toml" in run.stderr
    assert not (venv / "pip-calls").exists()


def test_the_editable_install_ignores_setuptools_banner_only(venv):
    """pip shows the build backend's warnings even with -q; the set-up ignores the one that says
    "Editable installation" (a banner on every first set-up), not warnings in general."""
    assert set_up(venv, "serve")
    filters = (venv / "editable-warnings").read_text().splitlines()
    assert filters == ["ignore:Editable installation:UserWarning"]
