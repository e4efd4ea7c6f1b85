"""Read deadlines on both of uvicorn's HTTP implementations (httptools and h11): slow headers are
answered 408 and closed, a trickled body is closed, a request at a steady pace is served, and a
connection that sends nothing is closed after its idle time."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

uvicorn = pytest.importorskip("uvicorn")

from h3core.service.deadlines import ReadLimits  # noqa: E402
from tests.integration.conftest import poll  # noqa: E402

LIMITS = ReadLimits(header_s=0.5, header_max_s=2.0, body_s=0.5, min_rate=1000.0)


async def echo_length(scope, receive, send):
    """Reads the whole body, answers its length."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def serving(protocol: type, app=echo_length) -> Iterator[tuple[str, int]]:
    """uvicorn with `protocol`, serving `app` on a loopback port in a thread, until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol, lifespan="off", log_level="warning", loop="asyncio")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    poll(lambda: srv.started, 10, "uvicorn to start")
    yield sock.getsockname()
    srv.should_exit = True
    thread.join(10)


@pytest.fixture
def server(implementation) -> Iterator[tuple[str, int]]:
    with serving(implementation(LIMITS)) as address:
        yield address


def read_response(conn: socket.socket) -> bytes:
    """One whole response of `echo_length` (its body's length is in its headers)."""
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
        data.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]
    ):
        data += conn.recv(65536)
    return data


def read_all(conn: socket.socket) -> bytes:
    conn.settimeout(10)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def test_headers_that_stop_coming_are_answered_408_and_closed(server):
    conn = socket.create_connection(server)
    conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert read_all(conn).startswith(b"HTTP/1.1 408 ")


def test_a_connection_that_sends_nothing_is_closed(server):
    conn = socket.create_connection(server)
    assert read_all(conn).startswith(b"HTTP/1.1 408 ")


def test_a_connection_that_sends_nothing_is_closed_after_its_idle_time_not_the_header_deadline(implementation):
    """Issue 38: one that sends nothing holds its socket as long as one between requests may, not
    the header deadline's 20 s; its first byte gives back the time the header deadline allows."""
    limits = ReadLimits(header_s=60.0, header_max_s=60.0, body_s=0.5, min_rate=1000.0, idle_s=0.3)
    with serving(implementation(limits)) as address:
        silent = socket.create_connection(address)
        assert read_all(silent).startswith(b"HTTP/1.1 408 "), "closed well before the 60 s header deadline"
        slow = socket.create_connection(address)
        slow.sendall(b"GET / HTT")
        time.sleep(0.6)  # past the idle time, well within the header deadline: the client's pace
        slow.sendall(b"P/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_all(slow).startswith(b"HTTP/1.1 200 ")


def test_a_trickled_body_is_closed_and_a_steady_one_is_served(server):
    trickle = socket.create_connection(server)
    trickle.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
    trickle.settimeout(10)

    def cut_off() -> bool:
        try:
            trickle.sendall(b"x")  # far under 1000 bytes a second
            trickle.settimeout(0.2)
            return trickle.recv(1) == b""
        except TimeoutError:
            return False
        except OSError:
            return True

    poll(cut_off, 10, "the trickled body to be cut off")

    steady = socket.create_connection(server)
    steady.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 4000\r\n\r\n")
    for _ in range(4):  # 1000 bytes every 0.3 s: past the 0.5 s body deadline, at its pace
        steady.sendall(b"y" * 1000)
        time.sleep(0.3)  # the client's pace: the stimulus, not a wait for the server
    answer = read_all(steady)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n4000"), answer


def test_a_kept_alive_connection_gets_a_new_deadline_per_request(server):
    conn = socket.create_connection(server)
    for _ in range(3):
        conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
        assert read_response(conn).startswith(b"HTTP/1.1 200 ")
        time.sleep(0.3)  # idle between requests, within uvicorn's keep-alive
    conn.sendall(b"GET / HTTP/1.1\r\n")  # then a request that stops mid-headers
    assert read_all(conn).startswith(b"HTTP/1.1 408 ")


def test_requests_on_a_kept_alive_connection_share_one_timer(server, monkeypatch):
    """A request's phases move its deadline later, which the connection's one timer follows when
    it fires: no timer is made (and cancelled) per request and phase, a cost every request paid."""
    from h3core.service import deadlines

    scheduled = []
    schedule = deadlines._Deadline._schedule
    monkeypatch.setattr(deadlines._Deadline, "_schedule", lambda self: scheduled.append(1) or schedule(self))
    conn = socket.create_connection(server)
    for _ in range(20):
        conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
        assert read_response(conn).startswith(b"HTTP/1.1 200 ")
    conn.close()
    assert len(scheduled) <= 2, f"{len(scheduled)} timers for 20 requests on one connection"
