"""What the tests read from the README and the docs: its examples (the library one runs in this venv and
in a fresh core-only one; the OpenAI one against a server), its command table, the settings table."""

from __future__ import annotations

import json
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block(heading: str) -> str:
    """The first python block of README.md's section under `heading`."""
    match = re.search(r"```python\n(.*?)```", _section(README.read_text(encoding="utf-8"), heading), re.DOTALL)
    assert match is not None, f"README's {heading!r} has no python block"
    return match.group(1)


def library_example() -> str:
    """The first python block of README.md's `## As a library` section."""
    return _python_block("## As a library")


def subscription_example() -> str:
    """The second python block of README.md's `## As a library` section: a durable subscription."""
    blocks = re.findall(r"```python\n(.*?)```", _section(README.read_text(encoding="utf-8"), "## As a library"), re.DOTALL)
    assert len(blocks) >= 2, "README's '## As a library' has no subscription example"
    return blocks[1]


def openai_example() -> str:
    """The OpenAI SDK example of README.md's `## OpenAI-compatible Videos API` section."""
    return _python_block("## OpenAI-compatible Videos API")


def check_example_output(stdout: str) -> str:
    """The example's last line is `<job id> done <video path>`; the job's id."""
    job_id, status, path = stdout.strip().splitlines()[-1].split()
    assert status == "done", stdout
    assert path.startswith(f"{job_id}/attempt-1."), stdout
    return job_id


DOCS = README.parent / "docs"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    end = text.find(f"\n{level} ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _first_cells(section: str) -> list[str]:
    """The first cell of every row of the section's tables (header and rule rows left out)."""
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|--")]
    return [row.split("|")[1].strip() for row in rows]


def command_table() -> list[str]:
    """Every `h3core …` invocation in the first column of README.md's `## The command line` table."""
    cells = _first_cells(_section(README.read_text(encoding="utf-8"), "## The command line"))
    return [span for cell in cells for span in re.findall(r"`(h3core [^`]*)`", cell)]


def settings_table() -> dict[str, str | None]:
    """docs/operations.md's `## Configuration` table: each variable and the flag beside it (None: none)."""
    cells = _first_cells(_section((DOCS / "operations.md").read_text(encoding="utf-8"), "## Configuration"))
    out: dict[str, str | None] = {}
    for cell in cells:
        variable = re.fullmatch(r"`(H3_[A-Z0-9_]+)`(?: / `(--[a-z0-9-]+)`)?", cell)
        if variable is not None:
            out[variable.group(1)] = variable.group(2)
    return out


def quickstart_job() -> dict:
    """The job the README's Quickstart submits with curl (the one it says takes seconds on a CPU)."""
    match = re.search(r"-d '(\{.*?\})'", _section(README.read_text(encoding="utf-8"), "## Quickstart"), re.DOTALL)
    assert match is not None, "README's Quickstart has no curl -d body"
    return json.loads(match.group(1))
