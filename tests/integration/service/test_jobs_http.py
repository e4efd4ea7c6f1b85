"""A job's whole life over HTTP against the real `h3core serve`: submit, stream, read, download,
replay; inert fields; idempotency; cancel; failure and its metrics; byte ranges."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import httpx
import pytest
from httpx_sse import connect_sse
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import clean_env
from tests.integration.service.conftest import (
    SMALL,
    cancel_quietly,
    event_types,
    long_job,
    poll,
    submit,
    wait_job,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def stream(client: httpx.Client, job_id: str, **headers: str) -> list[tuple[str, int, dict]]:
    """Every (event type, id, data) of /v1/jobs/{id}/stream until the server ends it."""
    out = []
    with connect_sse(client, "GET", f"/v1/jobs/{job_id}/stream", headers=headers) as source:
        assert source.response.status_code == 200, source.response.read()
        assert source.response.headers["content-type"].startswith("text/event-stream")
        for sse in source.iter_sse():
            out.append((sse.event, int(sse.id), json.loads(sse.data)))
    return out


@pytest.fixture(scope="module")
def done_job(api_server) -> dict:
    with api_server.client() as client:
        job = submit(client, prompt="a finished fox", steps=1)
        return wait_job(client, job["id"], ("done",))


# -- 1. the whole life of a job -----------------------------------------------------------------


def test_a_job_from_submission_to_download_and_replay(api, api_server):
    steps = 5
    r = api.post("/v1/jobs", json={"prompt": "a red fox in snow", **SMALL, "steps": steps})
    assert r.status_code == 201, r.text
    job = r.json()
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued"
    assert job["warnings"] == [], "the fake executor makes the 24 frames asked: nothing was snapped"
    assert job["attempt"] == 0 and job["artifact"] is None and job["error"] is None
    assert job["request"] == {
        "mode": "t2va",
        "prompt": "a red fox in snow",
        "width": 448,
        "height": 256,
        "frames": 24,
        "steps": steps,
        "seed": 0,
        "fps": 24,
        "keyframes": None,
        "references": None,
        "quality": "exact",
        "cfg_scale": None,
        "negative_prompt": None,
        "turbo": None,
    }

    # The stream: the history first, then live events, ending after the terminal one.
    events = stream(api, job["id"])
    types = [t for t, _, _ in events]
    assert types[:2] == ["submitted", "admitted"], types
    assert types[2] == "running", types
    assert types.count("progress") == steps, types
    assert types[-1] == "done", types
    assert types == ["submitted", "admitted", "running", *["progress"] * steps, "done"]
    assert [seq for _, seq, _ in events] == list(range(1, len(events) + 1))
    assert all(data["seq"] == seq and data["job_id"] == job["id"] for _, seq, data in events)
    assert [d["body"]["step"] for t, _, d in events if t == "progress"] == list(range(1, steps + 1))

    # The job as it ended.
    r = api.get(f"/v1/jobs/{job['id']}")
    assert r.status_code == 200
    done = r.json()
    assert done["status"] == "done"
    assert done["step"] == done["total_steps"] == steps
    assert done["attempt"] == 1
    assert done["elapsed_seconds"] > 0
    assert done["started_at"] and done["finished_at"] and done["queue_position"] is None
    artifact = done["artifact"]
    assert artifact["url"] == f"/v1/jobs/{job['id']}/video"
    assert artifact["media_type"] == "video/mp4"
    assert artifact["frames"] == 24
    assert artifact["bytes"] > 0 and len(artifact["sha256"]) == 64
    assert events[-1][2]["body"]["artifact"]["sha256"] == artifact["sha256"]

    # The video, whole.
    r = api.get(artifact["url"])
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("video/mp4")
    assert len(r.content) == artifact["bytes"]
    assert hashlib.sha256(r.content).hexdigest() == artifact["sha256"]
    assert r.content[4:8] == b"ftyp"

    # The stored log is what was streamed.
    r = api.get(f"/v1/jobs/{job['id']}/events")
    assert r.status_code == 200
    assert r.json() == [data for _, _, data in events]

    # Reconnecting with Last-Event-ID resumes after it (and ends, the job being over).
    resumed = stream(api, job["id"], **{"Last-Event-ID": "3"})
    assert [seq for _, seq, _ in resumed] == list(range(4, len(events) + 1))
    assert [data for _, _, data in resumed] == [data for _, _, data in events[3:]]

    # The job is listed, and `h3core replay` reads the same store and tells the same story.
    listed = api.get("/v1/jobs", params={"status": "done"}).json()["items"]
    assert job["id"] in [j["id"] for j in listed]
    replay = subprocess.run(
        [sys.executable, "-m", "h3core.cli", "replay", job["id"], "--db", str(api_server.db)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    assert "done" in replay.stdout
    assert artifact["sha256"] in replay.stdout


def test_unknown_job_is_404_on_every_job_route(api):
    for method, path in [
        ("GET", "/v1/jobs/nope"),
        ("GET", "/v1/jobs/nope/events"),
        ("GET", "/v1/jobs/nope/stream"),
        ("GET", "/v1/jobs/nope/video"),
        ("POST", "/v1/jobs/nope/cancel"),
    ]:
        r = api.request(method, path)
        assert r.status_code == 404, f"{method} {path} -> {r.status_code} {r.text}"
        assert "nope" in r.json()["detail"]


# -- 2. inert fields ------------------------------------------------------------------------------


def test_inert_fields_are_accepted_with_a_warning_each(api):
    job = submit(api, cfg_scale=7.5, negative_prompt="blurry", turbo=True, steps=1)
    warnings = job["warnings"]
    assert len(warnings) == 3, warnings
    for name in ("cfg_scale", "negative_prompt", "turbo"):
        assert sum(name in w for w in warnings) == 1, (name, warnings)
    assert job["request"]["cfg_scale"] == 7.5
    assert job["request"]["negative_prompt"] == "blurry"
    assert job["request"]["turbo"] is True
    # The warnings are part of the job, not just of the answer.
    assert api.get(f"/v1/jobs/{job['id']}").json()["warnings"] == warnings
    # One inert field, one warning.
    only = submit(api, turbo=False, steps=1)
    assert len(only["warnings"]) == 1 and "turbo" in only["warnings"][0]
    wait_job(api, only["id"])


# -- 4. idempotency -------------------------------------------------------------------------------


def test_idempotency_key_returns_the_same_job_or_409(api):
    key = {"Idempotency-Key": "order-42-attempt"}
    first = api.post("/v1/jobs", json={"prompt": "idempotent fox", **SMALL}, headers=key)
    assert first.status_code == 201, first.text
    again = api.post("/v1/jobs", json={"prompt": "idempotent fox", **SMALL}, headers=key)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == f"/v1/jobs/{first.json()['id']}"

    other = api.post("/v1/jobs", json={"prompt": "another fox", **SMALL}, headers=key)
    assert other.status_code == 409, other.text
    assert other.json()["job_id"] == first.json()["id"]
    # Same body, another priority: another request too.
    prio = api.post("/v1/jobs", json={"prompt": "idempotent fox", **SMALL, "priority": 5}, headers=key)
    assert prio.status_code == 409, prio.text

    # Another key is another job, and no key never deduplicates.
    fresh = api.post("/v1/jobs", json={"prompt": "idempotent fox", **SMALL}, headers={"Idempotency-Key": "other-key"})
    assert fresh.status_code == 201 and fresh.json()["id"] != first.json()["id"]
    a = submit(api, prompt="idempotent fox")
    b = submit(api, prompt="idempotent fox")
    assert a["id"] != b["id"]
    for job_id in (first.json()["id"], fresh.json()["id"], a["id"], b["id"]):
        wait_job(api, job_id)


# -- 5. cancel ------------------------------------------------------------------------------------


def test_cancel_queued_and_running_jobs(api):
    slow = long_job(api)
    try:
        wait_job(api, slow["id"], ("running",), what="the slow job to start")
        queued = submit(api, prompt="a waiting fox")
        assert queued["status"] == "queued" and queued["queue_position"] == 1, queued

        # Queued: cancelled at once.
        r = api.post(f"/v1/jobs/{queued['id']}/cancel")
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "cancelled"
        now = api.get(f"/v1/jobs/{queued['id']}").json()
        assert now["status"] == "cancelled" and now["attempt"] == 0 and now["started_at"] is None
        assert event_types(api, queued["id"]) == ["submitted", "admitted", "cancelled"]

        # Running: accepted, then it ends cancelled once the executor stops.
        wait_job(api, slow["id"], lambda j: (j["step"] or 0) >= 1, what="the slow job to progress")
        r = api.post(f"/v1/jobs/{slow['id']}/cancel")
        assert r.status_code == 202, r.text
        assert r.json()["status"] in ("running", "cancelled")
        assert r.json()["cancel_requested"] is True
        ended = wait_job(api, slow["id"], timeout=5, what="the running job to end after cancel")
        assert ended["status"] == "cancelled", ended
        assert ended["step"] < ended["total_steps"]
        types = event_types(api, slow["id"])
        assert "cancel_requested" in types and types[-1] == "cancelled", types

        # Ended jobs cannot be cancelled; a cancelled job has no video.
        for job_id in (slow["id"], queued["id"]):
            r = api.post(f"/v1/jobs/{job_id}/cancel")
            assert r.status_code == 409, r.text
            assert "cancelled" in r.json()["detail"]
        r = api.get(f"/v1/jobs/{slow['id']}/video")
        assert r.status_code == 409, r.text
    finally:
        cancel_quietly(api, slow["id"])


def test_cancel_a_finished_job_is_409_and_unknown_404(api, done_job):
    r = api.post(f"/v1/jobs/{done_job['id']}/cancel")
    assert r.status_code == 409, r.text
    assert "done" in r.json()["detail"]
    assert api.get(f"/v1/jobs/{done_job['id']}").json()["status"] == "done"
    r = api.post("/v1/jobs/0123456789abcdef0123456789abcdef/cancel")
    assert r.status_code == 404, r.text


def test_a_cancel_during_the_final_encode_is_409_too_late_and_the_job_ends_done_with_its_video(api):
    job = submit(api, prompt="an encoding fox [fake step=0.01 encode=3]", steps=2)
    wait_job(api, job["id"], lambda j: j["step"] == 2, what="its last step (the encode follows)")
    r = api.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 409, r.text
    problem = r.json()
    assert problem["reason"] == "too_late" and problem["status"] == "done" and problem["detail"].startswith("too late"), problem
    now = api.get(f"/v1/jobs/{job['id']}").json()
    assert now["status"] == "done" and now["cancel_requested"] and now["artifact"] is not None
    assert api.get(now["artifact"]["url"]).status_code == 200
    events = api.get(f"/v1/jobs/{job['id']}/events").json()
    assert [e["body"]["type"] for e in events][-2:] == ["cancel_requested", "done"]
    assert events[-1]["body"]["cancel_too_late"] is True


def test_a_video_deleted_through_v1_videos_is_shown_deleted_with_no_url(api):
    job = wait_job(api, submit(api, prompt="a fox soon deleted", steps=1)["id"], ("done",))
    assert job["artifact"]["url"] == f"/v1/jobs/{job['id']}/video" and job["artifact"]["deleted_at"] is None
    assert api.delete(f"/v1/videos/{job['id']}").status_code == 200
    after = api.get(f"/v1/jobs/{job['id']}").json()
    assert after["status"] == "done", "the job stays done: its log is kept"
    assert after["artifact"]["url"] is None, "no url that answers 410"
    assert after["artifact"]["deleted_at"] is not None and after["artifact"]["sha256"] == job["artifact"]["sha256"]
    listed = next(j for j in api.get("/v1/jobs", params={"status": "done", "limit": 500}).json()["items"] if j["id"] == job["id"])
    assert listed["artifact"] == after["artifact"]
    assert api.get(f"/v1/jobs/{job['id']}/video").status_code == 410


def test_a_video_before_the_job_is_done_is_409(api):
    slow = long_job(api, steps=50)
    try:
        r = api.get(f"/v1/jobs/{slow['id']}/video")
        assert r.status_code == 409, r.text
        assert r.json()["detail"]
    finally:
        cancel_quietly(api, slow["id"])
        wait_job(api, slow["id"])


# -- 6. failure and metrics -----------------------------------------------------------------------


def metric_samples(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_failed_job_is_reported_and_counted(api):
    job = submit(api, prompt="a doomed fox [fake fail_at=2 kind=oom]", steps=4)
    ended = wait_job(api, job["id"])
    assert ended["status"] == "failed", ended
    assert ended["error"]["kind"] == "oom"
    assert "out of memory" in ended["error"]["message"].lower()
    assert ended["step"] == 1 and ended["attempt"] == 1  # oom is not retried by default
    assert ended["artifact"] is None
    assert event_types(api, job["id"])[-1] == "failed"
    r = api.get(f"/v1/jobs/{job['id']}/video")
    assert r.status_code == 409

    # The counters follow the live events: poll until the terminal event has been counted.
    def counted():
        m = metric_samples(api)
        ok = (
            m.get(("h3core_executor_failures_total", (("kind", "oom"),)), 0) >= 1
            and m.get(("h3core_jobs", (("status", "failed"),)), 0) >= 1
            and m.get(("h3core_job_duration_seconds_count", (("status", "failed"),)), 0) >= 1
        )
        return m if ok else None

    m = poll(counted, 10, "/metrics to count the failed job", lambda: str(metric_samples(api)))
    assert m[("h3core_job_duration_seconds_bucket", (("le", "+Inf"), ("status", "failed")))] >= 1
    assert m[("h3core_job_duration_seconds_sum", (("status", "failed"),))] > 0
    assert ("h3core_queue_depth", ()) in m
    assert failed_in_list(api, job["id"])


def test_a_faster_quality_level_counts_its_cached_steps_in_done_and_in_metrics(api):
    """`quality` on /v1/jobs and on /v1/videos (extra_body): the fake simulates the cache, so a
    `fast` job serves steps from it; the running event names the level, done counts the steps."""
    job = submit(api, prompt="a quick fox", steps=6, quality="fast")
    assert job["request"]["quality"] == "fast"
    assert wait_job(api, job["id"])["status"] == "done"
    events = api.get(f"/v1/jobs/{job['id']}/events").json()
    running = next(e["body"] for e in events if e["body"]["type"] == "running")
    assert running["info"]["quality"] == "fast" and "cache" in running["info"]
    assert events[-1]["body"]["steps"] == {"quality": "fast", "computed": 4, "cached": 2}
    body = {"prompt": "a quick fox", "size": "448x256", "seconds": "1", "steps": 3, "quality": "balanced"}
    r = api.post("/v1/videos", json=body)
    assert r.status_code == 200, r.text
    video = wait_job(api, r.json()["id"])
    assert video["request"]["quality"] == "balanced"
    bad = submit(api, expect=422, quality="fastest")
    assert "quality" in json.dumps(bad)

    def counted():
        m = metric_samples(api)
        ok = (
            m.get(("h3core_transformer_steps_cached_total", (("quality", "fast"),)), 0) >= 2
            and m.get(("h3core_transformer_steps_computed_total", (("quality", "balanced"),)), 0) >= 1
        )
        return m if ok else None

    m = poll(counted, 10, "/metrics to count the cached steps", lambda: str(metric_samples(api)))
    assert m[("h3core_transformer_steps_computed_total", (("quality", "fast"),))] >= 4


def failed_in_list(client: httpx.Client, job_id: str) -> bool:
    items = client.get("/v1/jobs", params={"status": "failed"}).json()["items"]
    return job_id in [j["id"] for j in items] and all(j["status"] == "failed" for j in items)


# -- 8. byte ranges -------------------------------------------------------------------------------


def test_video_byte_ranges(api, done_job):
    url = done_job["artifact"]["url"]
    whole = api.get(url)
    assert whole.status_code == 200
    assert whole.headers["accept-ranges"] == "bytes"
    size = done_job["artifact"]["bytes"]
    assert len(whole.content) == size == int(whole.headers["content-length"])
    assert size > 200
    data = whole.content

    r = api.get(url, headers={"Range": "bytes=0-99"})
    assert r.status_code == 206, r.text
    assert r.headers["content-range"] == f"bytes 0-99/{size}"
    assert r.headers["content-length"] == "100"
    assert r.content == data[:100]

    r = api.get(url, headers={"Range": "bytes=-10"})
    assert r.status_code == 206
    assert r.headers["content-range"] == f"bytes {size - 10}-{size - 1}/{size}"
    assert r.content == data[-10:]

    r = api.get(url, headers={"Range": "bytes=100-"})
    assert r.status_code == 206
    assert r.headers["content-range"] == f"bytes 100-{size - 1}/{size}"
    assert r.content == data[100:]

    r = api.get(url, headers={"Range": f"bytes={size - 5}-{size + 1000}"})  # clipped to the end
    assert r.status_code == 206
    assert r.content == data[-5:]

    r = api.get(url, headers={"Range": f"bytes={size}-"})
    assert r.status_code == 416, r.text
    assert r.headers["content-range"] == f"bytes */{size}"


def test_a_retry_runs_an_ended_job_again_with_its_priority_and_names_it(api):
    failed = submit(api, prompt="a fox that fails [fake step=0 fail_at=1 kind=invalid]", priority=3)
    assert wait_job(api, failed["id"])["status"] == "failed"
    r = api.post(f"/v1/jobs/{failed['id']}/retry")
    assert r.status_code == 201, r.text
    again = r.json()
    assert r.headers["location"] == f"/v1/jobs/{again['id']}" and again["id"] != failed["id"]
    assert (again["retry_of"], again["priority"], again["request"]) == (failed["id"], 3, failed["request"])
    (submitted,) = [e["body"] for e in api.get(f"/v1/jobs/{again['id']}/events").json() if e["body"]["type"] == "submitted"]
    assert submitted["retry_of"] == failed["id"] and submitted["by"] is None  # no tokens: no one in particular
    # Only an ended job: a running one would then run twice.
    running = long_job(api, steps=300, step=0.2)
    try:
        r = api.post(f"/v1/jobs/{running['id']}/retry")
        assert r.status_code == 409 and r.json()["status"] in ("queued", "running"), r.text
    finally:
        cancel_quietly(api, running["id"])
    assert api.post("/v1/jobs/nope/retry").status_code == 404


def test_a_queued_job_s_priority_changes_and_it_moves_in_the_queue(api):
    slots = [long_job(api, steps=300, step=0.2)]  # the server's one slot busy: the rest wait
    waiting = [long_job(api, steps=300, step=0.2) for _ in range(3)]
    try:
        for job in slots:
            wait_job(api, job["id"], ("running", "queued"))
        last = waiting[-1]["id"]
        before = api.get(f"/v1/jobs/{last}").json()
        assert before["status"] == "queued", before
        r = api.patch(f"/v1/jobs/{last}", json={"priority": 50})
        assert r.status_code == 200, r.text
        assert (r.json()["priority"], r.json()["queue_position"]) == (50, 1)
        (changed,) = [e for e in api.get(f"/v1/jobs/{last}/events").json() if e["body"]["type"] == "reprioritized"]
        assert changed["body"]["priority"] == 50
        assert api.patch(f"/v1/jobs/{last}", json={"priority": 101}).status_code == 422
        assert api.patch(f"/v1/jobs/{last}", json={"priority": "5"}).status_code in (400, 422)
        assert api.patch("/v1/jobs/nope", json={"priority": 1}).status_code == 404
        started = wait_job(api, slots[0]["id"], ("running",))
        refused = api.patch(f"/v1/jobs/{started['id']}", json={"priority": 5})
        assert refused.status_code == 409 and refused.json()["status"] == "running", refused.text
    finally:
        cancel_quietly(api, *(j["id"] for j in slots + waiting))
