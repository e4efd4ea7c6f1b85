from __future__ import annotations

import anyio
import pytest

from h3core import Admitted, EventBus, IllegalEvent, Progress, Running, SQLiteEventStore
from h3core.runtime._writer import GroupWriter
from tests.factories import submitted

pytestmark = pytest.mark.anyio


async def test_concurrent_appends_share_transactions_and_keep_their_own_outcomes(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    bus = EventBus()
    writer = GroupWriter(store, bus)
    results: dict[str, object] = {}

    async def job(i: int) -> None:
        state = await writer.append(f"j{i}", [submitted(), Admitted()], 0)
        assert state.status == "queued"
        await writer.append(f"j{i}", [Running(attempt=1, executor="x")])
        try:
            await writer.append(f"j{i}", [Progress(step=5, total=2)] if i % 2 else [Progress(step=1, total=2)])
            results[f"j{i}"] = "ok"
        except IllegalEvent as exc:
            results[f"j{i}"] = exc.code

    async with bus.subscribe() as seen, anyio.create_task_group() as outer:
        await outer.start(writer.run)
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(job, i)
        writer.close()
        events = [seen.receive_nowait() for _ in range(40 * 3 + 20)]
    assert writer.appends == 120 and writer.batches < 120 / 2, "appends waiting together are committed together"
    assert results == {f"j{i}": ("step_over_total" if i % 2 else "ok") for i in range(40)}
    assert all(len(store.events(f"j{i}")) == (3 if i % 2 else 4) for i in range(40))
    assert len(events) == 140  # only what was stored is published


async def test_a_cancelled_caller_still_learns_its_append_was_written(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3.db")
    writer = GroupWriter(store, EventBus())
    async with anyio.create_task_group() as outer:
        await outer.start(writer.run)
        with anyio.CancelScope() as scope:
            scope.cancel()  # cancelled before it even waits
            await writer.append("a", [submitted()], 0)
        writer.close()
    assert [e.type for e in store.events("a")] == ["submitted"]
