"""OpenAI's Videos API on `h3core serve --executor fake`, driven by the real `openai` package:
one server (with a token) for the module, short fake steps."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from tests.factories import png
from tests.integration.service.conftest import Server, Servers, wait_job
from tests.integration.service.openai_sdk import (
    IGNORE_SDK_DEPRECATION,
    create_to_completed,
    delete_finished_keeps_the_log,
    delete_running_cancels_it,
    is_gone,
    jobs_api,
    refusals,
    remix_to_completed,
    sdk,
    wait_video,
)
from tests.readme import openai_example, quickstart_job

pytestmark = [pytest.mark.timeout(120), IGNORE_SDK_DEPRECATION]

TOKEN = "tok-videos-0123456789"
QUICK = {"size": "448x256", "seconds": "1", "extra_body": {"steps": 2}}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    s = Servers(tmp_path_factory.mktemp("videos"))
    server = s.start({"H3_API_TOKENS": TOKEN, "H3_OPENAI_MODELS": "minimax-h3,h3-alias"})
    try:
        yield server
        server.stop()
    finally:
        s.kill_all()


@pytest.fixture(scope="module")
def client(server) -> Any:
    return sdk(server, TOKEN)


@pytest.fixture(scope="module")
def finished(client) -> Any:
    """One video made through create_and_poll, shared by the tests that read it."""
    return create_to_completed(client, size="448x256", seconds="1", frames=24, steps=2)


def raw(server: Server) -> httpx.Client:
    return server.client(TOKEN)


def test_create_and_poll_completes_and_every_variant_downloads(finished, server):
    with raw(server) as api:
        job = api.get(f"/v1/jobs/{finished.id}").json()  # the same job, in h3core's own dialect
    assert job["status"] == "done" and job["request"]["frames"] == 24 and job["request"]["steps"] == 2


def test_a_live_video_tells_the_client_when_to_poll_again(client):
    video = client.videos.create(prompt="a slow fox [fake step=0.2]", size="448x256", seconds="1", extra_body={"steps": 50})
    try:
        wait_video(client, video.id, ("in_progress",))
        r = client.videos.with_raw_response.retrieve(video.id)
        assert 100 <= int(r.headers["openai-poll-after-ms"]) <= 5000
    finally:
        with jobs_api(client) as api:
            api.post(f"jobs/{video.id}/cancel")
    ended = wait_video(client, video.id)
    assert "openai-poll-after-ms" not in client.videos.with_raw_response.retrieve(ended.id).headers


def test_the_list_pages_with_after_limit_and_order(client):
    mine = [client.videos.create(prompt=f"fox {i}", **QUICK).id for i in range(5)]
    newest_first = [v.id for v in client.videos.list(limit=2)]  # the SDK follows `after` page by page
    assert [i for i in newest_first if i in mine] == mine[::-1]
    assert len(newest_first) == len(set(newest_first))
    page = client.videos.list(limit=2)
    assert len(page.data) == 2 and page.has_more and page.last_id == page.data[-1].id and page.first_id == page.data[0].id
    assert [v.id for v in client.videos.list(after=mine[3], limit=2).data] == [mine[2], mine[1]]
    oldest_first = [v.id for v in client.videos.list(order="asc", limit=3)]
    assert [i for i in oldest_first if i in mine] == mine
    assert [v.id for v in client.videos.list(after=mine[1], order="asc", limit=2).data] == [mine[2], mine[3]]
    last = client.videos.list(after=mine[0], order="asc", limit=100)
    assert not last.has_more and last.data[-1].id == mine[-1]
    with pytest.raises(openai.NotFoundError) as err:  # a well-formed id that is no video
        client.videos.list(after="no-such-video")
    assert err.value.body["param"] == "after"
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.list(after="../x")
    assert err.value.body["param"] == "after"
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.list(limit=101)
    assert err.value.body["param"] == "limit"
    for video_id in mine:
        wait_video(client, video_id)


def test_a_remix_reuses_the_parameters_with_a_new_prompt_and_names_its_source(client, finished, server):
    remix = remix_to_completed(client, finished)
    with raw(server) as api:
        job = api.get(f"/v1/jobs/{remix.id}").json()
        source = api.get(f"/v1/jobs/{finished.id}").json()
    assert job["remixed_from"] == finished.id
    assert {k: v for k, v in job["request"].items() if k != "prompt"} == {
        k: v for k, v in source["request"].items() if k != "prompt"
    }


def test_deleting_a_running_video_cancels_it(client):
    delete_running_cancels_it(client, prompt="a slow fox [fake step=0.2]", size="448x256", seconds="1", extra_body={"steps": 100})


def test_deleting_a_video_whose_cancel_comes_too_late_deletes_the_video_it_finished(client, server):
    video = client.videos.create(
        prompt="an encoding fox [fake step=0.01 encode=3]", size="448x256", seconds="1", extra_body={"steps": 2}
    )
    with raw(server) as api:
        wait_job(api, video.id, lambda j: j["step"] == 2, what="its last step (the encode follows)")
        gone = client.videos.delete(video.id)
        assert gone.deleted
        events = api.get(f"/v1/jobs/{video.id}/events").json()
    assert [e["body"]["type"] for e in events][-2:] == ["cancel_requested", "done"] and events[-1]["body"]["cancel_too_late"]
    is_gone(client, video.id)
    with raw(server) as api:
        job = api.get(f"/v1/jobs/{video.id}").json()
        assert job["status"] == "done" and job["artifact"]["deleted_at"] is not None, "too late to cancel: its file deleted"
        assert api.get(f"/v1/jobs/{video.id}/video").status_code == 410


def test_deleting_a_finished_video_deletes_its_file_and_keeps_its_log(client, server):
    video = create_to_completed(client, size="448x256", seconds="0.5", frames=12, steps=1)
    delete_finished_keeps_the_log(client, video)


def test_a_refusal_and_what_cannot_be_served_are_bad_requests(client):
    refusals(client)


def test_a_wrong_or_missing_key_is_an_authentication_error(server, finished):
    wrong = sdk(server, "tok-not-the-right-one")
    for call in (
        lambda: wrong.videos.create(prompt="a fox", **QUICK),
        lambda: wrong.videos.retrieve(finished.id),
        lambda: wrong.videos.list(),
        lambda: wrong.videos.download_content(finished.id),
        lambda: wrong.videos.remix(finished.id, prompt="x"),
        lambda: wrong.videos.delete(finished.id),
    ):
        with pytest.raises(openai.AuthenticationError) as err:
            call()
        assert err.value.body["code"] == "invalid_api_key" and "bearer token" in err.value.message
    r = httpx.get(f"{server.url}/v1/videos")
    assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"


def test_an_input_reference_becomes_the_first_frame_of_an_fl2va_video(client, server):
    image = Image.new("RGB", (448, 256), (200, 40, 40))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    as_file = client.videos.create(prompt="from a file", input_reference=("first.png", buffer.getvalue(), "image/png"), **QUICK)
    with raw(server) as api:
        uploaded = api.post("/v1/uploads", content=png(), headers={"Content-Type": "image/png"}).json()["id"]
        # The Python SDK sends only files as input_reference; the object forms come as JSON (other
        # clients), or as form fields through extra_body.
        as_id = client.videos.create(
            prompt="from an upload", **QUICK | {"extra_body": {"steps": 2, "input_reference": {"file_id": uploaded}}}
        )
        data_url = "data:image/png;base64," + base64.b64encode(png(448, 256)).decode()
        r = api.post(
            "/v1/videos",
            json={
                "prompt": "from a data URL",
                "size": "448x256",
                "seconds": "1",
                "steps": 2,
                "input_reference": {"image_url": data_url},
            },
        )
        assert r.status_code == 200, r.text
        as_url = client.videos.retrieve(r.json()["id"])
        for video in (as_file, as_url, as_id):
            assert wait_video(client, video.id).status == "completed"
            request = api.get(f"/v1/jobs/{video.id}").json()["request"]
            assert request["mode"] == "fl2va" and request["keyframes"]["first"].startswith("u_")
        assert api.get(f"/v1/jobs/{as_id.id}").json()["request"]["keyframes"]["first"] == uploaded
        remote = api.post("/v1/videos", json={"prompt": "x", "input_reference": {"image_url": "https://example.org/a.png"}})
        assert remote.status_code == 400 and remote.json()["error"]["param"] == "input_reference", remote.text
        assert "no remote URL" in remote.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError) as missing:  # a well-formed id no upload has: 404
        client.videos.create(prompt="x", **QUICK | {"extra_body": {"input_reference": {"file_id": "u_" + "f" * 32}}})
    assert missing.value.body["param"] == "input_reference" and "no upload" in missing.value.message
    assert missing.value.body["code"] == "upload_not_found"
    with pytest.raises(openai.BadRequestError) as err:  # one of another form: 400, as every invalid value here
        client.videos.create(prompt="x", **QUICK | {"extra_body": {"input_reference": {"file_id": "not-an-upload"}}})
    assert err.value.body["param"].startswith("input_reference")
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.create(prompt="x", input_reference=("notes.txt", b"not an image", "text/plain"), **QUICK)
    assert err.value.body["param"] == "input_reference"


def test_h3cores_own_fields_go_through_extra_body_and_unknown_ones_are_refused(client, server):
    video = client.videos.create(
        prompt="seeded", size="448x256", extra_body={"frames": 30, "steps": 1, "seed": 42, "priority": 5}
    )
    assert video.seconds == "1.25"
    with raw(server) as api:
        job = api.get(f"/v1/jobs/{video.id}").json()
    assert (job["request"]["frames"], job["request"]["seed"]) == (30, 42)
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.create(prompt="x", extra_body={"colour": "red"})
    assert (err.value.body["param"], err.value.body["code"]) == ("colour", "unknown_parameter")
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.create(prompt="x", seconds="1", extra_body={"frames": 24})
    assert err.value.body["param"] == "seconds"
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.create(prompt="x", extra_body={"steps": 0})
    assert err.value.body["param"] == "steps"
    wait_video(client, video.id)


def test_every_error_on_these_routes_has_openais_shape(server):
    with raw(server) as api:
        answers = {
            "json body": api.post("/v1/videos", json={"prompt": "x", "size": "448x256", "steps": "2"}),
            "bad json": api.post("/v1/videos", content=b"{nope", headers={"Content-Type": "application/json"}),
            "not an object": api.post("/v1/videos", json=["prompt"]),
            "text body": api.post("/v1/videos", content=b"prompt", headers={"Content-Type": "text/plain"}),
            "no such variant": api.get("/v1/videos/x/content", params={"variant": "poster"}),
            "no such route": api.get("/v1/videos/x/y/z"),
            "no such method": api.put("/v1/videos"),
            "remix without prompt": api.post("/v1/videos/x/remix", json={}),
        }
    expected = {
        "json body": 400,
        "bad json": 400,
        "not an object": 400,
        "text body": 415,
        "no such variant": 400,
        "no such route": 404,
        "no such method": 405,
        "remix without prompt": 400,
    }
    for name, r in answers.items():
        assert r.status_code == expected[name], (name, r.status_code, r.text)
        error = r.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"} and error["message"], (name, error)
    assert answers["json body"].json()["error"]["param"] == "steps"  # JSON keeps its types: "2" is not a number


def test_a_file_lost_without_a_delete_is_not_found_and_not_reported_deleted(client, server):
    video = create_to_completed(client, size="448x256", seconds="0.5", frames=12, steps=1)
    for lost in server.artifacts.glob(f"{video.id}/*.mp4"):
        lost.unlink()
    for variant in ("video", "thumbnail"):
        with pytest.raises(openai.NotFoundError) as err:
            client.videos.download_content(video.id, variant=variant)
        assert err.value.body["code"] == "content_missing"
    assert client.videos.retrieve(video.id).expires_at is None


@pytest.mark.parametrize("damage", ["truncated", "same-size"])
def test_a_damaged_video_is_never_served_as_the_recorded_one(client, server, damage):
    """Truncated, or the same size with other bytes: no route serves it under the recorded sha256,
    and no variant is a 500; each says why in a 4xx (404 here, as OpenAI's API; 410 on /v1/jobs)."""
    video = create_to_completed(client, size="448x256", seconds="0.5", frames=12, steps=1)
    headers = {"Authorization": f"Bearer {client.api_key}"}
    first = httpx.get(f"{server.url}/v1/videos/{video.id}/content", headers=headers)
    assert first.status_code == 200  # served, and verified, once whole
    [path] = server.artifacts.glob(f"{video.id}/*.mp4")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else data[:32] + bytes(len(data) - 32))
    for variant in ("video", "thumbnail", "spritesheet"):
        with pytest.raises(openai.NotFoundError) as err:
            client.videos.download_content(video.id, variant=variant)
        assert err.value.body["code"] == "content_changed", (variant, err.value.body)
        assert "in the artifact store" in err.value.message
    old = httpx.get(f"{server.url}/v1/jobs/{video.id}/video", headers=headers)
    assert old.status_code == 410 and "cannot be served" in old.json()["detail"], old.text
    path.write_bytes(data)  # put back as it was: served again
    assert httpx.get(f"{server.url}/v1/videos/{video.id}/content", headers=headers).content == data


def test_the_readmes_example_runs_and_asks_no_more_than_the_quickstarts_job(server, tmp_path, monkeypatch):
    """The README's OpenAI example, as written, pointed at this server by H3_URL and H3_TOKEN as a
    reader's shell would: it makes a video, saves it, remixes it and deletes it; and its job, like
    the remix it queues, is no larger than the Quickstart's, which takes seconds on a CPU (1344x768,
    5 s took ~5 minutes)."""
    monkeypatch.setenv("H3_URL", server.url)
    monkeypatch.setenv("H3_TOKEN", TOKEN)
    monkeypatch.chdir(tmp_path)
    names: dict[str, Any] = {}  # nothing defined beforehand: the example stands alone
    exec(compile(openai_example(), "README.md (OpenAI example)", "exec"), names)
    assert (tmp_path / "fox.mp4").stat().st_size > 0
    with raw(server) as api:
        request = api.get(f"/v1/jobs/{names['video'].id}").json()["request"]
    quick = quickstart_job()

    def work(job: dict) -> int:
        return job["width"] * job["height"] * job["frames"] * job["steps"]

    assert work(request) <= work(quick), (request, quick)
