"""Following one job's log: its stored events, then each as it is published, with nothing missed.

The one way a reader (the embedding API's `Jobs.follow`, the HTTP live stream) turns a store and
an `EventBus` into a gapless, ordered sequence of a job's events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

import anyio
from anyio.abc import ObjectReceiveStream

from h3core.domain.events import Event
from h3core.runtime.bus import EventBus


class _Resync:
    """Nothing came in time: read the store again."""


async def _next_live(live: ObjectReceiveStream[Event], timeout_s: float) -> Event | _Resync | None:
    """The next live event; `_Resync()` when nothing came in time; None when the stream ended
    (dropped, or the bus closed). The wait is a cancel scope, so it lives here: the generator
    that yields the event decides outside it."""
    with anyio.move_on_after(timeout_s):
        try:
            return await live.receive()
        except anyio.EndOfStream:
            return None
    return _Resync()


async def follow(
    bus: EventBus,
    read: Callable[[str, int], list[Event]],
    job_id: str,
    after: int,
    *,
    resync_s: float,
    stopping: Callable[[], bool] = lambda: False,
) -> AsyncGenerator[Event | None, None]:
    """A job's events after seq `after`: the stored history (`read(job_id, after)`, in a worker
    thread), then each one as it is published, in order and without gaps, ending after the
    terminal one or when the bus closes. Yields None whenever `resync_s` passes quietly (a
    keep-alive for a stream) and then reads the store again, which is how events other processes
    stored arrive; ends there if `stopping()`. Never yields inside a cancel scope."""
    while True:
        # Subscribe before reading the store, so nothing falls between the two.
        async with bus.subscribe(job_id) as live:
            for e in await anyio.to_thread.run_sync(read, job_id, after):
                yield e
                after = e.seq
                if e.terminal:
                    return
            while True:
                got = await _next_live(live, resync_s)
                if got is None:
                    if bus.closed:
                        return  # the bus's owner is stopping
                    break  # we fell behind and were dropped: catch up from the store
                if isinstance(got, _Resync):
                    if stopping():
                        return
                    yield None
                    break
                if got.seq <= after:
                    continue
                if got.seq != after + 1:
                    break  # a gap: catch up from the store
                yield got
                after = got.seq
                if got.terminal:
                    return
