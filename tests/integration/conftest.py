"""Real worker processes (`python -m h3core.cli worker`) and a deadline-bounded poll."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from typer.testing import CliRunner

from h3core.cli import app
from tests.waiting import poll

T = TypeVar("T")


def clean_env() -> dict[str, str]:
    """The environment without H3_* settings a developer may have exported."""
    return {k: v for k, v in os.environ.items() if not k.startswith("H3_")}


class Worker:
    """One `h3core worker` process; its stdout and stderr go to a log file."""

    def __init__(
        self,
        db: Path,
        artifacts: Path,
        args: tuple[str, ...],
        log: Path,
        program: tuple[str, ...] = ("-m", "h3core.cli"),
        env: dict[str, str] | None = None,
    ) -> None:
        self.log_path = log
        cmd = [
            sys.executable,
            *program,
            "worker",
            "--db",
            str(db),
            "--artifacts",
            str(artifacts),
            "--poll-interval",
            "0.1",
            "--verbose",
            *(() if "--executor" in args else ("--executor", "fake")),
            *args,
        ]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env={**clean_env(), **(env or {})}, cwd=db.parent
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        poll(lambda: self.proc.poll() is not None, timeout, f"worker {self.pid} to exit", self.log)
        return self.proc.returncode

    def wait_ready(self, timeout: float = 30) -> None:
        poll(
            lambda: "worker: ready" in self.log() or self.proc.poll() is not None,
            timeout,
            "the worker to be ready",
            self.log,
        )
        assert self.proc.poll() is None, f"worker exited with {self.proc.returncode}\n{self.log()}"


class Workers:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Worker] = []

    def start(self, db: Path, artifacts: Path, *args: str, env: dict[str, str] | None = None) -> Worker:
        """A worker on `db`; `env`: H3_* settings besides the flags."""
        worker = Worker(db, artifacts, args, self.tmp_path / f"worker-{len(self.started) + 1}.log", env=env)
        self.started.append(worker)
        return worker

    def start_crashing(self, at: str, db: Path, artifacts: Path, *args: str) -> Worker:
        """A worker that SIGKILLs itself at `at` of the artifact write path (crashing_worker.py)."""
        program = (str(Path(__file__).with_name("crashing_worker.py")), at)
        worker = Worker(db, artifacts, args, self.tmp_path / f"worker-{len(self.started) + 1}.log", program)
        self.started.append(worker)
        return worker

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGKILL)
                worker.proc.wait(10)


@pytest.fixture
def workers(tmp_path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    try:
        yield w
    finally:
        w.kill_all()


def cli(*args: object, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], env={k: None for k in os.environ if k.startswith("H3_")}, **kw)


def enqueue(db: Path, count: int, *, steps: int, max_attempts: int = 2, prompt: str = "job") -> list[str]:
    """Store `count` small jobs through `h3core enqueue`; their ids in submission order."""
    ids = []
    for i in range(count):
        result = cli(
            "enqueue",
            "--db",
            db,
            "--prompt",
            f"{prompt} {i}",
            "--steps",
            steps,
            "--frames",
            12,
            "--width",
            64,
            "--height",
            64,
            "--max-attempts",
            max_attempts,
        )
        assert result.exit_code == 0, result.output
        ids.append(result.stdout.strip())
    return ids
