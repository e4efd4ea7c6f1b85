"""The webhook-transport contract as tests, for any `h3core.adapters.webhooks.WebhookTransport`.

The tests post to two receivers on one port, at `FIRST` and `SECOND` (loopback addresses), and
read what each received. Subclass `WebhookTransportContract` and override its `transport`
fixture to give a fresh transport that reaches the `receivers` fixture's; by default those are
`LoopbackReceivers`, real HTTP servers on loopback (and an https one at `FIRST` whose certificate
names `TLS_NAME`, where openssl is on PATH: trust `receivers.client_tls`):

    class TestMyTransport(WebhookTransportContract):
        @pytest.fixture
        def transport(self, receivers):
            return MyTransport(ssl_context=receivers.client_tls)

A transport that reaches no network (a fake) overrides `receivers` too, with anything that keeps
the `Receivers` protocol. h3core's own suite runs it against `HttpPostClient` on loopback and
`MemoryTransport` with simulated receivers. Needs pytest and anyio's pytest plugin.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

import pytest

from h3core.adapters.webhooks.base import PostFailed, WebhookTransport

__all__ = [
    "FIRST",
    "SECOND",
    "TLS_NAME",
    "LoopbackReceivers",
    "Received",
    "Receivers",
    "ScriptedAnswers",
    "WebhookTransportContract",
]

FIRST, SECOND = "127.0.0.2", "127.0.0.3"  # the receivers' addresses: one port, two hosts
TLS_NAME = "hooks.example"  # the only name the https receiver's certificate bears
NOWHERE = "hooks.invalid"  # a name that resolves nowhere (RFC 6761): a post that reaches anything did not look it up
HEADERS = [("content-type", "application/json"), ("webhook-id", "msg_1"), ("x-b", "2"), ("x-a", "1")]


@dataclass(frozen=True)
class Received:
    """One request a receiver read: its target (path and query), headers in order (names
    lower-cased) and body."""

    target: str
    headers: list[tuple[str, str]]
    body: bytes


class Receivers(Protocol):
    """Receivers at `FIRST` and `SECOND` on `port` that the transport under test reaches; nothing
    listens on `closed_port`. `tls_port`: an https receiver at `FIRST` whose certificate names
    `TLS_NAME`, trusted by `client_tls` (both None where there is none)."""

    port: int
    closed_port: int
    tls_port: int | None
    client_tls: ssl.SSLContext | None

    def answer(self, address: str, *answers: int | None) -> None:
        """Queue how the receiver at `address` answers its next requests: a status, or None (it
        reads the request and closes the connection without a word); 204 past them."""
        ...

    def received(self, address: str) -> list[Received]:
        """What the receiver at `address` read, in order."""
        ...


class ScriptedAnswers:
    """The answers queued per address and the requests read per address, under a lock (the
    receivers' threads read them): what every `Receivers` keeps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: defaultdict[str, deque[int | None]] = defaultdict(deque)
        self._got: defaultdict[str, list[Received]] = defaultdict(list)

    def answer(self, address: str, *answers: int | None) -> None:
        """Queue the next answers of the receiver at `address`."""
        with self._lock:
            self._answers[address].extend(answers)

    def received(self, address: str) -> list[Received]:
        """What the receiver at `address` read, in order."""
        with self._lock:
            return list(self._got[address])

    def take(self, address: str, request: Received) -> int | None:
        """Record `request` at `address`; the answer it gets (None: none)."""
        with self._lock:
            self._got[address].append(request)
            queue = self._answers[address]
            return queue.popleft() if queue else 204


@cache
def _certificate() -> tuple[Path, Path, tempfile.TemporaryDirectory[str]] | None:
    """A self-signed certificate for `TLS_NAME` and its key (openssl), made once, in a folder
    removed at exit (held by the cache); None without openssl."""
    if shutil.which("openssl") is None:
        return None
    folder = tempfile.TemporaryDirectory(prefix="h3-webhook-tls-")
    cert, key = Path(folder.name) / "cert.pem", Path(folder.name) / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]
        + ["-subj", f"/CN={TLS_NAME}", "-addext", f"subjectAltName=DNS:{TLS_NAME}", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key, folder


class LoopbackReceivers(ScriptedAnswers):
    """Real HTTP/1.0 receivers on loopback, each a server thread (see `Receivers`): at `FIRST` and
    `SECOND` on one port, an https one at `FIRST` where openssl is on PATH. A 3xx answer carries a
    `location` at `SECOND`, which a transport must not follow. Use it as a context manager."""

    def __init__(self) -> None:
        super().__init__()
        self._servers: list[ThreadingHTTPServer] = []
        self.port = 0
        self.closed_port = 0
        self.tls_port: int | None = None
        self.client_tls: ssl.SSLContext | None = None

    def __enter__(self) -> LoopbackReceivers:
        for _ in range(20):  # the port free at FIRST may be taken at SECOND: another
            first = self._server(FIRST, 0)
            try:
                second = self._server(SECOND, first.server_address[1])
            except OSError:
                first.server_close()
                continue
            self._servers += [first, second]
            self.port = first.server_address[1]
            break
        else:
            raise OSError(f"no port free at both {FIRST} and {SECOND}")
        with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
            probe.bind((FIRST, 0))
            self.closed_port = probe.getsockname()[1]
        made = _certificate()
        if made is not None:
            cert, key, _ = made
            server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server_tls.load_cert_chain(cert, key)
            secure = self._server(FIRST, 0)
            secure.socket = server_tls.wrap_socket(secure.socket, server_side=True)
            self._servers.append(secure)
            self.tls_port = secure.server_address[1]
            self.client_tls = ssl.create_default_context(cafile=str(cert))
        for server in self._servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _server(self, address: str, port: int) -> ThreadingHTTPServer:
        answers = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = [(k.lower(), v) for k, v in self.headers.items()]
                status = answers.take(address, Received(self.path, headers, body))
                if status is None:
                    return  # HTTP/1.0: the connection closes with no answer written
                self.send_response(status)
                if 300 <= status < 400:  # somewhere a transport that followed it would be seen
                    self.send_header("location", f"http://{SECOND}:{self.connection.getsockname()[1]}/elsewhere")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return ThreadingHTTPServer((address, port), Handler)


@pytest.mark.anyio
class WebhookTransportContract:
    """What every webhook transport must do (the contract in `h3core.adapters.webhooks.base`)."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def receivers(self) -> Iterator[Receivers]:
        with LoopbackReceivers() as receivers:
            yield receivers

    @pytest.fixture
    def transport(self, receivers: Receivers) -> WebhookTransport:
        raise NotImplementedError("override the `transport` fixture: return a fresh transport that reaches `receivers`")

    async def test_it_is_a_webhook_transport(self, transport):
        assert isinstance(transport, WebhookTransport)

    # The checked address, never a lookup.

    async def test_a_post_goes_to_the_address_given_and_never_to_a_lookup_of_the_name(self, transport, receivers):
        url = f"http://{NOWHERE}:{receivers.port}/hook"
        assert await transport.post(url, HEADERS, b"{}", address=FIRST) == 204
        assert [r.target for r in receivers.received(FIRST)] == ["/hook"] and receivers.received(SECOND) == []
        assert await transport.post(url, HEADERS, b"{}", address=SECOND) == 204
        assert len(receivers.received(FIRST)) == 1 and len(receivers.received(SECOND)) == 1
        [got] = receivers.received(SECOND)
        assert dict(got.headers)["host"] == f"{NOWHERE}:{receivers.port}", "the name, as the URL says it"
        await transport.aclose()

    async def test_an_address_that_is_no_ip_address_is_refused_before_anything_is_sent(self, transport, receivers):
        for address in ("localhost", NOWHERE, "", f"{FIRST}:{receivers.port}", f"{FIRST}.nip.io"):
            with pytest.raises(ValueError):
                await transport.post(f"http://{FIRST}:{receivers.port}/hook", HEADERS, b"{}", address=address)
        assert receivers.received(FIRST) == [] and receivers.received(SECOND) == []
        await transport.aclose()

    # One request, as given.

    async def test_one_request_goes_as_given_between_host_and_content_length(self, transport, receivers):
        body = b'{"type": "job.done"}'
        await transport.post(f"http://{NOWHERE}:{receivers.port}/hooks/in?a=1&b=2", HEADERS, body, address=FIRST)
        await transport.post(f"http://{NOWHERE}:{receivers.port}", [], b"", address=FIRST)
        first, second = receivers.received(FIRST)
        host = ("host", f"{NOWHERE}:{receivers.port}")
        assert (first.target, first.body) == ("/hooks/in?a=1&b=2", body)
        assert first.headers == [host, *HEADERS, ("content-length", str(len(body)))]
        assert (second.target, second.headers, second.body) == ("/", [host, ("content-length", "0")], b"")
        await transport.aclose()

    async def test_headers_naming_host_or_content_length_and_urls_not_http_are_refused(self, transport, receivers):
        url = f"http://{FIRST}:{receivers.port}/hook"
        for headers in ([("Host", "elsewhere.example")], [*HEADERS, ("content-length", "2")], [("CONTENT-LENGTH", "2")]):
            with pytest.raises(ValueError):
                await transport.post(url, headers, b"{}", address=FIRST)
        for bad in (f"ftp://{FIRST}:{receivers.port}/hook", f"{FIRST}:{receivers.port}/hook", "http:///hook"):
            with pytest.raises(ValueError):
                await transport.post(bad, HEADERS, b"{}", address=FIRST)
        assert receivers.received(FIRST) == []
        await transport.aclose()

    # The status, whatever it is.

    async def test_the_status_is_returned_whatever_it_is_and_no_redirect_is_followed(self, transport, receivers):
        receivers.answer(FIRST, 200, 302, 404, 500)
        url = f"http://{NOWHERE}:{receivers.port}/hook"
        assert [await transport.post(url, HEADERS, b"{}", address=FIRST) for _ in range(5)] == [200, 302, 404, 500, 204]
        assert len(receivers.received(FIRST)) == 5 and receivers.received(SECOND) == [], "the 302's location is not followed"
        await transport.aclose()

    # No answer is PostFailed.

    async def test_no_answer_is_post_failed_and_the_next_post_is_answered(self, transport, receivers):
        receivers.answer(FIRST, None)
        url = f"http://{NOWHERE}:{receivers.port}/hook"
        with pytest.raises(PostFailed):
            await transport.post(url, HEADERS, b"{}", address=FIRST)
        assert await transport.post(url, HEADERS, b"{}", address=FIRST) == 204
        await transport.aclose()

    async def test_nothing_listening_is_post_failed(self, transport, receivers):
        with pytest.raises(PostFailed):
            await transport.post(f"http://{NOWHERE}:{receivers.closed_port}/hook", HEADERS, b"{}", address=FIRST)
        assert receivers.received(FIRST) == []
        await transport.aclose()

    async def test_https_checks_the_certificate_against_the_url_s_name_at_the_address_given(self, transport, receivers):
        if receivers.tls_port is None:
            pytest.skip("these receivers serve no https")
        assert await transport.post(f"https://{TLS_NAME}:{receivers.tls_port}/hook", HEADERS, b"{}", address=FIRST) == 204
        with pytest.raises(PostFailed):  # the certificate is TLS_NAME's, not this name's
            await transport.post(f"https://other.example:{receivers.tls_port}/hook", HEADERS, b"{}", address=FIRST)
        [got] = receivers.received(FIRST)
        assert dict(got.headers)["host"] == f"{TLS_NAME}:{receivers.tls_port}"
        await transport.aclose()

    # Closing.

    async def test_a_closed_transport_posts_again_afresh(self, transport, receivers):
        url = f"http://{NOWHERE}:{receivers.port}/hook"
        assert await transport.post(url, HEADERS, b"1", address=FIRST) == 204
        await transport.aclose()
        assert await transport.post(url, HEADERS, b"2", address=FIRST) == 204
        await transport.aclose()
        assert [r.body for r in receivers.received(FIRST)] == [b"1", b"2"]
