"""The README's library example, as the tests run it (in this venv, and in a fresh core-only one)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def library_example() -> str:
    """The first python block of README.md's `## As a library` section."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## As a library\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "README's '## As a library' has no python block"
    return match.group(1)


def check_example_output(stdout: str) -> str:
    """The example's last line is `<job id> done <video path>`; the job's id."""
    job_id, status, path = stdout.strip().splitlines()[-1].split()
    assert status == "done", stdout
    assert path.startswith(f"{job_id}/attempt-1."), stdout
    return job_id
