"""Fan-out of stored events to live subscribers, without ever blocking the publisher.

Each subscriber gets a bounded buffer. A subscriber that falls behind is dropped (its stream
ends) rather than slowing the runner; it catches up from the store, which has every event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from h3core.domain.events import Event


class EventBus:
    """Every event this process learns of, fanned out to its subscribers as it is published.

    A subscriber too slow to keep `buffer` events is dropped (its stream ends), never waited for:
    followers read the store again when that happens (`h3core.runtime.follow`)."""

    def __init__(self, buffer: int = 1024) -> None:
        self._buffer = buffer
        self._subs: dict[MemoryObjectSendStream[Event], str | None] = {}
        self.closed = False

    def close(self) -> None:
        """End every subscriber's stream (shutdown); later subscribers get an ended stream."""
        self.closed = True
        for send in list(self._subs):
            self._drop(send)

    def publish(self, events: Iterable[Event]) -> None:
        """Hand each event to every subscriber of all jobs or of its job, without waiting."""
        for event in events:
            for send, job_id in list(self._subs.items()):
                if job_id is not None and job_id != event.job_id:
                    continue
                try:
                    send.send_nowait(event)
                except anyio.WouldBlock:
                    self._drop(send)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self._drop(send)

    def _drop(self, send: MemoryObjectSendStream[Event]) -> None:
        self._subs.pop(send, None)
        send.close()

    @asynccontextmanager
    async def subscribe(self, job_id: str | None = None) -> AsyncIterator[MemoryObjectReceiveStream[Event]]:
        """Events published from now on (for one job, or all). The stream ends if dropped."""
        send, receive = anyio.create_memory_object_stream[Event](self._buffer)
        if self.closed:
            send.close()
        else:
            self._subs[send] = job_id
        try:
            with receive:
                yield receive
        finally:
            self._drop(send)

    @property
    def subscribers(self) -> int:
        """How many streams are subscribed now."""
        return len(self._subs)
