"""/readyz answers from memory: a background task looks at the store (and the runner process or
nodes) every `ready_cache` seconds; a look that fails says why at once, one that hangs turns the
answer to not ready once `ready_stale` has passed; what lives in memory (the runner accepting) is
read on every request."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from h3core.runtime.settings import Settings
from h3core.service.context import Service, build_service
from h3core.service.readiness import Readiness
from h3core.service.routes.ops import readiness
from tests.factories import request
from tests.waiting import until

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Store:
    """A store whose `ping` can be held (a write lock another process keeps) or broken."""

    def __init__(self) -> None:
        self.pings = 0
        self.gate = threading.Event()
        self.gate.set()
        self.broken: Exception | None = None

    def ping(self) -> None:
        self.gate.wait(60)
        self.pings += 1
        if self.broken is not None:
            raise self.broken


async def test_a_look_that_fails_says_why_and_one_that_hangs_is_not_ready_past_the_stale_bound():
    clock, store = Clock(), Store()
    ready = Readiness(store, None, interval_s=0.01, stale_s=2.0, clock=clock)  # type: ignore[arg-type]
    assert ready.now().store.startswith("not checked yet"), "before the first look: not ready"
    async with anyio.create_task_group() as tg:
        await tg.start(ready.run)  # started once the first look is back
        assert ready.now().store == "ok"
        store.broken = sqlite3.OperationalError("disk I/O error")
        await until(lambda: ready.now().store == "not writable: disk I/O error", what="a look to find the store failing")
        store.broken = None
        await until(lambda: ready.now().store == "ok", what="a look to find it writable again")
        store.gate.clear()  # the next look hangs in the store
        clock.now += 1.9
        assert ready.now().store == "ok", "within the bound the last look stands"
        clock.now += 0.2
        assert ready.now().store == "not checked for 2.1 s: the last look at the store has not come back (bound 2 s)"
        store.gate.set()
        await until(lambda: ready.now().store == "ok", what="the look to come back")
        tg.cancel_scope.cancel()


@asynccontextmanager
async def serving(tmp_path, **settings) -> AsyncIterator[Service]:
    """The service's parts as `serve` builds them (fake executor), its runner and readiness running."""
    svc = build_service(
        Settings(
            executor="fake",
            fake_step_seconds=0,
            db=tmp_path / "h3.db",
            artifacts=tmp_path / "artifacts",
            uploads=tmp_path / "uploads",
            **settings,
        )
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(svc.run_runner)
            await tg.start(svc.readiness.run)
            yield svc
            tg.cancel_scope.cancel()
    finally:
        svc.store.close()


async def test_readyz_answers_from_memory_while_a_writer_holds_the_store(tmp_path):
    """The load finding: a probe that took the store's write lock waited behind every commit (p99
    730 ms with 8 processes writing the store). The handler asks the store nothing."""
    async with serving(tmp_path, ready_cache=0.05, ready_stale=60) as svc:
        job = await svc.runner.submit(request(steps=1))
        await until(lambda: svc.store.get(job.job_id).terminal, what="the job to end")
        held, release = threading.Event(), threading.Event()

        def writer() -> None:  # a writer that holds the write lock, as a long commit does
            with svc.store._write():
                held.set()
                release.wait()

        pings = []
        real = svc.store.ping
        svc.store.ping = lambda: pings.append(1) or real()  # type: ignore[method-assign]
        thread = threading.Thread(target=writer)
        thread.start()
        try:
            held.wait()
            with anyio.fail_after(30):  # a probe that looked at the store waited here until `release`
                answers = [await readiness(svc) for _ in range(20)]
            await until(lambda: pings, what="the background look to try the store")  # held behind the writer
            assert (await readiness(svc)).status_code == 200
        finally:
            release.set()
            thread.join()
    assert {a.status_code for a in answers} == {200}
    assert answers[-1].content.store == "ok" and answers[-1].content.status == "ready"


async def test_a_stopped_runner_is_not_ready_at_once(tmp_path):
    async with serving(tmp_path, ready_cache=30, ready_stale=60) as svc:  # no second look in the test
        assert (await readiness(svc)).status_code == 200
        svc.begin_shutdown()
        await until(lambda: not svc.runner.accepting, what="the runner to stop")
        answer = await readiness(svc)  # the store's look is still fresh: the runner's state is memory
        assert answer.status_code == 503 and answer.content.runner == "not accepting", answer.content


def test_the_stale_bound_must_exceed_the_interval():
    with pytest.raises(ValueError, match="ready_stale"):
        Settings(ready_cache=2, ready_stale=1)
