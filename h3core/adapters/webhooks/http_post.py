"""`HttpPostClient`, the webhook transport (`h3core.adapters.webhooks.base`): one small HTTP/1.1
POST client, to a given address, over kept-alive connections, with h11.

Why not httpx: a webhook send is one POST whose answer's status is all that matters, and
httpx's general machinery cost about 8 times the CPU per request of this (bench.throughput.webhooks and
a side-by-side of 600 POSTs: 4.3-5.2 ms against 0.55-0.6 ms, on a loaded 2-core box). And the
connection goes to the address the caller checked, never to a second lookup of the name: the
name is only the `host` header and, for https, the name the certificate is checked against (SNI).

Connections are kept per (scheme, host name, address, port), idle at most `IDLE_S`: a TLS
session is for one name, so two names on one address never share one. A kept connection the
server closed meanwhile fails on its next use before any answer; that send is tried once more on
a fresh connection. Redirects are not followed (a 3xx is just a status); the answer's body is
read to `MAX_BODY` bytes and the connection dropped past that. Protocol parsing is h11's.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import h11
from anyio.abc import ByteStream

from h3core.adapters.webhooks.base import PostFailed, outgoing

__all__ = ["HttpPostClient"]

IDLE_S = 5.0
MAX_BODY = 64 * 1024
MAX_IDLE_PER_KEY = 16
Key = tuple[str, str, str, int]  # scheme, host name, address, port


@dataclass
class _Connection:
    stream: ByteStream
    http: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0


class HttpPostClient:
    """The webhook transport: POSTs to an address the caller checked, over kept-alive HTTP/1.1
    connections (the module docstring). `ssl_context`: what https servers' certificates are
    checked against (the system's CAs by default)."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.ssl_context = ssl_context or ssl.create_default_context()
        self._idle: dict[Key, list[_Connection]] = {}
        self._expired: list[_Connection] = []

    async def post(self, url: str, headers: Sequence[tuple[str, str]], body: bytes, *, address: str) -> int:
        """POST `body` to `url` at `address` (never a lookup of the URL's host), `host` and
        `content-length` written here; the answer's status. PostFailed when there is no answer."""
        out = outgoing(url, headers, body, address)
        scheme, host, port = out.scheme, out.host, out.port
        key = (scheme, host, address, port)
        request = [
            h11.Request(method="POST", target=out.target, headers=list(out.headers)),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ]
        conn = self._take(key)
        while self._expired:
            await _close(self._expired.pop())
        if conn is not None:
            try:
                return await self._exchange(key, conn, request, reused=True)
            except _Stale:
                pass  # the server closed it while it was idle: once more, on a fresh one
        try:
            with anyio.fail_after(self.connect_timeout_s):
                if scheme == "https":  # the certificate checked against the name, at the address given
                    stream: ByteStream = await anyio.connect_tcp(
                        address,
                        port,
                        ssl_context=self.ssl_context,
                        tls_hostname=host,
                        tls_standard_compatible=False,  # no close_notify waited for: the answer says where it ends
                    )
                else:
                    stream = await anyio.connect_tcp(address, port)
        except (OSError, TimeoutError, anyio.BrokenResourceError) as exc:  # ssl.SSLError is an OSError
            raise PostFailed(f"cannot connect to {address}:{port}: {_say(exc)}") from exc
        return await self._exchange(key, _Connection(stream), request, reused=False)

    def _take(self, key: Key) -> _Connection | None:
        idle = self._idle.get(key)
        now = anyio.current_time()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < IDLE_S:
                return conn
            self._expired.append(conn)
        self._idle.pop(key, None)  # no list kept for a key with no connection
        return None

    async def _exchange(self, key: Key, conn: _Connection, request: list[h11.Event], *, reused: bool) -> int:
        answered = False
        try:
            with anyio.fail_after(self.read_timeout_s):
                await conn.stream.send(b"".join(conn.http.send(e) or b"" for e in request))
                status = 0
                read = 0
                while True:
                    event = conn.http.next_event()
                    if event is h11.NEED_DATA:
                        try:
                            data = await conn.stream.receive(65536)
                        except anyio.EndOfStream:
                            data = b""  # h11's word for the end: an answer that ends with the connection, or none
                        conn.http.receive_data(data)
                        continue
                    if isinstance(event, h11.Response):
                        answered = True
                        status = event.status_code
                    elif isinstance(event, h11.Data):
                        read += len(event.data)
                        if read > MAX_BODY:
                            await _close(conn)
                            return status
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        if not answered:
                            raise anyio.BrokenResourceError("the connection closed before an answer")
                        break
        except (OSError, TimeoutError, anyio.BrokenResourceError, h11.ProtocolError) as exc:
            await _close(conn)
            if reused and not answered and not isinstance(exc, TimeoutError):
                raise _Stale from exc
            raise PostFailed(_say(exc)) from exc
        except BaseException:
            await _close(conn)
            raise
        if conn.http.our_state is h11.DONE and conn.http.their_state is h11.DONE:
            conn.http.start_next_cycle()
            conn.idle_since = anyio.current_time()
            idle = self._idle.setdefault(key, [])
            if len(idle) < MAX_IDLE_PER_KEY:
                idle.append(conn)
                return status
        await _close(conn)
        return status

    async def aclose(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for conn in idle:
                await _close(conn)
        self._idle.clear()


class _Stale(Exception):
    """A kept connection that failed before any answer."""


async def _close(conn: _Connection) -> None:
    """Close a connection of no further use, even while cancelled, and within a second."""
    with anyio.move_on_after(1, shield=True):
        await conn.stream.aclose()


def _say(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
