"""A long video through `h3core serve --executor fake` with a 2 s window: OpenAI's `seconds` past the
model's window where the bound allows, made as segments, its whole progress and plan in /v1/jobs,
its content, thumbnail and sprite sheet served as any video's; past the bound, refused naming it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.service.conftest import Server, Servers, event_types
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
