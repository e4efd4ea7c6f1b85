"""The layers hold in the import graph, not only in folder names.

import-linter checks the contracts in pyproject.toml (`[tool.importlinter]`) over every import of
the package, function-level ones included: domain <- adapters <- executors <- runtime <- service,
cli; the executor contract below its implementations; no I/O library in the domain. The planted
tests copy the package, add one forbidden import and expect the check to fail naming it, so the
check itself is shown able to fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layers_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.fixture
def copy(tmp_path) -> Path:
    shutil.copytree(ROOT / "h3core", tmp_path / "h3core", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def plant(root: Path, module: str, line: str) -> None:
    path = root / "h3core" / module
    path.write_text(path.read_text() + f"\n{line}\n")


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("domain/state.py", "from h3core.adapters.store import sqlite", "domain <- adapters"),
        ("cli/worker.py", "from h3core.service import app", "domain <- adapters"),
        ("executors/base.py", "from h3core.executors.pipeline import executor", "the executor contract"),
        ("domain/request.py", "import anyio", "the domain does no I/O"),
    ],
    ids=["domain-imports-an-adapter", "cli-core-imports-the-service", "contract-imports-an-executor", "domain-does-io"],
)
def test_a_planted_import_breaks_a_contract(copy, module, line, broken):
    result = lint(copy)
    assert result.returncode == 0, "the copy holds before the plant\n" + result.stdout
    plant(copy, module, line)
    result = lint(copy)
    assert result.returncode != 0, f"planting {line!r} in {module} broke nothing\n{result.stdout}"
    verdict = re.search(re.escape(broken) + r".*?\b(KEPT|BROKEN)\b", " ".join(result.stdout.split()))
    assert verdict is not None and verdict.group(1) == "BROKEN", result.stdout
