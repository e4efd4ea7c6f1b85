"""The repository needs nothing outside it: no file points at design notes or data beside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"\.\./shared|field[- ]notes|\.\./comfyui-protocol", re.IGNORECASE)
TEXT = {".py", ".md", ".toml", ".sh", ".json", ".txt", ".yml", ".yaml"}


def test_no_file_refers_outside_the_repository():
    files = [ROOT / "README.md", *(p for d in ("h3core", "docs", "tests", "bench", "scripts") for p in (ROOT / d).rglob("*"))]
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        if p.is_file() and p.suffix in TEXT and p != Path(__file__).resolve()
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, f"references outside the repository (cite docs/design.md instead): {hits}"
