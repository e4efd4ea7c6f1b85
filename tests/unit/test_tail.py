"""The store tail: what another process stores reaches this process's bus, in order, once."""

from __future__ import annotations

import sqlite3

import anyio
import pytest

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import Admitted, Progress, Running
from h3core.runtime.bus import EventBus
from h3core.runtime.store_retry import StoreUnavailable
from h3core.runtime.tail import StoreTail
from tests.factories import submitted

pytestmark = pytest.mark.anyio


async def test_events_another_connection_stores_are_published_in_order_once(tmp_path):
    path = tmp_path / "h3.db"
    mine, theirs = SQLiteEventStore(path, durable=False), SQLiteEventStore(path, durable=False)
    theirs.append("old", [submitted(), Admitted()])  # before the tail: not published
    bus = EventBus()
    tail = StoreTail(mine, bus, interval_s=0.01, batch=3)  # a batch smaller than the backlog
    async with bus.subscribe() as everything, bus.subscribe("b") as only_b, anyio.create_task_group() as tg:
        await tg.start(tail.run)
        theirs.append("a", [submitted(), Admitted(), Running(attempt=1, executor="x")])
        theirs.append("b", [submitted(), Admitted()])
        theirs.append_batch([("a", [Progress(step=1, total=2)], None), ("b", [Running(attempt=1, executor="x")], None)])
        seen = []
        with anyio.fail_after(5):
            while len(seen) < 7:
                seen.append(await everything.receive())
        assert [(e.job_id, e.seq) for e in seen] == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2), ("a", 4), ("b", 3)]
        assert [(e.job_id, e.seq) for e in [only_b.receive_nowait() for _ in range(3)]] == [("b", 1), ("b", 2), ("b", 3)]
        await anyio.sleep(0.05)  # nothing is published twice
        with pytest.raises(anyio.WouldBlock):
            everything.receive_nowait()
        assert tail.position == theirs.cursor()
        tg.cancel_scope.cancel()


async def test_on_postgres_a_commit_by_another_node_wakes_the_tail_without_its_poll(pg_url):
    from h3core.adapters.store.postgres import PostgresEventStore

    mine, theirs = PostgresEventStore(pg_url), PostgresEventStore(pg_url)
    bus = EventBus()
    tail = StoreTail(mine, bus, interval_s=3600)  # its poll never comes round: only NOTIFY wakes it
    async with bus.subscribe() as everything, anyio.create_task_group() as tg:
        await tg.start(tail.run)
        for n in range(3):  # the first waits may return at once (listening starts): after that only commits wake it
            theirs.append(f"j{n}", [submitted()])
            with anyio.fail_after(30):
                assert (await everything.receive()).job_id == f"j{n}"
        tg.cancel_scope.cancel()
    mine.close()
    theirs.close()


async def test_a_tail_whose_notifications_fail_falls_back_to_polling(tmp_path):
    class Deaf(SQLiteEventStore):
        def wait_for_events(self, timeout_s):
            raise ConnectionError("the listening connection is gone")

    path = tmp_path / "h3.db"
    mine, theirs = Deaf(path, durable=False), SQLiteEventStore(path, durable=False)
    bus = EventBus()
    async with bus.subscribe() as everything, anyio.create_task_group() as tg:
        await tg.start(StoreTail(mine, bus, interval_s=0.01).run)
        theirs.append("a", [submitted()])
        with anyio.fail_after(30):
            assert (await everything.receive()).job_id == "a"
        tg.cancel_scope.cancel()


class Flaky(SQLiteEventStore):
    """A store whose reads of the log fail transiently while `failing` is set."""

    failing = False

    def events_after(self, cursor, limit=1000):
        if self.failing:
            raise sqlite3.OperationalError("disk I/O error")
        return super().events_after(cursor, limit)


async def test_a_tail_reads_on_after_the_store_failed_for_a_while_and_misses_nothing(tmp_path):
    path = tmp_path / "h3.db"
    mine, theirs = Flaky(path, durable=False), SQLiteEventStore(path, durable=False)
    bus = EventBus()
    async with bus.subscribe() as everything, anyio.create_task_group() as tg:
        await tg.start(StoreTail(mine, bus, interval_s=0.01, retry_s=30).run)
        mine.failing = True
        theirs.append("a", [submitted(), Admitted()])  # stored while the tail's reads fail
        await anyio.sleep(0.3)  # a few failed reads, retried
        mine.failing = False
        with anyio.fail_after(30):
            assert [(e.job_id, e.seq) for e in [await everything.receive(), await everything.receive()]] == [("a", 1), ("a", 2)]
        tg.cancel_scope.cancel()


async def test_a_tail_whose_store_fails_past_its_limit_raises_store_unavailable_and_a_bug_at_once(tmp_path):
    store = Flaky(tmp_path / "h3.db", durable=False)
    store.failing = True  # its start (the newest position) reads; then every read of the log fails
    with anyio.fail_after(30), pytest.raises(StoreUnavailable, match="every tail read for 0.2s"):
        await StoreTail(store, EventBus(), interval_s=0.01, retry_s=0.2).run()

    def bug(cursor, limit=1000):
        raise ValueError("a bug")

    store.events_after = bug  # type: ignore[method-assign]
    with anyio.fail_after(30), pytest.raises(ValueError, match="a bug"):  # not the store's failure: never retried
        await StoreTail(store, EventBus(), interval_s=0.01, retry_s=30).run()
