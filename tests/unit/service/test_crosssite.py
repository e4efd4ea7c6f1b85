"""Which Host and Origin values the cross-site guard answers (the HTTP tests drive the rest)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3core.runtime.settings import Settings
from h3core.service.crosssite import CrossSiteGuard, CrossSitePolicy, hostname, well_formed

LOCAL = CrossSitePolicy.of(Settings(), listen_host="127.0.0.1")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8100", "localhost:1", "LocalHost", "[::1]:8100", "::1", "127.9.9.9"])
def test_loopback_hosts_are_answered(host):
    assert LOCAL.host_allowed(host)


@pytest.mark.parametrize(
    "host",
    [None, "", "attacker.example", "attacker.example:8100", "127.0.0.1.evil.example", "localhost.evil", "[::2]:1", "0.0.0.0"],
)
def test_other_hosts_are_not(host):
    assert not LOCAL.host_allowed(host)


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz.-", min_size=1, max_size=30), st.integers(1, 65535))
def test_a_configured_name_is_answered_with_any_port_and_no_other_name_is(name, port):
    policy = CrossSitePolicy.of(Settings(allowed_hosts=["h3.lan"]), listen_host="127.0.0.1")
    assert policy.host_allowed(f"h3.lan:{port}")
    assert policy.host_allowed(f"{name}:{port}") == (name == "h3.lan" or name == "localhost")


def test_with_tokens_the_host_list_applies_only_when_set():
    assert CrossSitePolicy.of(Settings(api_tokens=["t" * 16]), listen_host="0.0.0.0").host_allowed("anything.example")
    named = CrossSitePolicy.of(Settings(api_tokens=["t" * 16], allowed_hosts=["h3.lan"]), listen_host="0.0.0.0")
    assert named.host_allowed("h3.lan") and not named.host_allowed("anything.example")


def test_same_origin_and_listed_origins_only():
    policy = CrossSitePolicy.of(Settings(cors_origins=["http://console.lan:3000"]), listen_host="127.0.0.1")
    ok = {"scheme": "http", "host": "127.0.0.1:8100"}
    assert policy.origin_allowed("http://127.0.0.1:8100", **ok)
    assert policy.origin_allowed("http://console.lan:3000", **ok)
    for origin in ("https://127.0.0.1:8100", "http://127.0.0.1:8101", "null", "http://console.lan", "http://127.0.0.1:8100/x"):
        assert not policy.origin_allowed(origin, **ok), origin


@pytest.mark.parametrize(
    ("given", "name"), [("[::1]:80", "::1"), ("Example.ORG:443", "example.org"), ("h3", "h3"), ("::1", "::1")]
)
def test_hostname(given, name):
    assert hostname(given) == name


@pytest.mark.parametrize("origin", ["*", "console.lan", "http://console.lan/path", "ftp://x", "http://"])
def test_a_setting_that_is_not_an_origin_is_refused(origin):
    with pytest.raises(ValueError, match="not an origin"):
        Settings(cors_origins=[origin])


# -- the guard on a request's headers ------------------------------------------------------------

GUARD = CrossSiteGuard(LOCAL)


def judged(method: str, *headers: tuple[str, str]) -> tuple[int, dict] | None:
    """The guard's refusal of a request with these headers (status, body), or None."""
    scope = {
        "type": "http",
        "method": method,
        "scheme": "http",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }
    refusal = GUARD.judge(scope)  # type: ignore[arg-type]
    return None if refusal is None else (refusal.status_code, json.loads(refusal.body))


HOST = ("Host", "127.0.0.1:8100")


@pytest.mark.parametrize(
    "headers",
    [
        [("Content-Type", "application/octet-stream"), ("Content-Length", "0")],  # aiohttp's bodiless post
        [("Content-Type", "text/plain"), ("Content-Length", "0")],
        [("Content-Length", "0")],
        [],
    ],
)
def test_a_request_without_a_body_is_not_judged_by_its_type(headers):
    assert judged("POST", HOST, *headers) is None


@pytest.mark.parametrize(
    "headers",
    [
        [("Content-Type", "text/plain"), ("Content-Length", "1")],
        [("Content-Type", "application/x-www-form-urlencoded"), ("Content-Length", "3")],
        [("Content-Type", "text/plain"), ("Content-Length", "0"), ("Transfer-Encoding", "chunked")],
        [("Content-Type", "text/plain")],  # a type and no length: a body of unknown size (HTTP/2), judged
        [("Content-Length", "5")],
    ],
)
def test_a_body_that_is_not_json_is_still_refused(headers):
    refusal = judged("POST", HOST, *headers)
    assert refusal is not None and refusal[0] == 415 and refusal[1]["errors"][0]["field"] == "Content-Type", refusal


def test_a_cross_site_post_is_refused_with_or_without_a_body():
    for body in ([("Content-Length", "0")], [("Content-Type", "text/plain"), ("Content-Length", "4")]):
        refusal = judged("POST", HOST, ("Origin", "https://evil.example"), *body)
        assert refusal is not None and refusal[0] == 403, refusal


@pytest.mark.parametrize(
    ("headers", "name"),
    [
        ([("Host", "127.0.0.1"), ("Host", "evil.example")], "Host"),
        ([HOST, ("Host", "127.0.0.1:8100")], "Host"),
        ([HOST, ("Content-Type", "application/json"), ("Content-Type", "text/plain")], "Content-Type"),
        ([HOST, ("Content-Type", "text/plain"), ("Content-Type", "application/json")], "Content-Type"),
        ([HOST, ("Origin", "http://127.0.0.1:8100"), ("Origin", "https://evil.example")], "Origin"),
    ],
)
def test_a_header_the_guard_reads_given_twice_is_400_naming_it(headers, name):
    for method in ("GET", "POST"):
        refusal = judged(method, *headers)
        assert refusal is not None and refusal[0] == 400, refusal
        assert (
            refusal[1]["errors"] == [{"field": name, "message": refusal[1]["detail"]}]
            and "more than once" in refusal[1]["detail"]
        )


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.1:8100", "[::1]:8100", "[::1]", "localhost", "Example.COM:0", "a.b:65535"]
)
def test_a_host_with_a_port_in_range_or_none_is_well_formed(host):
    assert well_formed(host)


@pytest.mark.parametrize("host", ["127.0.0.1:x", "localhost:99999", "[::1]:x", "[::1", "a:", "a:-1", ":80", "a:65536"])
def test_a_host_whose_port_is_no_port_is_not(host):
    assert not well_formed(host)


@pytest.mark.parametrize("tokens", [[], ["t" * 32]])
def test_a_host_with_a_bad_port_is_answered_400_or_404_never_500(make_client, tokens):
    with make_client(api_tokens=tokens) as client:
        for host in ("127.0.0.1:x", "localhost:99999", "[::1]:x"):
            for path in ("/nope", "/v1/jobs", "/v1/videos/nope/content", "/healthz"):
                r = client.get(path, headers={"host": host})
                assert r.status_code == (404 if path == "/nope" else 400), (host, path, r.status_code, r.text)
                if r.status_code == 400:
                    assert r.json()["errors"][0]["field"] == "Host"


def test_every_response_tells_browsers_not_to_sniff_its_type(make_client):
    with make_client() as client:
        for path in ("/healthz", "/nope", "/v1/jobs", "/v1/jobs/nope"):
            assert client.get(path).headers.get("x-content-type-options") == "nosniff", path


def test_a_state_changing_request_a_browser_marks_cross_site_is_refused_without_an_origin(make_client):
    body = {"prompt": "a red fox", "frames": 24, "width": 64, "height": 64, "steps": 1}
    with make_client() as client:
        refused = client.post("/v1/jobs", json=body, headers={"Sec-Fetch-Site": "cross-site"})
        assert refused.status_code == 403 and refused.json()["errors"][0]["field"] == "Sec-Fetch-Site"
        for site in ("same-origin", "none"):  # the service's own pages; a user's own typing
            assert client.post("/v1/jobs", json=body, headers={"Sec-Fetch-Site": site}).status_code == 201
        assert client.get("/v1/jobs", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200  # reads change nothing
