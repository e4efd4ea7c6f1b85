"""What the console's pages follow live: which jobs changed, at most once per interval however
many events the runner writes (200 running jobs each reporting steps must not flood a page)."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable

import anyio
from anyio.abc import ObjectReceiveStream

from h3core.domain.events import Event
from h3core.runtime.bus import EventBus

__all__ = ["UPDATE_INTERVAL_S", "changes"]

UPDATE_INTERVAL_S = 0.25  # at most 4 updates a second to a page
MAX_IDS = 500  # more changed jobs than this in one update: the page is told "all"


async def _gather(live: ObjectReceiveStream[Event], pending: set[str], timeout_s: float, *, one: bool = False) -> bool:
    """Add the ids of the events that come within `timeout_s` (or the first one, with `one`) to
    `pending`; False once the stream has ended (the bus closed, or this subscriber fell behind and
    was dropped). The wait is a cancel scope, so it lives here, never around a generator's yield."""
    with anyio.move_on_after(max(timeout_s, 0.0)):
        try:
            while True:
                pending.add((await live.receive()).job_id)
                if one:
                    break
        except anyio.EndOfStream:
            return False
    return True


async def changes(
    bus: EventBus,
    *,
    interval_s: float = UPDATE_INTERVAL_S,
    keepalive_s: float = 15.0,
    stopping: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[list[str] | None]:
    """The ids of the jobs that changed (sorted; ["*"] for "too many, or some may be missed: read
    everything"), no sooner than `interval_s` after the previous update; None after `keepalive_s`
    without any (a keep-alive). Ends when the bus closes or `stopping()`."""
    last = -math.inf
    while not bus.closed:
        async with bus.subscribe() as live:
            while True:
                pending: set[str] = set()
                alive = await _gather(live, pending, keepalive_s, one=True)
                if alive and not pending:
                    if stopping():
                        return
                    yield None
                    continue
                if alive:  # something changed: gather more until the interval since the last update is over
                    alive = await _gather(live, pending, last + interval_s - clock())
                if not alive:
                    if bus.closed:
                        return
                    await anyio.sleep(max(last + interval_s - clock(), 0.0))  # the interval holds here too
                last = clock()
                yield sorted(pending) if alive and len(pending) <= MAX_IDS else ["*"]
                if not alive:
                    break  # dropped for falling behind: subscribe again
