"""Slow clients against a real server: a request that arrives too slowly is cut off (headers
answered 408, a trickled body closed), before the token check; a slow but steady upload goes
through; requests beyond the limit are refused, idle connections are not counted (issue 38); a
stop does not wait on a stalled upload."""

from __future__ import annotations

import resource
import socket
import time

import httpx
import pytest

from tests.factories import png
from tests.integration.service.conftest import Servers, poll

pytestmark = pytest.mark.timeout(120)

TOKEN = "t" * 32
FAST = {"H3_HEADER_TIMEOUT": "2", "H3_BODY_TIMEOUT": "2", "H3_MIN_REQUEST_RATE": "500", "H3_API_TOKENS": TOKEN}


class Client:
    """A raw connection that sends what a test tells it and keeps what the server answers."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.setblocking(False)
        self.received = b""
        self.ended = False

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass  # the server closed it: `closed` says so

    def closed(self) -> bool:
        """Whether the server has closed the connection (what it sent is in `received`)."""
        while not self.ended:
            try:
                chunk = self.sock.recv(65536)
            except BlockingIOError:
                return False
            except ConnectionResetError:
                chunk = b""
            self.received += chunk
            self.ended = not chunk
        return True

    def close(self) -> None:
        self.sock.close()


def test_fifty_connections_stopped_mid_headers_are_answered_408_and_closed(servers: Servers):
    server = servers.start(FAST)
    clients = [Client(server.url) for _ in range(50)]
    for c in clients:
        c.send(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
    # Bounded by the 2 s deadline, not by the clients (the attack held them past 103 s).
    poll(lambda: all(c.closed() for c in clients), 30, "every slow one to be closed")
    assert all(c.received.startswith(b"HTTP/1.1 408 ") for c in clients), clients[0].received
    assert b"headers did not arrive in time" in clients[0].received
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        assert api.get("/v1/jobs").status_code == 200, "the server serves on"
    for c in clients:
        c.close()


def test_a_trickled_body_is_cut_off_and_a_slow_but_steady_upload_goes_through(servers: Servers):
    server = servers.start(FAST)
    head = (
        f"POST /v1/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: image/png\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    trickles = [Client(server.url) for _ in range(20)]
    for c in trickles:
        c.send(head + png()[:8])

    def trickle_until_closed() -> bool:
        for c in trickles:
            if not c.closed():
                c.send(b"\x00")  # a byte at a time: far under 500 bytes a second
        return all(c.closed() for c in trickles)

    poll(trickle_until_closed, 30, "every trickled upload to be cut off")
    for c in trickles:
        c.close()
    # The server closes a connection before its handler's cleanup has run: wait for that too.
    poll(lambda: not list(server.uploads.glob("u_*")), 30, "nothing of them to be left in the upload store")

    data = png(640, 480)  # ~900 KB: about 2 s at the pace below, so the body deadline is passed
    host, port = server.url.removeprefix("http://").split(":")
    steady = socket.create_connection((host, int(port)), timeout=30)
    steady.sendall(head.replace(b"100000", str(len(data)).encode()))
    for i in range(0, len(data), 64 * 1024):  # 64 KiB every 0.15 s: slow, far above 500 bytes a second
        steady.sendall(data[i : i + 64 * 1024])
        time.sleep(0.15)  # the pace of a slow client: the stimulus, not a wait for the server
    steady.settimeout(30)
    answer = steady.recv(65536)
    assert answer.startswith(b"HTTP/1.1 201 "), answer[:200]
    steady.close()


def open_files_for(n: int) -> int:
    """Raise this process's open-file limit (the server, started after, inherits it) to hold `n`
    sockets and some to spare, as far as the hard limit goes; how many sockets it allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = n + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return n if soft == resource.RLIM_INFINITY else min(n, soft - 256)


def test_a_thousand_idle_connections_leave_healthz_and_the_api_answering(servers: Servers):
    """Issue 38: 600 connections that sent nothing made every request 503 for the 20 s the header
    deadline gave them (uvicorn's limit counted them). Idle ones must not take the service down."""
    n = open_files_for(1000)
    assert n >= 600, f"the open-file limit allows only {n} sockets"
    # Deadlines longer than the test: every idle connection is still open while the requests are made.
    server = servers.start({"H3_HEADER_TIMEOUT": "120", "H3_KEEP_ALIVE_TIMEOUT": "120"})
    host, port = server.url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(n)]
    try:
        # A connection made after them is accepted after them (the listen queue is FIFO): the
        # server holds all n when these requests arrive.
        with httpx.Client(base_url=server.url, timeout=30) as api:
            for path in ("/healthz", "/v1/jobs?limit=1", "/healthz"):
                r = api.get(path)
                assert r.status_code == 200, f"GET {path} with {n} idle connections open: {r.status_code} {r.text}"
        for s in idle:
            s.setblocking(False)
            try:
                assert s.recv(1) != b"", "an idle connection was closed by the server"  # pragma: no cover
            except BlockingIOError:
                pass  # still open, nothing sent: as it should be
    finally:
        for s in idle:
            s.close()


def test_requests_beyond_the_limit_are_answered_503_and_healthz_still_200(servers: Servers):
    server = servers.start({"H3_MAX_CONNECTIONS": "4"})
    jobs = f"{server.url}/v1/jobs"
    idle = [Client(server.url) for _ in range(8)]
    for c in idle[:4]:
        c.send(b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers not finished: no request yet
    assert httpx.get(jobs, timeout=5).status_code == 200, "connections without a request are not counted"
    uploads = [Client(server.url) for _ in range(4)]
    for c in uploads:  # a body still to come: four requests in the app
        c.send(b"POST /v1/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n")
    poll(lambda: httpx.get(jobs, timeout=5).status_code == 503, 20, "a fifth request refused")
    assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200, "the liveness probe is never refused"
    for c in uploads + idle:
        c.close()
    poll(lambda: httpx.get(jobs, timeout=5).status_code == 200, 20, "the server to take requests again")


def test_a_stop_does_not_wait_on_a_stalled_upload(servers: Servers):
    server = servers.start()  # the default deadlines (20 s): the stop must not wait them out
    stalled = Client(server.url)
    stalled.send(b"POST /v1/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n")
    stalled.send(png()[:100])
    poll(lambda: list(server.uploads.glob("u_*.part")), 20, "the upload to be under way")
    server.stop(timeout=10)
    assert stalled.closed()
    stalled.close()
