"""The live stream's generator (`follow`): it ends cleanly when the client goes away or the
service stops, and it never yields inside a cancel scope (closing it from another task, as a
server does when a client disconnects, would otherwise fail to exit the scope)."""

from __future__ import annotations

import sqlite3

import anyio
import pytest

from h3core.adapters.store.memory import MemoryEventStore
from h3core.domain.events import Admitted, Done, Progress, Running
from h3core.runtime.bus import EventBus
from h3core.runtime.follow import follow
from tests.factories import artifact, submitted

pytestmark = pytest.mark.anyio


def _store_with_running_job() -> MemoryEventStore:
    store = MemoryEventStore()
    store.append("j", [submitted(), Admitted(), Running(attempt=1, executor="x")])
    return store


def _follow(store, bus, after=0, resync_s=60.0):
    return follow(bus, store.events, "j", after, stopping=lambda: False, resync_s=resync_s)


async def test_a_client_that_disconnects_ends_the_stream_from_another_task():
    store, bus = _store_with_running_job(), EventBus()
    stream = _follow(store, bus, after=3)
    got = anyio.Event()
    seen = []

    async def consume():
        async for e in stream:
            seen.append(e)
            got.set()
            await anyio.sleep_forever()  # the client stops reading, with the generator at a yield

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        assert bus.subscribers == 1
        state, events = store.append("j", [Progress(step=1, total=4)])
        bus.publish(events)  # a live event: the generator is now suspended right after receiving it
        await got.wait()
        tg.cancel_scope.cancel()
    await stream.aclose()  # from this task, not the one that iterated: what a server's disconnect does
    assert [e.seq for e in seen] == [4]
    assert bus.subscribers == 0


async def test_the_stream_ends_when_the_service_stops():
    store, bus = _store_with_running_job(), EventBus()
    seen = []
    async with anyio.create_task_group() as tg:

        async def consume():
            seen.extend([e async for e in _follow(store, bus)])

        tg.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        assert [e.seq for e in seen] == []  # the history is yielded as it is read; the list fills at the end
        bus.close()  # the service stops: the live wait ends, and so does the stream
    assert [e.seq for e in seen] == [1, 2, 3]
    assert bus.subscribers == 0


async def test_events_stored_elsewhere_arrive_on_resync_after_a_keep_alive():
    store, bus = _store_with_running_job(), EventBus()
    stream = _follow(store, bus, after=3, resync_s=0)  # every wait times out at once
    try:
        assert await stream.__anext__() is None  # nothing new: a keep-alive
        store.append("j", [Progress(step=1, total=4)])  # stored by another process: never published here
        assert (await stream.__anext__()).seq == 4  # then the store's event
    finally:
        await stream.aclose()
    assert bus.subscribers == 0


async def test_a_read_that_fails_transiently_is_read_again_after_a_keep_alive_and_a_bug_is_not():
    store, bus = _store_with_running_job(), EventBus()
    store.append("j", [Done(artifact=artifact())])
    failures = [sqlite3.OperationalError("disk I/O error"), sqlite3.OperationalError("database is locked")]

    def flaky(job_id: str, after: int) -> list:
        if failures:
            raise failures.pop(0)
        return store.events(job_id, after)

    with anyio.fail_after(30):
        seen = [e async for e in follow(bus, flaky, "j", 2, resync_s=60.0)]
    assert seen[:2] == [None, None], "a keep-alive before each pause"
    assert [e.seq for e in seen[2:]] == [3, 4] and seen[-1].terminal

    def broken(job_id: str, after: int) -> list:
        raise ValueError("a bug")

    with anyio.fail_after(30), pytest.raises(ValueError, match="a bug"):
        [e async for e in follow(bus, broken, "j", 2, resync_s=60.0)]

    def away(job_id: str, after: int) -> list:
        raise sqlite3.OperationalError("disk I/O error")

    bus.close()  # the process stops (the store lost for good): a reader still failing ends with it
    with anyio.fail_after(30):
        assert [e async for e in follow(bus, away, "j", 2, resync_s=60.0)] == []
