"""How many requests and connections the service takes at once, kept apart so that connections
that send nothing cost little and never refuse a request (issue 38).

uvicorn's `limit_concurrency` counts every open connection: 600 that had sent nothing made every
request, /healthz included, 503 until the header deadline closed them 20 s later. Here:

- **Requests** (`Admission`): at most `limit` requests are in the app at once (one ASGI call each;
  a streamed response counts until it ends); beyond, 503 as uvicorn answered. A connection whose
  request's headers have not all arrived is not a request. /healthz is always let in: it costs
  nothing, and a liveness probe refused under load gets a busy process restarted.
- **Connections** (`capped`): at most `limit` are held open per listener. A new one that would
  pass it makes room by closing the connection idle longest (none of its requests in the app:
  waiting for its first byte, mid-headers, or kept alive between requests), so a flood of idle
  sockets cannot keep a probe out; only where every other one is busy is the new one closed.
- **Idle ones go soon**: a connection that sends nothing is closed after the keep-alive timeout,
  as one between requests is (`deadlines.ReadLimits.idle_s`), not after the header deadline.
- **File descriptors** (`open_files_for`): the process's soft open-file limit is raised, up to its
  hard one, to hold the connections and files beside them; the connection limit is cut to fit.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger("h3core.service")

__all__ = ["Admission", "capped", "open_files_for"]

Scope = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]

# What a store, artifacts, uploads, logs and libraries hold open beside the connections.
FILES_BESIDE = 1024
_BUSY = b"Service Unavailable"


class Admission:
    """The ASGI app `app` taking at most `limit` requests at once (paths in `always` are always
    taken); a request beyond is answered 503 with uvicorn's response for its own limit."""

    def __init__(self, app: ASGIApp, limit: int, always: frozenset[str] = frozenset({"/healthz"})) -> None:
        self.app, self.limit, self.always = app, limit, always
        self.in_flight = 0  # one event loop: no lock

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        """The ASGI call: a request let in, or answered 503 here."""
        if scope["type"] != "http" or scope["path"] in self.always:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            log.warning("answered 503: %d requests in flight, the limit (H3_MAX_CONNECTIONS)", self.in_flight)
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"19"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": _BUSY})
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


class _Capped:
    """The open-connection limit of one listener, mixed into its uvicorn protocol (before it)."""

    limit: int
    # This listener's open connections, the one idle longest first: made, or done with a request.
    held: dict[_Capped, None]
    transport: asyncio.Transport
    cycle: Any  # uvicorn's request-response cycle: None, or the latest request's
    closed_since_log = 0
    logged_at = 0.0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.held[self] = None
        if len(self.held) > self.limit:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self.held.pop(self, None)
        super().connection_lost(exc)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self in self.held:  # used just now: the last to be closed for room
            del self.held[self]
            self.held[self] = None

    def _idle(self) -> bool:
        # As uvicorn's own shutdown tells a connection it may close at once.
        return self.cycle is None or self.cycle.response_complete

    def _make_room(self) -> None:
        victim: _Capped = self  # every other one busy: the new one goes
        for conn in self.held:  # oldest first; the busy ones at the front are few (the request limit)
            if conn is not self and conn._idle():
                victim = conn
                break
        del self.held[victim]
        victim.transport.close()
        cls = type(self)
        cls.closed_since_log += 1
        now = time.monotonic()
        if now - cls.logged_at >= 60:
            log.warning(
                "open connections at the limit (%d, H3_MAX_OPEN_CONNECTIONS): closed %d to make room since the last report",
                self.limit,
                cls.closed_since_log,
            )
            cls.logged_at, cls.closed_since_log = now, 0


def capped(protocol: type[asyncio.Protocol], limit: int) -> type[asyncio.Protocol]:
    """`protocol` (a uvicorn HTTP protocol) holding at most `limit` connections open at once, as the
    module docstring says; each call makes a listener of its own."""

    class Protocol(_Capped, protocol):  # type: ignore[misc,valid-type]
        pass

    Protocol.limit = limit
    Protocol.held = {}
    return Protocol


def open_files_for(connections: int) -> int:
    """Raise the soft open-file limit (up to the hard one) to hold `connections` sockets and
    FILES_BESIDE more; how many connections the limit then allows (`connections` at most)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + FILES_BESIDE
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < raised:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d: %s", soft, exc)
    if soft == resource.RLIM_INFINITY:
        return connections
    # A low limit that cannot be raised (1024 and no more) still leaves most to connections.
    return max(1, min(connections, soft - min(FILES_BESIDE, soft // 4)))
