"""/readyz under load: its looks at the disk are reused for `ready_cache` seconds, one at a time,
and a store that has just committed is not asked for its write lock again; what lives in memory
(the runner accepting) is read on every request."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from h3core.runtime.settings import Settings
from h3core.service.context import Service, build_service
from h3core.service.readiness import Recent
from h3core.service.routes.ops import readiness
from tests.factories import request
from tests.waiting import until

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_result_is_reused_for_max_age_and_one_check_runs_at_a_time():
    clock, calls, gate = Clock(), [], anyio.Event()

    async def check() -> int:
        calls.append(clock.now)
        await gate.wait()
        return len(calls)

    recent = Recent(check, max_age=1.0, clock=clock)
    got: list[int] = []

    async def probe() -> None:
        got.append(await recent.get())

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(probe)  # five probes at once, the check still running
        await until(lambda: len(calls) == 1, what="the first probe's check to start")
        gate.set()
    assert calls == [100.0] and got == [1] * 5, "one check for five probes"
    assert await recent.get() == 1, "reused while younger than max_age"
    clock.now += 0.99
    assert await recent.get() == 1 and len(calls) == 1
    clock.now += 0.01
    assert await recent.get() == 2, "looked again once max_age had passed"

    every = Recent(check, max_age=0, clock=clock)
    assert [await every.get() for _ in range(3)] == [3, 4, 5], "max_age 0: a check per call"


@asynccontextmanager
async def serving(tmp_path, **settings) -> AsyncIterator[Service]:
    """The service's parts as `serve` builds them (fake executor), its runner running."""
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
            yield svc
            tg.cancel_scope.cancel()
    finally:
        svc.store.close()


async def test_readyz_answers_while_writers_hold_the_store_and_says_it_is_writable(tmp_path):
    """The load finding: each probe took the store's write lock, waiting behind every commit (p99
    1.24 s under 8 submitters and 32 readers). A commit within `ready_cache` is proof enough."""
    async with serving(tmp_path, ready_cache=60) as svc:
        job = await svc.runner.submit(request(steps=1))  # a commit: the store was writable just now
        await until(lambda: svc.store.get(job.job_id).terminal, what="the job to end")
        held, release = threading.Event(), threading.Event()

        def writer() -> None:  # a writer that holds the write lock, as a long commit does
            with svc.store._write():
                held.set()
                release.wait()

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            held.wait()
            with anyio.fail_after(30):  # the old path waited here until `release`
                answer = await readiness(svc)
        finally:
            release.set()
            thread.join()
    assert answer.status_code == 200, answer.content
    assert answer.content.store == "ok" and answer.content.status == "ready"


async def test_a_stopped_runner_is_not_ready_at_once_whatever_the_cache_and_0_looks_every_time(tmp_path):
    async with serving(tmp_path, ready_cache=60) as svc:
        assert (await readiness(svc)).status_code == 200
        svc.begin_shutdown()
        await until(lambda: not svc.runner.accepting, what="the runner to stop")
        answer = await readiness(svc)  # the store's answer is still fresh: the runner's is not cached
        assert answer.status_code == 503 and answer.content.runner == "not accepting", answer.content

    async with serving(tmp_path, ready_cache=0) as svc:
        pings = []
        real = svc.store.ping
        svc.store.ping = lambda: pings.append(1) or real()  # type: ignore[method-assign]
        for _ in range(3):
            assert (await readiness(svc)).status_code == 200
        assert len(pings) == 3, "ready_cache 0: the write lock on every request, as before"

        def broken() -> None:
            raise sqlite3.OperationalError("disk I/O error")

        svc.store.ping = broken  # type: ignore[method-assign]
        answer = await readiness(svc)
        assert answer.status_code == 503 and answer.content.store == "not writable: disk I/O error"
