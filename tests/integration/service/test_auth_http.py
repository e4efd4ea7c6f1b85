"""Bearer tokens on every /v1 route of the real service, and the refusal to listen beyond
loopback without them. No test here binds a non-loopback address or sends traffic to one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.factories import png
from tests.integration.conftest import clean_env
from tests.integration.service.conftest import SMALL, Server, cancel_quietly, free_port, wait_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOKEN_A = "tok-aaaaaaaaaaaaaaaa"
TOKEN_B = "tok-bbbbbbbbbbbbbbbb"


@pytest.fixture
def guarded(servers) -> Iterator[Server]:
    server = servers.start({"H3_API_TOKENS": f"{TOKEN_A},{TOKEN_B}"})
    yield server
    server.stop()


Call = Callable[[httpx.Client], httpx.Response]


def routes(done_id: str, running_ids: list[str]) -> dict[str, Call]:
    """Every /v1 route, each as a call that succeeds (2xx) given a valid token.

    `running_ids` are jobs to cancel: each successful cancel (or delete of a video) takes one.
    """
    video = {"prompt": "a guarded fox", "size": "448x256", "seconds": "1", "steps": 1}
    return {
        "GET /v1/jobs": lambda c: c.get("/v1/jobs"),
        "POST /v1/jobs": lambda c: c.post("/v1/jobs", json={"prompt": "a guarded fox", **SMALL, "steps": 1}),
        "GET /v1/jobs/{id}": lambda c: c.get(f"/v1/jobs/{done_id}"),
        "PATCH /v1/jobs/{id}": lambda c: c.patch(f"/v1/jobs/{running_ids[-1]}", json={"priority": 3}),  # queued behind the first
        "GET /v1/jobs/{id}/events": lambda c: c.get(f"/v1/jobs/{done_id}/events"),
        "GET /v1/jobs/{id}/stream": lambda c: c.get(f"/v1/jobs/{done_id}/stream"),  # ends: the job is over
        "GET /v1/jobs/{id}/video": lambda c: c.get(f"/v1/jobs/{done_id}/video", headers={"Range": "bytes=0-9"}),
        "HEAD /v1/jobs/{id}/video": lambda c: c.head(f"/v1/jobs/{done_id}/video"),
        "GET /v1/jobs/{id}/webhooks": lambda c: c.get(f"/v1/jobs/{done_id}/webhooks"),
        "POST /v1/jobs/{id}/cancel": lambda c: c.post(f"/v1/jobs/{running_ids.pop()}/cancel"),
        "POST /v1/jobs/{id}/retry": lambda c: c.post(f"/v1/jobs/{done_id}/retry"),
        "POST /v1/uploads": lambda c: c.post("/v1/uploads", content=png(), headers={"Content-Type": "image/png"}),
        "GET /v1/ceilings": lambda c: c.get("/v1/ceilings"),
        "GET /v1/nodes": lambda c: c.get("/v1/nodes"),
        "PATCH /v1/nodes/{node_id}": lambda c: c.patch("/v1/nodes/gpu-1", json={"draining": True}),
        "POST /v1/videos": lambda c: c.post("/v1/videos", json=video),
        "GET /v1/videos": lambda c: c.get("/v1/videos"),
        "GET /v1/videos/{video_id}": lambda c: c.get(f"/v1/videos/{done_id}"),
        "GET /v1/videos/{video_id}/content": lambda c: c.get(f"/v1/videos/{done_id}/content", headers={"Range": "bytes=0-9"}),
        "POST /v1/videos/{video_id}/remix": lambda c: c.post(f"/v1/videos/{done_id}/remix", json={"prompt": "again"}),
        "DELETE /v1/videos/{video_id}": lambda c: c.delete(f"/v1/videos/{running_ids.pop()}"),
    }


def refused_says_token(r: httpx.Response) -> bool:
    """/v1/videos answers in OpenAI's error shape, the rest in h3core's."""
    body = r.json()
    return "token" in (body["error"]["message"] if "error" in body else body["detail"])


def test_every_v1_route_needs_a_valid_bearer_token(guarded):
    with guarded.client(TOKEN_A) as a, guarded.client(TOKEN_B) as b:
        r = a.post("/v1/jobs", json={"prompt": "a fox", **SMALL, "steps": 1})
        assert r.status_code == 201, r.text
        done_id = wait_job(b, r.json()["id"], ("done",))["id"]
        slow = [
            a.post("/v1/jobs", json={"prompt": f"slow fox {i} [fake step=0.2]", **SMALL, "steps": 100}).json()["id"]
            for i in range(4)  # two to cancel, two to delete (once with each token)
        ]
        jobs_before = len(a.get("/v1/jobs", params={"limit": 500}).json()["items"])

        calls = routes(done_id, list(slow))
        # The schema lists exactly these /v1 operations: a new route must be added here.
        spec = httpx.get(f"{guarded.url}/schema/openapi.json").json()
        listed = {f"{m.upper()} {p}" for p, ops in spec["paths"].items() if p.startswith("/v1/") for m in ops}
        assert listed == {name.replace("{id}", "{job_id}") for name in calls}
        no_side_effect = {"POST /v1/jobs/{id}/cancel": "post", "DELETE /v1/videos/{video_id}": "delete"}

        bad_clients = {
            "no token": guarded.client(),
            "a wrong token": guarded.client("tok-cccccccccccccccc"),
            "a prefix of a token": guarded.client(TOKEN_A[:-1]),
            "a token with a suffix": guarded.client(TOKEN_A + "x"),
            "both tokens": guarded.client(f"{TOKEN_A},{TOKEN_B}"),
            "the Basic scheme": guarded.client(headers={"Authorization": f"Basic {TOKEN_A}"}),
            "the bare token": guarded.client(headers={"Authorization": TOKEN_A}),
        }
        try:
            for name, call in calls.items():
                for how, client in bad_clients.items():
                    if name in no_side_effect:  # a refused call aims at a job a valid one will not take
                        path = name.split(" ", 1)[1].replace("{id}", slow[0]).replace("{video_id}", slow[0])
                        r = client.request(no_side_effect[name], path)
                    else:
                        r = call(client)
                    assert r.status_code == 401, f"{name} with {how} -> {r.status_code} {r.text}"
                    assert r.headers["www-authenticate"].lower().startswith("bearer"), r.headers
                    assert r.request.method == "HEAD" or refused_says_token(r), r.text
            # An unknown job is 401 too, not 404: nothing is told without a token.
            assert bad_clients["no token"].get("/v1/jobs/nope").status_code == 401
        finally:
            for client in bad_clients.values():
                client.close()

        # Nothing was done by the refused calls.
        assert len(a.get("/v1/jobs", params={"limit": 500}).json()["items"]) == jobs_before
        assert all(a.get(f"/v1/jobs/{j}").json()["cancel_requested"] is False for j in slow)

        # A store of one runner (SQLite, as here) has no nodes to drain: past the guard, a 404 says so.
        past_the_guard = {"PATCH /v1/nodes/{node_id}": 404}
        for name, call in calls.items():
            for token, client in (("A", a), ("B", b)):
                r = call(client)
                if name in past_the_guard:
                    assert r.status_code == past_the_guard[name] and "no runner node" in r.json()["detail"], r.text
                    continue
                assert 200 <= r.status_code < 300, f"{name} with token {token} -> {r.status_code} {r.text}"
        cancel_quietly(a, *slow)

    # Outside /v1 nothing is guarded: the liveness probe answers anyone.
    r = httpx.get(f"{guarded.url}/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok", "reason": None}


def serve_refused(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `h3core serve` expecting it to refuse before it listens anywhere."""
    db = tmp_path / "refused.db"
    cmd = [sys.executable, "-m", "h3core.cli", "serve", "--port", str(free_port()), "--db", str(db), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**clean_env(), **(env or {})}, timeout=30, cwd=tmp_path)
    assert not db.exists(), "a refused server must not have opened the store"
    return result


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("--host", "0.0.0.0"), {}),
        ((), {"H3_HOST": "0.0.0.0"}),
        (("--host", "::"), {}),
        (("--host", "h3.example.org"), {}),  # a name may resolve anywhere
    ],
    ids=["flag", "env", "ipv6-any", "hostname"],
)
def test_listening_beyond_loopback_without_tokens_is_refused(tmp_path, args, env):
    result = serve_refused(tmp_path, *args, env=env)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "H3_API_TOKENS" in result.stderr
    assert "refusing" in result.stderr


def test_short_tokens_are_refused(tmp_path):
    result = serve_refused(tmp_path, env={"H3_API_TOKENS": f"{TOKEN_A},short"})
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "16 characters" in result.stderr
