"""Following the store: every event any process stores, published to a bus in store order.

An API process that runs no runner of its own (`H3_ROLE=api`) sees the jobs a runner process
runs this way: live streams and metrics read the bus as they would beside an in-process runner.
The store is the only channel between the processes, so neither depends on the other being up:
a tail started late, or one that fell behind, reads what it missed from the store. On PostgreSQL
the store's LISTEN/NOTIFY wakes the tail when another node commits (a poll every `interval_s`
stays as the fallback); other stores are polled.

A failing store is read again as the runner's reads are (`h3core.runtime.store_retry`): a restart
of the server, or its sessions ended, costs the tail a pause, not its life. Past `retry_s` of
failures it raises `StoreUnavailable`, on which the process stops (`Service.run_runner`): a tail
that no longer follows would leave live streams without their events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import anyio
from anyio.abc import TaskStatus

from h3core.adapters.store.base import EventStore, Notifying
from h3core.runtime.bus import EventBus
from h3core.runtime.store_retry import retrying

T = TypeVar("T")

log = logging.getLogger("h3core.tail")

WAIT_SLICE_S = 1.0


class StoreTail:
    """Publishes every event stored after `position` to `bus`, in store order, each once (see the module)."""

    def __init__(
        self, store: EventStore, bus: EventBus, *, interval_s: float = 0.05, batch: int = 1000, retry_s: float = 30.0
    ) -> None:
        """`retry_s`: how long a failing store is read again before `StoreUnavailable` (H3_STORE_RETRY)."""
        self.store = store
        self.bus = bus
        self.interval_s = interval_s  # how long a new event can wait to be seen, at most
        self.batch = batch
        self.retry_s = retry_s
        self.position = 0  # the last event published

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """From the events stored from now on, until cancelled, or `StoreUnavailable` once the store
        has failed for `retry_s`. Subscribers get history from the store themselves (as they do
        beside a runner), so the tail starts at the newest event."""
        self.position = await self._read(self.store.cursor)
        task_status.started()
        while True:
            rows = await self._read(lambda: self.store.events_after(self.position, self.batch))
            if rows:
                self.position = rows[-1][0]
                self.bus.publish(e for _, e in rows)
            if len(rows) < self.batch:  # caught up: wait; behind: read on at once
                await self._wait()

    async def _read(self, call: Callable[[], T]) -> T:
        return await retrying(call, limit_s=self.retry_s, what="tail read")

    async def _wait(self) -> None:
        """Until new events may be there: a store that announces commits (PostgreSQL's
        LISTEN/NOTIFY) wakes the tail at once, polled every `interval_s` besides in case a
        notification is lost (the listening connection dropped); others are polled."""
        if not isinstance(self.store, Notifying):
            await anyio.sleep(self.interval_s)
            return
        wait = self.store.wait_for_events
        try:
            # In slices of at most a second: a thread blocked in the wait holds a stop up that long.
            deadline = anyio.current_time() + self.interval_s
            while (left := deadline - anyio.current_time()) > 0:
                if await anyio.to_thread.run_sync(wait, min(left, WAIT_SLICE_S)):
                    return
        except Exception as exc:  # the listener is away: poll this once, listen again next time
            log.warning("store tail: waiting for notifications failed (%s); polling every %gs", exc, self.interval_s)
            await anyio.sleep(self.interval_s)
