"""/healthz is liveness: 200 while the process can do its job; once a task it needs fails after
start-up (its store tail, its runner, the metrics' follower), 503 saying why, and the process is
ended (`on_fatal`), never left serving 503 on every submit with a 200 liveness."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from litestar.testing import TestClient

from h3core.runtime.settings import Settings
from h3core.service import context
from h3core.service.app import create_app
from h3core.service.context import Service, build_service
from tests.unit.service.conftest import QUICK
from tests.waiting import poll

TOKEN = "token-number-one-0123"


class Breakable:
    """The tail's view of the store, whose reads of the log raise `fault` once it is set."""

    def __init__(self, store) -> None:
        self.store = store
        self.fault: Exception | None = None

    def cursor(self) -> int:
        return self.store.cursor()

    def events_after(self, cursor: int, limit: int = 1000):
        if self.fault is not None:
            raise self.fault
        return self.store.events_after(cursor, limit)


@contextmanager
def api_node(root: Path, monkeypatch, **settings) -> Iterator[tuple[TestClient, Service, Breakable, list[str]]]:
    """An API-role service (its store tail running) whose tail's reads can be broken, and the
    calls of its `on_fatal`."""
    monkeypatch.setattr(context, "FATAL_LINGER_S", 0.0)
    config = Settings(
        role="api", db=root / "h3.db", artifacts=root / "artifacts", uploads=root / "uploads", executor="fake", **settings
    )
    svc = build_service(config)
    assert svc.tail is not None
    tail_store = svc.tail.store = Breakable(svc.tail.store)  # type: ignore[assignment]
    ended: list[str] = []
    svc.on_fatal = lambda: ended.append("on_fatal")
    with TestClient(create_app(config, svc), base_url="http://127.0.0.1:8100", timeout=30) as client:
        yield client, svc, tail_store, ended


def test_a_tail_that_dies_of_a_bug_fails_liveness_and_ends_the_process(tmp_path, monkeypatch):
    with api_node(tmp_path, monkeypatch) as (client, svc, tail_store, ended):
        assert client.get("/healthz").json() == {"status": "ok", "reason": None}
        assert client.post("/v1/jobs", json=QUICK).status_code == 201
        tail_store.fault = ValueError("a bug in the tail")
        poll(lambda: ended, 30, "the process to be ended")
        r = client.get("/healthz")
        assert r.status_code == 503 and r.json() == {"status": "failing", "reason": "h3core is stopping: a bug in the tail"}
        assert client.get("/readyz").status_code == 503
        assert client.post("/v1/jobs", json=QUICK).status_code == 503
        assert isinstance(svc.fatal, ValueError) and svc.bus.closed


def test_a_store_failing_past_the_retry_limit_is_fatal_and_a_caller_without_a_token_is_not_told_why(tmp_path, monkeypatch):
    with api_node(tmp_path, monkeypatch, store_retry=0.2, api_tokens=[TOKEN]) as (client, svc, tail_store, ended):
        tail_store.fault = sqlite3.OperationalError("disk I/O error")  # transient: retried, for 0.2 s
        poll(lambda: ended, 30, "the process to be ended")
        assert client.get("/healthz").json() == {"status": "failing", "reason": None}
        told = client.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"}).json()["reason"]
        assert "the store failed every tail read for 0.2s" in told and "disk I/O error" in told
        assert client.get("/readyz", headers={"Authorization": f"Bearer {TOKEN}"}).json()["store"].startswith("unusable: ")


def test_a_needed_task_beside_the_runner_that_fails_is_fatal_too(tmp_path, monkeypatch):
    async def broken(self, bus) -> None:
        raise RuntimeError("the metrics' follower broke")

    monkeypatch.setattr("h3core.service.metrics.Metrics.follow", broken)
    with api_node(tmp_path, monkeypatch) as (client, svc, _, ended):
        poll(lambda: ended, 30, "the process to be ended")
        assert client.get("/healthz").status_code == 503
        assert not svc.submissions.accepting and str(svc.fatal) == "the metrics' follower broke"


def test_on_postgres_a_read_that_waits_on_the_server_does_not_hold_liveness_up(tmp_path, pg_url):
    """A point read of a PostgreSQL store waits on the network, and on a connection while the server
    restarts: on the event loop it held every request up, /healthz among them (8 s behind 4 clients
    polling a job during a restart)."""
    config = Settings(role="api", db=pg_url, artifacts=tmp_path / "artifacts", uploads=tmp_path / "uploads", executor="fake")
    svc = build_service(config)
    waiting, release = threading.Event(), threading.Event()
    real = svc.store.get

    def slow_get(job_id: str):
        if job_id == "slow":
            waiting.set()
            release.wait(60)  # the server is away
        return real(job_id)

    svc.store.get = slow_get  # type: ignore[method-assign]
    with TestClient(create_app(config, svc), base_url="http://127.0.0.1:8100", timeout=30) as client:
        reader = threading.Thread(target=lambda: client.get("/v1/jobs/slow"))
        reader.start()
        try:
            assert waiting.wait(30)
            assert client.get("/healthz").status_code == 200
            assert not release.is_set() and reader.is_alive(), "/healthz answered while the read still waited"
        finally:
            release.set()
            reader.join(30)
