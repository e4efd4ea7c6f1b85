"""Requests and open connections bounded apart (issue 38), on both of uvicorn's HTTP
implementations: connections without a request in the app never refuse one, a new connection past
the open-connection limit closes the idlest one (never a busy one), requests past the request
limit are 503 but /healthz, and the open-file limit is raised to hold the connections."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("uvicorn")

from h3core.service import connections  # noqa: E402
from h3core.service.connections import Admission, capped, open_files_for  # noqa: E402
from h3core.service.deadlines import ReadLimits  # noqa: E402
from tests.integration.conftest import poll  # noqa: E402
from tests.unit.service.test_deadlines import echo_length, read_all, read_response, serving  # noqa: E402

# Deadlines far longer than a test: nothing here is closed by them.
LONG = ReadLimits(header_s=60.0, header_max_s=60.0, body_s=60.0, min_rate=1000.0)
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
POSTING = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"  # 7 bytes still to come: in the app


def closed(conn: socket.socket) -> bool:
    conn.settimeout(0.05)
    try:
        return conn.recv(65536) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def connect(address, first: bytes = b"") -> socket.socket:
    conn = socket.create_connection(address)
    if first:
        conn.sendall(first)
    return conn


class Counting:
    """An ASGI app that counts the requests that reached it: a test waits for one to be in the app."""

    def __init__(self, app) -> None:
        self.app, self.calls = app, 0

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        await self.app(scope, receive, send)


def test_a_new_connection_past_the_limit_closes_the_one_idle_longest(implementation):
    protocol = capped(implementation(LONG), 4)
    with serving(protocol) as address:
        used = connect(address)
        idle = [connect(address) for _ in range(3)]
        # Accepted (in the order made) before `used` is used: a loaded server could accept them later.
        poll(lambda: len(protocol.held) == 4, 10, "the server to hold the four connections")  # type: ignore[attr-defined]
        used.sendall(GET)  # made first, but used since: the others are idler
        assert read_response(used).startswith(b"HTTP/1.1 200 ")
        newcomer = connect(address, GET)  # the fifth: the one idle longest goes for it
        assert read_response(newcomer).startswith(b"HTTP/1.1 200 ")
        poll(lambda: closed(idle[0]), 10, "the connection idle longest to be closed")
        assert not closed(idle[1]) and not closed(idle[2])
        used.sendall(GET)
        assert read_response(used).startswith(b"HTTP/1.1 200 ")


def test_a_connection_with_a_request_in_the_app_is_never_closed_for_room(implementation):
    app = Counting(echo_length)
    with serving(capped(implementation(LONG), 2), app) as address:
        busy = connect(address, POSTING)
        poll(lambda: app.calls == 1, 10, "the request to reach the app")
        idle = connect(address)
        newcomer = connect(address, GET)
        assert read_response(newcomer).startswith(b"HTTP/1.1 200 ")
        poll(lambda: closed(idle), 10, "the idle connection to be closed")
        busy.sendall(b"defghij")
        assert read_response(busy).startswith(b"HTTP/1.1 200 ")


def test_when_every_other_connection_is_busy_the_new_one_is_closed(implementation):
    app = Counting(echo_length)
    with serving(capped(implementation(LONG), 2), app) as address:
        busy = [connect(address, POSTING) for _ in range(2)]
        poll(lambda: app.calls == 2, 10, "both requests to reach the app")
        refused = connect(address, GET)
        try:
            assert read_all(refused) == b"", "closed without an answer"
        except ConnectionResetError:
            pass  # closed with the request unread: as much a refusal
        for c in busy:
            c.sendall(b"defghij")
            assert read_response(c).startswith(b"HTTP/1.1 200 ")


def test_requests_past_the_limit_are_503_connections_are_not_counted_and_healthz_always_answers(implementation):
    with serving(implementation(LONG), app=Admission(echo_length, 2)) as address:
        idle = [connect(address) for _ in range(10)]
        assert read_response(connect(address, GET)).startswith(b"HTTP/1.1 200 "), "idle connections are no requests"
        busy = [connect(address, POSTING) for _ in range(2)]

        def refused() -> bool:
            return read_all(connect(address, GET)).startswith(b"HTTP/1.1 503 ")

        poll(refused, 10, "a third request to be refused")
        health = connect(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(health).startswith(b"HTTP/1.1 200 ")
        for c in busy:
            c.sendall(b"defghij")
            assert read_response(c).startswith(b"HTTP/1.1 200 ")
        assert read_response(connect(address, GET)).startswith(b"HTTP/1.1 200 ")
        assert not any(closed(c) for c in idle)


@pytest.mark.parametrize(
    ("soft", "hard", "raised", "held"),
    [
        (1024, 1_000_000, 4096 + 1024, 4096),  # raised to fit
        (1024, 1024, None, 768),  # cannot be: most of it still goes to connections
        (100_000, 100_000, None, 4096),  # already enough
    ],
)
def test_the_open_file_limit_is_raised_to_hold_the_connections(monkeypatch, soft, hard, raised, held):
    calls = []
    monkeypatch.setattr(connections.resource, "getrlimit", lambda _: (soft, hard))
    monkeypatch.setattr(connections.resource, "setrlimit", lambda _, limits: calls.append(limits))
    assert open_files_for(4096) == held
    assert calls == ([] if raised is None else [(raised, hard)])
