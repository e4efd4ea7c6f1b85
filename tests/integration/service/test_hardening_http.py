"""What the adversarial run found, each case against the real `h3core serve` over a socket:
cross-site writes and DNS rebinding, streams that never end, 500s, idempotency under
concurrency, the protocol details, readiness and metrics exposure."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.events import Admitted, Artifact, Done, Running
from tests.factories import submitted
from tests.integration.service.conftest import SMALL, cancel_quietly, free_port, long_job, submit, wait_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

EVIL = "https://evil.example"
BODY = json.dumps({"prompt": "a forged fox", **SMALL, "steps": 1})


@pytest.fixture(scope="module")
def done_job(api_server) -> dict:
    with api_server.client() as client:
        return wait_job(client, submit(client, prompt="a finished fox [fake step=0]", steps=1)["id"], ("done",))


def count(api) -> int:
    return len(api.get("/v1/jobs", params={"limit": 500}).json()["items"])


# -- 1. cross-site requests and DNS rebinding (no tokens) -------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain", "Origin": EVIL},
        {"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL},
        {"Content-Type": "application/json", "Origin": EVIL},
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
    ],
    ids=["text-evil", "form-evil", "json-evil", "text", "form", "multipart"],
)
def test_a_page_on_another_site_cannot_submit_a_job(api, headers):
    before = count(api)
    r = api.post("/v1/jobs", content=BODY, headers=headers)
    assert r.status_code == (403 if "Origin" in headers else 415), r.text
    assert r.json()["errors"][0]["field"] == ("Origin" if "Origin" in headers else "Content-Type")
    assert count(api) == before, "nothing was queued"


def test_a_page_on_another_site_cannot_cancel_a_job(api):
    job = long_job(api)
    r = api.post(f"/v1/jobs/{job['id']}/cancel", headers={"Origin": EVIL})  # no body: a "simple" request
    assert r.status_code == 403, r.text
    assert r.headers.get("access-control-allow-origin") is None
    r = api.post(f"/v1/jobs/{job['id']}/cancel", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415, r.text
    assert api.get(f"/v1/jobs/{job['id']}").json()["cancel_requested"] is False
    cancel_quietly(api, job["id"])


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/ceilings", "/readyz", "/metrics", "/schema/openapi.json", "/healthz"])
def test_a_rebound_name_reads_nothing(api, done_job, path):
    for host in ("attacker.example", "attacker.example:8100", "127.0.0.1.evil.example"):
        r = api.get(path, headers={"Host": host})
        assert r.status_code == 400, (host, r.text)
        assert "Host" in r.json()["detail"] and done_job["id"] not in r.text


def test_loopback_names_and_the_same_origin_are_answered(api_server, api):
    port = api_server.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.2", "LOCALHOST"):
        assert api.get("/v1/jobs", headers={"Host": host}).status_code == 200, host
    # The Swagger UI at /schema posts from the service's own origin.
    r = api.post("/v1/jobs", content=BODY, headers={"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}"})
    assert r.status_code == 201, r.text
    r = api.post("/v1/jobs", content=BODY, headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 201, r.text


def test_configured_origins_hosts_and_a_metrics_listener(servers):
    console = "http://console.lan:3000"
    metrics_port = free_port()
    server = servers.make(
        {"H3_CORS_ORIGINS": console, "H3_ALLOWED_HOSTS": "h3.lan"}, args=("--metrics-port", str(metrics_port))
    ).start()
    with server.client() as c:
        preflight = c.options(
            "/v1/jobs",
            headers={
                "Origin": console,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,idempotency-key",
            },
        )
        assert preflight.status_code in (200, 204), preflight.text
        assert preflight.headers["access-control-allow-origin"] == console
        r = c.post("/v1/jobs", content=BODY, headers={"Content-Type": "application/json", "Origin": console})
        assert r.status_code == 201, r.text
        assert r.headers["access-control-allow-origin"] == console
        assert "location" in r.headers["access-control-expose-headers"].lower()
        assert c.post("/v1/jobs", content=BODY, headers={"Content-Type": "application/json", "Origin": EVIL}).status_code == 403
        assert c.get("/v1/jobs", headers={"Host": "h3.lan:8100"}).status_code == 200
        assert c.get("/v1/jobs", headers={"Host": "attacker.example"}).status_code == 400

        # /metrics moved to its own listener (loopback by default), with the same Host rule.
        assert c.get("/metrics").status_code == 404
        m = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        assert m.status_code == 200 and "h3core_jobs{" in m.text
        assert (
            httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", headers={"Host": "evil.example"}, timeout=10).status_code == 400
        )
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/v1/jobs", timeout=10).status_code == 404
    server.stop()


def test_a_metrics_port_that_is_taken_stops_serve_saying_so(servers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = servers.make(args=("--metrics-port", str(taken.getsockname()[1])))
        server.launch()
        assert server.wait(60) == 2, server.log()
    assert "cannot listen for /metrics on 127.0.0.1" in server.log()


def test_with_tokens_bodies_must_still_be_json_and_readyz_tells_strangers_only_the_status(servers):
    token = "tok-hardening-0000000"
    server = servers.start({"H3_API_TOKENS": token, "H3_ROLE": "api"})  # no runner process: not ready
    auth = {"Authorization": f"Bearer {token}"}
    with server.client() as c:
        stranger = c.get("/readyz")
        assert stranger.status_code == 503 and stranger.json() == {"status": "not ready"}, stranger.text
        insider = c.get("/readyz", headers=auth)
        assert insider.status_code == 503 and "runner.lock" in insider.json()["runner"], insider.text
        r = c.post("/v1/jobs", content=BODY, headers={**auth, "Content-Type": "text/plain"})
        assert r.status_code == 415, r.text
        assert c.post("/v1/jobs", content=BODY, headers={**auth, "Content-Type": "application/json"}).status_code == 201
        # With tokens a rebound name gains nothing without one: the Host list applies only when set.
        assert c.get("/v1/jobs", headers={**auth, "Host": "h3.example.org"}).status_code == 200
        assert c.get("/v1/jobs", headers={"Host": "h3.example.org"}).status_code == 401
    server.stop()


# -- 2. streams end ------------------------------------------------------------------------------


def test_a_finished_jobs_stream_ends_at_once_whatever_last_event_id_says(api, done_job):
    last = api.get(f"/v1/jobs/{done_job['id']}/events").json()[-1]["seq"]
    for lei in (last, last + 1, 10**12, 2**63 - 1):
        r = api.get(f"/v1/jobs/{done_job['id']}/stream", headers={"Last-Event-ID": str(lei)})
        assert r.status_code == 204 and r.content == b"", (lei, r.status_code)
    r = api.get(f"/v1/jobs/{done_job['id']}/stream", headers={"Last-Event-ID": str(last - 1)})
    assert r.status_code == 200
    assert [line for line in r.text.splitlines() if line.startswith("id:")] == [f"id: {last}"]


def test_a_stream_past_the_end_of_a_running_job_still_ends_with_it(api, api_server):
    job = long_job(api)
    wait_job(api, job["id"], ("running",))
    seen: list[str] = []
    connected = threading.Event()

    def follow() -> None:
        with httpx.Client(base_url=api_server.url, timeout=30) as c:
            with c.stream("GET", f"/v1/jobs/{job['id']}/stream", headers={"Last-Event-ID": str(10**9)}) as r:
                assert r.status_code == 200
                connected.set()
                seen.extend(line for line in r.iter_lines() if line.startswith("event:"))

    reader = threading.Thread(target=follow)
    reader.start()
    assert connected.wait(30), "the stream did not start"
    api.post(f"/v1/jobs/{job['id']}/cancel")
    reader.join(30)
    assert not reader.is_alive(), "the stream did not end with the job"
    assert seen and seen[-1] == "event: cancelled", seen


# -- 3. no 500s ----------------------------------------------------------------------------------


@pytest.mark.parametrize("lei", ["9223372036854775808", "-1", "abc", "9" * 400])
def test_a_last_event_id_out_of_range_is_422_naming_it(api, done_job, lei):
    r = api.get(f"/v1/jobs/{done_job['id']}/stream", headers={"Last-Event-ID": lei})
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["Last-Event-ID"]


def test_ranges_are_checked_or_ignored_as_rfc_9110_says(api, done_job):
    url, size = done_job["artifact"]["url"], done_job["artifact"]["bytes"]
    huge = "9" * 4301
    r = api.get(url, headers={"Range": f"bytes={huge}-"})
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{size}"
    r = api.get(url, headers={"Range": f"bytes=10-{huge}"})
    assert r.status_code == 206 and r.headers["content-range"] == f"bytes 10-{size - 1}/{size}"
    r = api.get(url, headers={"Range": f"bytes=-{huge}"})
    assert r.status_code == 206 and len(r.content) == size
    r = api.get(url, headers={"Range": "bytes=5-3"})  # invalid: ignored, the whole file
    assert r.status_code == 200 and len(r.content) == size
    etag = api.head(url).headers["etag"]
    r = api.get(url, headers={"Range": "bytes=0-3", "If-Range": '"stale"'})
    assert r.status_code == 200 and len(r.content) == size
    r = api.get(url, headers={"Range": "bytes=0-3", "If-Range": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert r.status_code == 200 and len(r.content) == size
    r = api.get(url, headers={"Range": "bytes=0-3", "If-Range": etag})
    assert r.status_code == 206 and len(r.content) == 4


def test_head_on_a_video_gives_its_headers_and_no_body(api, done_job):
    url, size = done_job["artifact"]["url"], done_job["artifact"]["bytes"]
    r = api.head(url)
    assert r.status_code == 200 and r.content == b""
    assert int(r.headers["content-length"]) == size and r.headers["etag"] == f'"{done_job["artifact"]["sha256"]}"'
    assert r.headers["content-type"] == "video/mp4" and r.headers["accept-ranges"] == "bytes"
    r = api.head(url, headers={"Range": "bytes=0-9"})
    assert r.status_code == 206 and r.headers["content-range"] == f"bytes 0-9/{size}" and r.headers["content-length"] == "10"
    assert api.head("/v1/jobs/nope/video").status_code == 404


@pytest.mark.parametrize("depth", [2000, 100_000])
def test_a_deeply_nested_body_is_400(api, depth):
    r = api.post("/v1/jobs", content="[" * depth + "]" * depth, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nested" in r.json()["detail"]
    nested = '{"prompt": "x", "extra": ' + "[" * 500 + "]" * 500 + "}"
    r = api.post("/v1/jobs", content=nested, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text


def test_an_empty_body_is_422_saying_a_body_is_required(api):
    r = api.post("/v1/jobs", content=b"", headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [{"field": "body", "message": "a JSON body is required"}]


def _done_with(db, job_id: str, path: str) -> None:
    """A done job whose recorded video is `path` (a store written by hand, or a file since lost)."""
    store = SQLiteEventStore(db, durable=False)
    try:
        artifact = Artifact(path=path, bytes=100, sha256="0" * 64, frames=24, duration_s=1.0)
        store.append(job_id, [submitted(), Admitted(), Running(attempt=1, executor="fake"), Done(artifact=artifact)])
    finally:
        store.close()


@pytest.mark.parametrize(
    ("path", "status"),
    [("gone/attempt-1.mp4", 410), ("/etc/passwd", 404), ("../..", 404), ("../../etc/passwd", 404), (".", 410), ("", 410)],
    ids=["missing", "absolute", "parent", "escape", "dot", "empty"],
)
def test_every_artifact_problem_is_a_4xx_with_a_message(api, api_server, path, status):
    job_id = f"bad{abs(hash(path)) % 10**8}x{time.monotonic_ns()}"
    _done_with(api_server.db, job_id, path)
    for method in ("GET", "HEAD"):
        r = api.request(method, f"/v1/jobs/{job_id}/video")
        assert r.status_code == status, (method, r.status_code, r.text)
        assert "root:" not in r.text
    assert api.get(f"/v1/jobs/{job_id}/video").json()["detail"]


def test_a_video_whose_file_changed_since_it_was_recorded_is_410(api, api_server, done_job):
    (api_server.artifacts / done_job["artifact"]["url"].split("/")[3] / "attempt-1.mp4").write_bytes(b"not the video")
    r = api.get(done_job["artifact"]["url"])
    assert r.status_code == 410 and "13 bytes" in r.json()["detail"], r.text


# -- 5. protocol -----------------------------------------------------------------------------------


def test_concurrent_repeats_of_an_idempotency_key_get_one_201(api_server):
    key = f"race-{time.monotonic_ns()}"
    n = 12
    gate = threading.Barrier(n)

    def post(_: int) -> httpx.Response:
        with httpx.Client(base_url=api_server.url, timeout=30) as c:
            gate.wait()
            return c.post("/v1/jobs", content=BODY, headers={"Content-Type": "application/json", "Idempotency-Key": key})

    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(post, range(n)))
    assert sorted(r.status_code for r in answers) == [200] * (n - 1) + [201], [r.text for r in answers]
    assert len({r.json()["id"] for r in answers}) == 1


def test_options_lists_every_method_of_a_path(api, done_job):
    assert set(api.options("/v1/jobs").headers["allow"].split(", ")) == {"GET", "POST", "OPTIONS"}
    assert set(api.options(done_job["artifact"]["url"]).headers["allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}


def test_the_document_describes_the_stream_and_refuses_what_the_server_refuses(api):
    doc = api.get("/schema/openapi.json").json()
    stream = doc["paths"]["/v1/jobs/{job_id}/stream"]["get"]["responses"]
    assert list(stream["200"]["content"]) == ["text/event-stream"] and "204" in stream
    create = doc["components"]["schemas"]["JobCreate"]
    assert create["additionalProperties"] is False
    assert create["properties"]["seed"]["maximum"] == 2**63 - 1
    lei = next(p for p in doc["paths"]["/v1/jobs/{job_id}/stream"]["get"]["parameters"] if p["name"] == "Last-Event-ID")
    assert (lei["schema"]["minimum"], lei["schema"]["maximum"]) == (0, 2**63 - 1)


# -- 6. headers as a client other than httpx sends them --------------------------------------------


def raw(api_server, request: bytes) -> tuple[int, dict]:
    """Send `request` as it is over a socket (httpx would merge repeated headers); the status and JSON body."""
    with socket.create_connection(("127.0.0.1", api_server.port), timeout=30) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body) if body else {}


@pytest.mark.parametrize(
    ("headers", "name"),
    [
        (b"Host: 127.0.0.1\r\nHost: evil.example\r\n", "Host"),
        (b"Host: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Type: text/plain\r\n", "Content-Type"),
        (b"Host: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Type: application/json\r\n", "Content-Type"),
    ],
    ids=["host", "json-then-text", "text-then-json"],
)
def test_a_header_the_guard_reads_given_twice_is_400_naming_it(api, api_server, headers, name):
    before = count(api)
    body = BODY.encode()
    request = b"POST /v1/jobs HTTP/1.1\r\n" + headers + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    status, problem = raw(api_server, request)
    assert status == 400 and problem["errors"][0]["field"] == name and "more than once" in problem["detail"], problem
    assert count(api) == before, "nothing was queued"


def test_an_absolute_form_targets_host_is_judged_not_the_host_header(api_server, done_job):
    """RFC 9112 §3.2.2: the target's authority replaces Host, so the allowed-hosts check judges it."""
    status, problem = raw(api_server, b"GET http://evil.example/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert status == 400 and problem["errors"][0]["field"] == "Host" and "evil.example" in problem["detail"], problem
    target = b"http://127.0.0.1:%d/v1/jobs/%s" % (api_server.port, done_job["id"].encode())
    status, job = raw(api_server, b"GET " + target + b" HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
    assert status == 200 and job["id"] == done_job["id"], job


def test_aiohttps_bodiless_cancel_is_taken(api, api_server):
    """aiohttp sends `Content-Type: application/octet-stream` and `Content-Length: 0` with no body."""
    import asyncio

    import aiohttp

    job = long_job(api)

    async def cancel() -> tuple[int, dict, str | None]:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{api_server.url}/v1/jobs/{job['id']}/cancel") as r:
                return r.status, await r.json(), r.request_info.headers.get("Content-Type")

    status, view, sent = asyncio.run(cancel())
    assert sent == "application/octet-stream"  # what the guard once refused (415)
    # A job still queued is cancelled at once; a running one has its cancel requested.
    assert status == 202 and (view["status"] == "cancelled" or view["cancel_requested"] is True), view
    wait_job(api, job["id"], ("cancelled",))
