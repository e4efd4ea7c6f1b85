"""Uploads against a real server: an image that declares a huge canvas is refused from its header
(the server's memory does not grow with the canvas), and an upload cut off mid-body leaves no
`.part` behind once the server restarts or `h3core gc --uploads` runs."""

from __future__ import annotations

import signal
import socket
import threading

import httpx
import pytest

from tests.factories import bomb_png, png
from tests.integration.service.conftest import Servers, poll
from tests.integration.service.test_client_cli import h3

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.timeout(120)

MB = 2**20


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return bomb_png(16000, 16000)  # 4.5 MB on the wire, 1 GB decoded


def post(url: str, data: bytes, content_type: str = "image/png") -> httpx.Response:
    return httpx.post(f"{url}/v1/uploads", content=data, headers={"Content-Type": content_type}, timeout=60)


def rss(server) -> int:
    return psutil.Process(server.proc.pid).memory_info().rss


def test_an_image_declaring_a_huge_canvas_is_refused_before_it_is_decoded(servers: Servers, bomb):
    server = servers.start()
    warm = post(server.url, png())  # the upload path warmed up: its imports are done
    assert warm.status_code == 201, warm.text
    before = rss(server)
    answers: list[httpx.Response] = []
    # Four at once, as the attack did (4 GB before): each is refused from its header.
    threads = [threading.Thread(target=lambda: answers.append(post(server.url, bomb))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    grown = rss(server) - before
    assert [a.status_code for a in answers] == [422] * 4, [a.text for a in answers]
    problem = answers[0].json()
    assert problem["limit"] == 4096 * 4096 and problem["errors"][0]["field"] == "body"
    assert problem["detail"] == "the image may have at most 16777216 pixels; it has 256000000", problem
    assert grown < 50 * MB, f"the server grew by {grown / MB:.0f} MB for four refused images"
    kept = {p.name.split(".")[0] for p in server.uploads.glob("u_*")}
    assert kept == {warm.json()["id"]}, "nothing of them was kept"


def test_the_pixel_bound_is_a_setting(servers: Servers):
    server = servers.start({"H3_MAX_UPLOAD_PIXELS": str(64 * 48 - 1)})
    r = post(server.url, png(64, 48))
    assert r.status_code == 422 and r.json()["limit"] == 64 * 48 - 1, r.text
    assert r.json()["detail"] == "the image may have at most 3071 pixels; it has 64 x 48, 3072", r.text
    assert post(server.url, png(63, 48)).status_code == 201


def _cut_off_upload(url: str, sent: int = MB) -> socket.socket:
    """An upload that declares 8 MB and sends `sent` bytes of it, then nothing (the socket stays open)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = f"POST /v1/uploads HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: image/png\r\nContent-Length: {8 * MB}\r\n\r\n"
    sock.sendall(head.encode() + png()[:16] + bytes(sent - 16))
    return sock


def _parts(server) -> list:
    return sorted(server.uploads.glob("u_*.part"))


def test_an_upload_cut_off_by_a_crash_is_removed_at_the_next_start(servers: Servers):
    server = servers.start()
    sock = _cut_off_upload(server.url)
    try:
        poll(lambda: _parts(server) and _parts(server)[0].stat().st_size >= MB, 20, "the upload's part file")
        # Held by the upload in progress: gc beside the running server leaves it alone.
        kept = h3("gc", "--db", str(server.db), "--artifacts", str(server.artifacts), "--uploads", str(server.uploads))
        assert kept.returncode == 0 and "0 cut-off uploads" in kept.stdout, kept.stdout + kept.stderr
        server.signal(signal.SIGKILL)
        server.wait(10)
    finally:
        sock.close()
    [part] = _parts(server)
    server.start()
    assert not part.exists(), "the next start removed the cut-off upload"
    assert "an upload cut off before it was stored" in server.log()


def test_gc_removes_an_upload_cut_off_by_a_crash(servers: Servers):
    server = servers.start()
    sock = _cut_off_upload(server.url)
    try:
        poll(lambda: _parts(server) and _parts(server)[0].stat().st_size >= MB, 20, "the upload's part file")
        server.signal(signal.SIGKILL)
        server.wait(10)
    finally:
        sock.close()
    [part] = _parts(server)
    dry = h3("gc", "--db", str(server.db), "--artifacts", str(server.artifacts), "--uploads", str(server.uploads), "--dry-run")
    assert dry.returncode == 0 and f"would remove {part.name}" in dry.stdout and part.exists(), dry.stdout
    done = h3("gc", "--db", str(server.db), "--artifacts", str(server.artifacts), "--uploads", str(server.uploads))
    assert done.returncode == 0 and f"removed {part.name}" in done.stdout, done.stdout + done.stderr
    assert not part.exists()
