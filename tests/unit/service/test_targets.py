"""An absolute-form request target's host is the request's host (RFC 9112 §3.2.2), on both of
uvicorn's HTTP implementations: the allowed-hosts check judges it, whatever `Host` says."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from h3core.service.crosssite import CrossSiteGuard, CrossSitePolicy
from h3core.service.deadlines import ReadLimits
from h3core.service.targets import absolute_form, with_authority
from tests.unit.service.test_deadlines import read_all, serving


async def echo_request(scope, receive, send):
    """Answers the path, query and Host the application saw, as JSON."""
    host = [v.decode() for k, v in scope["headers"] if k == b"host"]
    body = json.dumps({"path": scope["path"], "query": scope["query_string"].decode(), "host": host}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server(implementation) -> Iterator[tuple[str, int]]:
    guarded = CrossSiteGuard(CrossSitePolicy(frozenset()))(echo_request)  # loopback names only
    with serving(with_authority(implementation(ReadLimits())), app=guarded) as address:
        yield address


def ask(address: tuple[str, int], target: bytes, host: bytes = b"127.0.0.1") -> tuple[int, dict]:
    with socket.create_connection(address) as conn:
        conn.sendall(b"GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (target, host))
        head, _, body = read_all(conn).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_an_absolute_form_targets_host_is_judged_not_the_host_header(server):
    status, answer = ask(server, b"http://evil.example/v1/jobs")
    assert status == 400 and answer["errors"][0]["field"] == "Host" and "evil.example" in answer["detail"], answer
    status, answer = ask(server, b"http://evil.example:8100/v1/jobs?limit=1")
    assert status == 400 and "evil.example:8100" in answer["detail"], answer


def test_an_absolute_form_target_on_an_answered_host_is_served_as_its_path(server):
    status, answer = ask(server, b"http://127.0.0.1:8100/v1/jobs?limit=1", host=b"evil.example")
    assert status == 200 and answer == {"path": "/v1/jobs", "query": "limit=1", "host": ["127.0.0.1:8100"]}
    status, answer = ask(server, b"/v1/jobs")
    assert status == 200 and answer == {"path": "/v1/jobs", "query": "", "host": ["127.0.0.1"]}


def test_absolute_form_splits_the_authority_from_the_origin_form_target():
    assert absolute_form(b"http://evil.example/v1/jobs") == (b"evil.example", b"/v1/jobs")
    assert absolute_form(b"https://h:1/a?b=c") == (b"h:1", b"/a?b=c")
    assert absolute_form(b"http://h?x=1") == (b"h", b"/?x=1")
    assert absolute_form(b"/v1/jobs?next=http://x") is None and absolute_form(b"*") is None
