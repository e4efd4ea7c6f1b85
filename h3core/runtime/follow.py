"""Following one job's log: its stored events, then each as it is published, with nothing missed.

The one way a reader (the embedding API's `Jobs.follow`, the HTTP live stream) turns a store and
an `EventBus` into a gapless, ordered sequence of a job's events.

A read of the store that fails transiently (the server restarting, its sessions ended:
`store_retry.transient`) is tried again, a keep-alive yielded before each pause, until it goes
through or the bus's owner stops: a stream opened before a fault reaches the terminal event after
it. Whether the store is lost for good is the process's call (`StoreUnavailable` ends it and
closes the bus), not each reader's.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable

import anyio
from anyio.abc import ObjectReceiveStream

from h3core.adapters.backoff import Backoff
from h3core.domain.events import Event
from h3core.runtime.bus import EventBus
from h3core.runtime.store_retry import FIRST_PAUSE_S, LONGEST_PAUSE_S, transient

log = logging.getLogger("h3core.follow")


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
    stored arrive; ends there if `stopping()`. A read that fails transiently is tried again (the
    module docstring), None yielded before each pause. Never yields inside a cancel scope."""
    failures = 0
    backoff = Backoff(FIRST_PAUSE_S, min(LONGEST_PAUSE_S, resync_s))
    while True:
        # Subscribe before reading the store, so nothing falls between the two.
        async with bus.subscribe(job_id) as live:
            try:
                stored = await anyio.to_thread.run_sync(read, job_id, after)
            except Exception as exc:
                if not transient(exc):
                    raise
                failures += 1
                if failures == 1:
                    log.info("following job %s: the store failed (%s); reading it again", job_id, exc, extra={"job_id": job_id})
                stored = None
            if stored is None:
                if bus.closed or stopping():
                    return
                yield None
                await anyio.sleep(backoff.pause(failures))
                continue
            failures = 0
            for e in stored:
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
