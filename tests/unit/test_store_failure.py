"""The runner on a failing store: it retries, and where the store stays unusable it stops its
jobs and raises, rather than living on with jobs it cannot end."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence

import anyio
import pytest

from h3core import (
    Conflict,
    FakeExecutor,
    FakePlan,
    LocalArtifactStore,
    Runner,
    RunnerConfig,
    ShuttingDown,
    SQLiteEventStore,
    StoreUnavailable,
)
from h3core.domain.events import Event
from h3core.runtime.store_retry import retrying, transient
from tests.factories import request
from tests.unit.conftest import wait_until

pytestmark = pytest.mark.anyio


class FailingDisk(SQLiteEventStore):
    """The real store whose disk fails inside the write transaction, after the rows are written
    and before the commit, while `failing(events)` says so: what a rollback must undo."""

    def __init__(self, *args, failing: Callable[[Sequence[Event]], bool], times: float, **kw) -> None:
        super().__init__(*args, **kw)
        self.failing = failing
        self.left = times
        self.failures = 0

    def _store(self, conn, state, events) -> None:
        super()._store(conn, state, events)
        if self.left > 0 and self.failing(events):
            self.left -= 1
            self.failures += 1
            raise sqlite3.OperationalError("disk I/O error")


def is_type(name: str) -> Callable[[Sequence[Event]], bool]:
    return lambda events: any(e.type == name for e in events)


def make_runner(tmp_path, store, plan: FakePlan | None = None, **config) -> Runner:
    executor = FakeExecutor(LocalArtifactStore(tmp_path / "artifacts"), default=plan or FakePlan(step_seconds=0.0))
    cfg = {"stall_timeout_s": 5.0, "cancel_grace_s": 2.0, "poll_interval_s": 0.05, **config}
    return Runner(store, executor, RunnerConfig(**cfg))


@pytest.mark.parametrize("event", ["running", "progress", "done"])
async def test_a_write_that_fails_a_few_times_is_retried_and_lands_exactly_once(tmp_path, caplog, event):
    store = FailingDisk(tmp_path / "h3.db", durable=False, failing=is_type(event), times=3)
    runner = make_runner(tmp_path, store)
    caplog.set_level(logging.WARNING, logger="h3core.store")
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        job = await runner.submit(request(steps=3))
        await wait_until(lambda: store.get(job.job_id).terminal)
        tg.cancel_scope.cancel()
    assert store.failures == 3
    types = [e.type for e in store.events(job.job_id)]
    assert types == ["submitted", "admitted", "running", "progress", "progress", "progress", "done"]
    assert [e.seq for e in store.events(job.job_id)] == list(range(1, 8))
    assert store.get(job.job_id).status == "done"
    retries = [r for r in caplog.records if r.name == "h3core.store" and r.levelno == logging.WARNING]
    assert len(retries) == 3 and all(r.operation == "write" and "disk I/O error" in r.error for r in retries)


async def test_a_store_that_stays_unusable_stops_the_runner_and_its_jobs(tmp_path, caplog):
    # Every write from the second step on fails: the attempt is running, its progress cannot land.
    store = FailingDisk(
        tmp_path / "h3.db",
        durable=False,
        times=float("inf"),
        failing=lambda events: any(e.type == "progress" and e.body.step >= 2 for e in events),
    )
    runner = make_runner(tmp_path, store, FakePlan(step_seconds=0.02), store_retry_s=0.3)
    job = await runner.submit(request(steps=1000))  # before `run`: written directly, also through the retrying path
    with anyio.fail_after(20), pytest.raises(StoreUnavailable, match=r"failed every write for 0\.3s .*disk I/O error"):
        await runner.run()
    assert not runner.accepting
    with pytest.raises((ShuttingDown, StoreUnavailable)):
        await runner.submit(request())
    executor = runner.executor
    assert executor.runs == 1 and executor.cleanups == 1, "the attempt's work was stopped, not left running"
    # Nothing more could be written: the log ends where the store failed, for the next start to end.
    assert [e.type for e in store.events(job.job_id)][-2:] == ["running", "progress"]
    assert store.get(job.job_id).status == "running"
    gave_up = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any(r.name == "h3core.store" and r.operation == "write" for r in gave_up)
    assert any(r.name == "h3core.runner" and r.job_id == job.job_id for r in gave_up), "the job left running is named"


async def test_the_next_start_on_a_healthy_store_ends_what_the_lost_store_left(tmp_path):
    store = FailingDisk(tmp_path / "h3.db", durable=False, failing=is_type("done"), times=float("inf"))
    runner = make_runner(tmp_path, store, store_retry_s=0.2)
    job = await runner.submit(request(steps=2))
    with anyio.fail_after(20), pytest.raises(StoreUnavailable):
        await runner.run()
    store.close()
    healthy = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    again = make_runner(tmp_path, healthy)
    async with anyio.create_task_group() as tg:
        await tg.start(again.run)
        await wait_until(lambda: healthy.get(job.job_id).terminal)
        tg.cancel_scope.cancel()
    types = [e.type for e in healthy.events(job.job_id)]
    assert types.count("done") == 1 and types[-1] == "done" and "attempt_failed" in types  # interrupted, retried


async def test_a_failing_read_is_retried_too_and_then_raises(tmp_path):
    calls = 0

    def locked() -> None:
        nonlocal calls
        calls += 1
        raise sqlite3.OperationalError("database is locked")

    with anyio.fail_after(10), pytest.raises(StoreUnavailable, match="database is locked"):
        await retrying(locked, limit_s=0.2, what="read")
    assert calls >= 3


@pytest.mark.parametrize(
    "exc", [Conflict("moved on"), sqlite3.IntegrityError("UNIQUE"), sqlite3.ProgrammingError("closed"), ValueError("x")]
)
async def test_refusals_and_bugs_are_not_retried(exc):
    calls = 0

    def refuse() -> None:
        nonlocal calls
        calls += 1
        raise exc

    with pytest.raises(type(exc)):
        await retrying(refuse, limit_s=5, what="write")
    assert calls == 1 and not transient(exc)


def test_what_counts_as_a_transient_store_failure():
    assert transient(sqlite3.OperationalError("database is locked"))
    assert transient(sqlite3.OperationalError("disk I/O error"))
    assert transient(sqlite3.DatabaseError("database disk image is malformed"))
    assert not transient(OSError("no space left on device"))
