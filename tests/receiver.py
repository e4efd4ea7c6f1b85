"""A webhook receiver on loopback for the tests: a real HTTP server in a thread that records every
request it gets and answers 500 to the first `fail_first` of them and to any while `down`, 204
to the rest."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: str
    status: int = 204

    @property
    def payload(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    fail_first: int = 0
    down: bool = False
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def answered(self) -> list[Received]:
        """The requests answered 2xx."""
        return [r for r in self.got() if r.status < 300]


@contextmanager
def receiver(
    fail_first: int = 0, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
) -> Iterator[Receiver]:
    box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
            rec = box[0]
            with rec.lock:
                status = 500 if len(rec.requests) < rec.fail_first or rec.down else 204
                rec.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, status))
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    if tls is not None:  # https, with the certificate `tls` holds
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    box.append(Receiver(f"{'https' if tls else 'http'}://{host}:{server.server_address[1]}/hook", fail_first))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box[0]
    finally:
        server.shutdown()
        server.server_close()
