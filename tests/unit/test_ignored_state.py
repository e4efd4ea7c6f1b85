"""What `serve` writes with its defaults lands beside the store, in the directory it starts in (a
clone's root for ./scripts/serve): every such file is git-ignored, the attention probe's cache
included, so a run never leaves the checkout dirty."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from h3core.adapters.lock import runner_lock_path
from h3core.runtime.admission import capabilities_path
from h3core.runtime.executor_factory import attention_cache_path, tiny_model_dir
from h3core.runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")


def written_by_default(monkeypatch) -> list[Path]:
    """The files and folders `serve` makes with no setting given, started in ROOT."""
    for name in [k for k in os.environ if k.startswith("H3_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(ROOT)
    s = Settings()
    db = s.db.resolve()
    return [
        db,
        Path(f"{db}-wal"),
        Path(f"{db}-shm"),
        runner_lock_path(db),
        capabilities_path(db),
        s.artifacts.resolve() / "0123abcd" / "attempt-1.mp4",
        s.uploads.resolve() / "0123abcd.png",
        tiny_model_dir(s) / "transformer" / "config.json",
        attention_cache_path(s),
    ]


def test_every_file_serve_writes_by_default_is_git_ignored(monkeypatch):
    paths = [str(p.relative_to(ROOT)) for p in written_by_default(monkeypatch)]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"], input="\n".join(paths), cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert sorted(set(paths) - set(ignored)) == [], "written by `serve` into a clone and not git-ignored"
    assert "h3-attention-cache.json" in paths
