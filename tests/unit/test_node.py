"""The composition root: what `build_node` makes of settings, and that nothing else wires a node."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import SecretStr

import h3core
from h3core import FakeExecutor, LocalAdmission
from h3core.runtime.node import build_node
from h3core.runtime.settings import Settings, default_node_id
from h3core.runtime.tail import StoreTail

PACKAGE = Path(h3core.__file__).parent


def settings(tmp_path: Path, **kw) -> Settings:
    return Settings(db=tmp_path / "h3.db", artifacts=tmp_path / "a", uploads=tmp_path / "u", executor="fake", **kw)


def test_a_node_that_runs_jobs_has_one_runner_whose_submissions_the_doors_use(tmp_path):
    node = build_node(settings(tmp_path))
    try:
        assert node.runner is not None and isinstance(node.executor, FakeExecutor)
        assert node.runner.executor is node.executor
        assert node.submissions is node.runner.submissions, "one write side for the runner and the doors"
        assert node.submissions.uploads is node.files.uploads
        assert node.runner.artifacts is node.files.artifacts
        assert isinstance(node.contract, LocalAdmission) and node.runner.admission is node.contract
        assert node.tail is None and node.bus is node.runner.bus, "alone on its SQLite file: its own events"
        assert node.webhooks is None and not node.submissions.webhooks.signing
    finally:
        node.store.close()


def test_an_api_node_has_submissions_no_runner_and_follows_the_store(tmp_path):
    node = build_node(settings(tmp_path, role="api"))
    try:
        assert node.runner is None and node.executor is None
        assert isinstance(node.tail, StoreTail) and node.tail.bus is node.bus
        # What it writes reaches its streams once, through the tail: the writer publishes elsewhere.
        assert node.submissions.bus is not node.bus
        assert node.submissions.admission is node.contract
    finally:
        node.store.close()


def test_a_secret_lets_submits_name_webhooks_and_starts_the_deliveries(tmp_path):
    secret = SecretStr("whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    node = build_node(settings(tmp_path, webhook_secret=secret, webhooks_allow=["127.0.0.0/8"]))
    try:
        assert node.submissions.webhooks.signing
        assert node.submissions.webhooks.allow.host("x") is False
        assert node.webhooks is not None
    finally:
        node.store.close()


def test_every_command_names_a_node_as_serve_does(monkeypatch):
    assert Settings(node="n1").node_id() == "n1"
    assert Settings().node_id() == default_node_id()
    monkeypatch.setattr("socket.gethostname", lambda: "box-7")
    assert Settings().node_id() == "box-7" == default_node_id()


def _calls(name: str) -> set[str]:
    """The package's modules that call `name(...)`."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for call in ast.walk(ast.parse(path.read_text())):
            if isinstance(call, ast.Call):
                f = call.func
                if isinstance(f, ast.Name) and f.id == name:  # the package imports what it builds by name
                    found.add(path.relative_to(PACKAGE).as_posix())
    return found


@pytest.mark.parametrize(
    ("name", "where"),
    [
        # Settings -> parts happens in the composition root; `Jobs` assembles the parts it is given.
        ("Runner", {"runtime/node.py", "runtime/jobs.py"}),
        ("make_executor", {"runtime/node.py"}),
        ("Submissions", {"runtime/runner.py", "runtime/node.py", "cli/worker.py"}),
    ],
)
def test_the_wiring_is_written_once(name, where):
    assert _calls(name) == where
