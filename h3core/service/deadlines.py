"""Read deadlines for HTTP connections: a client that sends its request too slowly is disconnected.

uvicorn bounds the idle time between requests (keep-alive) but not the time a client takes to
send one: a connection that stops mid-headers, or trickles its body a byte every few seconds,
holds a socket (and an upload's worker) for as long as it likes. Here, as Apache's
mod_reqtimeout does it, each request must arrive at a minimum pace:

- its request line and headers within `header_s` of the connection (or, on a kept-alive
  connection, of its first byte), extended by one second per `min_rate` bytes received, up to
  `header_max_s`; past it the client is answered 408 and disconnected;
- and a new connection must send its first byte within `idle_s` (the keep-alive timeout, where
  `serve` sets it): one that sends nothing holds a socket no longer than one between requests does;
- its body within `body_s` of its headers, extended by one second per `min_rate` bytes received;
  past it the connection is closed (the application sees the client gone, as after a drop).

This is enforced before anything else runs (the token check included). When the server stops, a
connection still receiving a request is closed at once instead of holding the graceful shutdown.
Both of uvicorn's HTTP implementations are covered: httptools (its parser's callbacks) and h11
(its connection state, read after each chunk).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger("h3core.service")

Phase = Literal["headers", "body"] | None

_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"


@dataclass(frozen=True)
class ReadLimits:
    """The deadlines `protocol` holds each request to: seconds for its request line and headers (at most
    `header_max_s`) and for its body, each extended by one second per `min_rate` bytes received;
    a new connection's first byte within `idle_s` (None: as its headers)."""

    header_s: float = 20.0
    header_max_s: float = 60.0
    body_s: float = 20.0
    min_rate: float = 500.0  # bytes per second that earn one more second
    idle_s: float | None = None


class _Deadline:
    """The deadline of the request being read on one connection (mixed into a uvicorn protocol)."""

    limits: ReadLimits
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _phase: Phase = None
    _due: float = 0.0
    _cap: float | None = None
    # One timer per connection, moved only earlier: a request's phases move the deadline later
    # (which the timer finds when it fires and follows), so a request costs no timer of its own.
    _timer: asyncio.TimerHandle | None = None
    _timer_at: float = 0.0
    _headers_due: float | None = None  # a new connection's header deadline, once its first byte came

    def _begin_connection(self) -> None:
        idle_s = self.limits.idle_s
        if idle_s is None or idle_s >= self.limits.header_s:
            self._begin("headers")
            return
        # Sending nothing, it is due sooner; its first byte restores the header deadline.
        now = self.loop.time()
        self._phase, self._due = "headers", now + idle_s
        self._headers_due, self._cap = now + self.limits.header_s, now + self.limits.header_max_s
        self._schedule()

    def _begin(self, phase: Literal["headers", "body"]) -> None:
        now = self.loop.time()
        if phase == "headers":
            self._due, self._cap = now + self.limits.header_s, now + self.limits.header_max_s
        else:
            self._due, self._cap = now + self.limits.body_s, None
        self._phase = phase
        if self._timer is None or self._timer_at > self._due:
            self._schedule()

    def _received(self, n: int) -> None:
        if self._phase is not None:
            if self._headers_due is not None and n:
                self._due, self._headers_due = self._headers_due, None
            self._due += n / self.limits.min_rate
            if self._cap is not None:
                self._due = min(self._due, self._cap)

    def _end(self) -> None:
        self._phase = None  # the timer stays: it finds no request being read and stops

    def _stop_timer(self) -> None:
        self._phase = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = self._due
        self._timer = self.loop.call_at(self._due, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._phase is None or self.transport.is_closing():
            return
        if self.loop.time() < self._due:  # bytes arrived meanwhile and earned more time
            self._schedule()
            return
        phase, self._phase = self._phase, None
        peer = self.transport.get_extra_info("peername")
        log.info("closed a connection from %s: its request %s came too slowly", peer, phase, extra={"peer": str(peer)})
        if phase == "headers":  # nothing of a response has been sent: say why
            why = b"the request line and headers did not arrive in time\n"
            self.transport.write(_TIMED_OUT % (len(why), why))
        self.transport.close()

    def _receiving(self) -> bool:
        return self._phase is not None

    # Both of uvicorn's protocols: this mixin comes first in their bases, so `super()` is theirs.
    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)  # type: ignore[misc]

    def shutdown(self) -> None:
        if self._receiving():  # a client still sending does not hold the server's stop
            self._stop_timer()
            self.transport.close()
            return
        super().shutdown()  # type: ignore[misc]


def protocol(limits: ReadLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools where installed, as its "auto" picks, else h11) with read
    deadlines: pass it as `uvicorn.Config(http=...)`."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return _h11(limits)
    return _httptools(limits)


def _httptools(limits: ReadLimits) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Protocol(_Deadline, HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._begin_connection()

        def data_received(self, data: bytes) -> None:
            self._received(len(data))
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._receiving():  # the next request on a kept-alive connection
                self._begin("headers")

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._begin("body")

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._end()

    Protocol.limits = limits
    return Protocol


def _h11(limits: ReadLimits) -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(_Deadline, H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._begin_connection()

        def data_received(self, data: bytes) -> None:
            if not self._receiving() and self.conn.their_state is h11.IDLE:
                self._begin("headers")  # the next request on a kept-alive connection
            self._received(len(data))
            super().data_received(data)
            state = self.conn.their_state
            if state is h11.SEND_BODY and self._phase == "headers":
                self._begin("body")
            elif state not in (h11.IDLE, h11.SEND_BODY):
                self._end()

    Protocol.limits = limits
    return Protocol
