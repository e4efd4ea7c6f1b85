"""A long video through `h3core serve --executor fake` with a 2 s window: OpenAI's `seconds` past the
model's window where the bound allows, made as segments, its whole progress and plan in /v1/jobs,
its content, thumbnail and sprite sheet served as any video's; past the bound, refused naming it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.service.conftest import Server, Servers, event_types, poll, wait_job
from tests.integration.service.openai_sdk import IGNORE_SDK_DEPRECATION, create_to_completed, sdk

pytestmark = [pytest.mark.timeout(180), IGNORE_SDK_DEPRECATION]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    s = Servers(tmp_path_factory.mktemp("long"))
    server = s.start({"H3_FAKE_WINDOW_SECONDS": "2", "H3_FAKE_STEP_SECONDS": "0.01", "H3_MAX_VIDEO_SECONDS": "10"})
    try:
        yield server
        server.stop()
    finally:
        s.kill_all()


def test_seconds_past_the_window_make_one_video_of_segments_served_as_any_other(server):
    client: Any = sdk(server)
    video = create_to_completed(client, size="448x256", seconds="6", frames=144, steps=2)
    with server.client() as api:
        job = api.get(f"/v1/jobs/{video.id}").json()
        kinds = event_types(api, video.id)
    segments = job["segments"]
    assert segments["count"] == kinds.count("segment_done") >= 3 and segments["done"] == segments["count"], segments
    assert (job["step"], job["total_steps"]) == (2 * segments["count"], 2 * segments["count"]), "the whole job's steps"
    assert job["artifact"]["frames"] == 144 and abs(job["artifact"]["duration_seconds"] - 6.0) < 1e-6
    assert kinds[:3] == ["submitted", "admitted", "planned"] and kinds[-1] == "done"


def test_past_the_bound_a_video_is_refused_naming_it(server):
    with server.client() as api:
        r = api.post("/v1/jobs", json={"prompt": "too long", "width": 448, "height": 256, "frames": 241, "steps": 2})
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["reason"] == "api_limit" and problem["ceiling"]["max_frames"] == 240
    assert "a video made as segments is at most 10 s (240 frames)" in problem["detail"]


def test_a_kill_9_of_serve_in_the_third_segment_makes_only_the_rest_and_the_same_video(servers: Servers):
    """`h3core serve` SIGKILLed while it makes the third of four segments, then started again: the
    two logged are not made again (their events say so) and the video is an uninterrupted run's."""
    env = {"H3_FAKE_WINDOW_SECONDS": "1", "H3_FAKE_STEP_SECONDS": "0.2"}
    body = {"prompt": "a long walk", "width": 64, "height": 64, "frames": 72, "steps": 4, "seed": 5}
    first = servers.start(env)
    with first.client() as c:
        job = c.post("/v1/jobs", json=body).json()
        assert job["segments"]["count"] == 4, job
        poll(
            lambda: (j := c.get(f"/v1/jobs/{job['id']}").json())["segments"]["done"] == 2 and (j["step"] or 0) > 8,
            60,
            "a step of the third segment",
            first.log,
        )
    first.kill()
    second = servers.start({**env, "H3_FAKE_STEP_SECONDS": "0.01"}, root=first.root)
    with second.client() as c:
        done = wait_job(c, job["id"], timeout=60)
        assert done["status"] == "done", (done, second.log())
        whole = c.post("/v1/jobs", json={**body, "prompt": "the same, uninterrupted"}).json()
        reference = wait_job(c, whole["id"], ("done",), timeout=60)
        events = c.get(f"/v1/jobs/{job['id']}/events").json()
    second.stop()
    kinds = [e["body"]["type"] for e in events]
    retry = [i for i, k in enumerate(kinds) if k == "running"][-1]
    made = [(i > retry, e["body"]["index"]) for i, e in enumerate(events) if e["body"]["type"] == "segment_done"]
    assert made == [(False, 0), (False, 1), (True, 2), (True, 3)], "each segment once: the first two before the kill"
    assert done["attempt"] == 2 and done["artifact"]["frames"] == 72
    assert done["artifact"]["sha256"] == reference["artifact"]["sha256"], "the video of an uninterrupted run"
