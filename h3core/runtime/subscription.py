"""Named, durable subscriptions over the whole log: every job's events in store order, from a
position the store keeps, so a reader that restarts goes on where it was.

    sub = jobs.subscribe("billing")          # or Subscription(store, bus, "billing")
    await sub.run(handle)                    # until cancelled; `handle(event)` for each event

At least once: the position is saved only after the handler returned for the events before it
(once per batch, and when `run` ends), so an event whose handler raised, or whose handling a
crash cut off, is handed over again by the next `run`; never skipped, sometimes repeated. A
handler that must not repeat an effect keys it on `(event.job_id, event.seq)`.

Waiting for new events takes no polling beside a runner: the subscription sleeps until the bus
publishes, then reads the store (the bus only wakes it; the store says what is new, so an event
dropped from the bus is never missed). Events another process stores reach it within `resync_s`.
One reader per name at a time: two running under one name would each deliver everything.
With `retry_s`, a store that fails (a lost connection, a restarted server) is read and written
again for that long (`h3core.runtime.store_retry`); past it `StoreUnavailable` ends the reading.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from functools import partial
from typing import Literal

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from h3core.adapters.store.base import EventStore
from h3core.domain.events import Event
from h3core.runtime.bus import EventBus
from h3core.runtime.store_retry import in_thread

__all__ = ["Start", "Subscription"]

# Where a subscription with no saved position begins: the first event ever stored, or the next.
Start = Literal["beginning", "end"]


def _drain(live: MemoryObjectReceiveStream[Event]) -> bool:
    """Empty what the bus has buffered; False once the stream has ended (dropped, or closed)."""
    while True:
        try:
            live.receive_nowait()
        except anyio.WouldBlock:
            return True
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return False


async def _woken(live: MemoryObjectReceiveStream[Event], timeout_s: float) -> bool:
    """Wait for the bus to publish something, up to `timeout_s`; False if the stream ended."""
    with anyio.move_on_after(timeout_s):
        try:
            await live.receive()
        except anyio.EndOfStream:
            return False
    return True


class Subscription:
    """One named reader of the whole log, its place kept in the store (`position`/`save_position`)."""

    def __init__(
        self,
        store: EventStore,
        bus: EventBus,
        name: str,
        *,
        start: Start = "beginning",
        batch: int = 100,
        resync_s: float = 1.0,
        retry_s: float | None = None,
    ) -> None:
        if not name:
            raise ValueError("a subscription needs a name")
        self.store = store
        self.bus = bus
        self.name = name
        self.start = start
        self.batch = batch  # events read at once; the position is saved after each batch is handled
        self.resync_s = resync_s  # how late an event another process stored can be seen, at most
        self.retry_s = retry_s  # how long a failing store is tried again (None: not at all)

    async def position(self) -> int:
        """The saved position; the first time, where `start` says, saved at once (so that "end"
        means the end as of the first start, not of each restart)."""
        saved = await in_thread(partial(self.store.position, self.name), limit_s=self.retry_s, what="position read")
        if saved is not None:
            return saved
        at = 0 if self.start == "beginning" else await in_thread(self.store.cursor, limit_s=self.retry_s, what="cursor read")
        await self.save(at)
        return at

    async def save(self, position: int) -> None:
        """Keep `position` as this subscription's place: every event up to it is handled."""
        await in_thread(partial(self.store.save_position, self.name, position), limit_s=self.retry_s, what="position save")

    async def batches(self, after: int) -> AsyncGenerator[list[tuple[int, Event]], None]:
        """Every event stored after position `after`, in store order, a batch at a time, forever
        (waiting while there is none). Saves nothing: the caller `save`s what it has handled."""
        while True:
            async with self.bus.subscribe() as live:
                # Subscribed (and drained) before each read of the store: whatever is published
                # after a read wakes the wait that follows it, so nothing waits `resync_s` for nothing.
                while _drain(live) or self.bus.closed:
                    read = partial(self.store.events_after, after, self.batch)
                    rows = await in_thread(read, limit_s=self.retry_s, what="read of the log")
                    if rows:
                        after = rows[-1][0]
                        yield rows
                        continue
                    if self.bus.closed:  # nobody publishes any more: look at the store now and then
                        await anyio.sleep(self.resync_s)
                    elif not await _woken(live, self.resync_s):
                        break
            # Dropped by the bus (the buffer filled while a batch was handled): subscribe again.

    async def run(self, handler: Callable[[Event], Awaitable[object]]) -> None:
        """`await handler(event)` for every event after the saved position, in store order, until
        cancelled. A handler that raises ends `run` with its exception, the position saved just
        before that event: the next `run` starts with it."""
        done = saved = await self.position()
        async with aclosing(self.batches(done)) as batches:
            async for rows in batches:
                try:
                    for position, event in rows:
                        await handler(event)
                        done = position
                finally:
                    if done != saved:
                        with anyio.CancelScope(shield=True):  # what was handled stays handled
                            await self.save(done)
                        saved = done
