"""A process whose store stays unusable exits non-zero naming why, its log in JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import clean_env, enqueue


@pytest.mark.parametrize(
    ("command", "who"),
    [
        (["worker", "--executor", "fake"], "worker stopped"),
        (["serve", "--role", "runner", "--executor", "fake"], "h3core runner stopped"),
        (["serve", "--executor", "fake", "--port", "0"], "h3core stopped"),  # HTTP and runner in one process
    ],
)
def test_a_process_whose_store_fails_exits_1_naming_why_in_json_log_lines(tmp_path, command, who):
    db = tmp_path / "h3.db"
    (job_id,) = enqueue(db, 1, steps=2)
    program = Path(__file__).with_name("failing_store_worker.py")
    done = subprocess.run(
        [
            sys.executable,
            str(program),
            *command,
            "--db",
            str(db),
            "--artifacts",
            str(tmp_path / "artifacts"),
            "--fake-step-seconds",
            "0",
            "--poll-interval",
            "0.05",
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**clean_env(), "H3_STORE_RETRY": "0.5", "COLUMNS": "400"},
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    said = " ".join(done.stderr.split())
    assert f"{who}, the store is unusable: the store failed every write for 0.5s" in said
    assert "disk I/O error" in said
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert records and all({"ts", "level", "logger", "message"} <= r.keys() for r in records)
    started = [r for r in records if r["logger"] == "h3core.runner" and r.get("event") == "running"]
    assert [(r["job_id"], r["attempt"], r["executor"], r["level"]) for r in started] == [(job_id, 1, "fake", "info")]
    assert any(r["logger"] == "h3core.store" and r["level"] == "warning" and r["operation"] == "write" for r in records)
    assert any(r["logger"] == "h3core.store" and r["level"] == "error" and "disk I/O error" in r["error"] for r in records)
    stuck = [r for r in records if r["logger"] == "h3core.runner" and r["level"] == "error"]
    assert [r["job_id"] for r in stuck] == [job_id], "the job its end could not be written for is named"
