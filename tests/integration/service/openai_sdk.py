"""The OpenAI SDK's video round trip against a running h3core, shared by the fake-executor and the
tiny-model pipeline suites: each step through the real `openai` package, checked on what came back."""

from __future__ import annotations

import io
from typing import Any

import av
import httpx
import openai
import pytest
from PIL import Image

from tests.integration.service.conftest import Server, poll

# The SDK marks its video methods deprecated (OpenAI's own video service is closing); the API they
# speak is what h3core serves. For a test module's `pytestmark`.
IGNORE_SDK_DEPRECATION = pytest.mark.filterwarnings("ignore:The Sora API is scheduled:DeprecationWarning")


def sdk(server: Server, token: str = "unused-on-loopback") -> Any:
    """A client as a user would make one; no retries, so every error surfaces at once."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, max_retries=0, timeout=30)


def wait_video(client: Any, video_id: str, until: tuple[str, ...] = ("completed", "failed"), timeout: float = 60) -> Any:
    """retrieve() until the status is one of `until` (deadline-bounded, unlike the SDK's poll)."""
    last: list[Any] = []

    def ready() -> Any:
        last[:] = [client.videos.retrieve(video_id)]
        return last[0] if last[0].status in until else None

    return poll(ready, timeout, f"video {video_id} to reach {until}", lambda: f"last seen: {last}")


def decoded(mp4: bytes) -> tuple[int, int, int]:
    """(frames, width, height) of an mp4, decoding every frame."""
    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.video[0]
        return sum(1 for _ in container.decode(stream)), stream.codec_context.width, stream.codec_context.height


def check_content(client: Any, video: Any, *, frames: int) -> None:
    """Every variant: an mp4 of `frames` frames (and a byte range of it), a thumbnail of its size,
    a spritesheet of its frames."""
    mp4 = client.videos.download_content(video.id).read()
    count, width, height = decoded(mp4)
    assert count == frames
    part = client.videos.with_raw_response.download_content(video.id, extra_headers={"Range": "bytes=0-99"})
    assert part.status_code == 206 and part.content == mp4[:100] and part.headers["content-range"] == f"bytes 0-99/{len(mp4)}"
    thumb = Image.open(io.BytesIO(client.videos.download_content(video.id, variant="thumbnail").read()))
    assert (thumb.format, thumb.size) == ("WEBP", (width, height))
    sheet = Image.open(io.BytesIO(client.videos.download_content(video.id, variant="spritesheet").read()))
    assert sheet.format == "JPEG" and sheet.width % min(256, width) == 0 and sheet.width >= min(256, width)


def create_to_completed(client: Any, *, size: str, seconds: str, frames: int, **extra: Any) -> Any:
    """create_and_poll to `completed`, then the same object from retrieve and from the list."""
    video = client.videos.create_and_poll(
        prompt="a red fox running through snow",
        model="minimax-h3",
        size=size,
        seconds=seconds,
        extra_body=extra,
        poll_interval_ms=50,
    )
    assert (video.status, video.progress, video.error) == ("completed", 100, None), video
    assert (video.object, video.model, video.size, video.seconds) == ("video", "minimax-h3", size, seconds)
    assert video.completed_at >= video.created_at and video.expires_at is None
    assert client.videos.retrieve(video.id) == video
    assert video.id in [v.id for v in client.videos.list(limit=100).data]
    check_content(client, video, frames=frames)
    return video


def remix_to_completed(client: Any, source: Any, timeout: float = 60) -> Any:
    remix = client.videos.remix(source.id, prompt="the same fox, at night")
    assert remix.remixed_from_video_id == source.id and remix.id != source.id
    assert (remix.prompt, remix.size, remix.seconds) == ("the same fox, at night", source.size, source.seconds)
    done = wait_video(client, remix.id, timeout=timeout)
    assert done.status == "completed" and done.remixed_from_video_id == source.id, done
    return done


def jobs_api(client: Any) -> httpx.Client:
    """h3core's own API (/v1/jobs) beside the SDK's, with the SDK's token."""
    return httpx.Client(base_url=str(client.base_url), headers={"Authorization": f"Bearer {client.api_key}"}, timeout=30)


def is_gone(client: Any, video_id: str) -> None:
    """A deleted video, as OpenAI's API answers: not found on every call, and not listed."""
    calls = {
        "retrieve": lambda: client.videos.retrieve(video_id),
        "download": lambda: client.videos.download_content(video_id),
        "thumbnail": lambda: client.videos.download_content(video_id, variant="thumbnail"),
        "remix": lambda: client.videos.remix(video_id, prompt="again"),
        "delete": lambda: client.videos.delete(video_id),
    }
    for name, call in calls.items():
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["code"] == "video_deleted" and "deleted at" in err.value.message, name
    assert video_id not in [v.id for v in client.videos.list(limit=100).data]


def delete_running_cancels_it(client: Any, timeout: float = 60, **create: Any) -> None:
    video = client.videos.create(**create)
    wait_video(client, video.id, ("in_progress",), timeout)
    gone = client.videos.delete(video.id)
    assert (gone.id, gone.deleted, gone.object) == (video.id, True, "video.deleted")
    is_gone(client, video.id)
    with jobs_api(client) as api:

        def ended() -> dict | None:
            job = api.get(f"jobs/{video.id}").json()
            return job if job["status"] in ("done", "failed", "cancelled") else None

        job = poll(ended, timeout, f"job {video.id} to end")
    assert job["status"] == "cancelled", job


def delete_finished_keeps_the_log(client: Any, video: Any) -> None:
    gone = client.videos.delete(video.id)
    assert (gone.id, gone.deleted, gone.object) == (video.id, True, "video.deleted")
    is_gone(client, video.id)
    with jobs_api(client) as api:
        log = api.get(f"jobs/{video.id}/events").json()
        assert log[-1]["body"]["type"] == "done"  # the job's log stays
        old = api.get(f"jobs/{video.id}/video")
        assert old.status_code == 410 and "deleted" in old.json()["detail"]


def refusals(client: Any) -> None:
    """A request over its ceiling, and sizes and models this deployment cannot serve: BadRequestError."""
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.create(prompt="a very long fox", size="448x256", seconds="100")
    body = err.value.body
    assert body["code"] == "refused" and body["type"] == "invalid_request_error"
    assert body["ceiling"]["max_frames"] < 2400 and body["ceiling"]["reason"]
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.create(prompt="a fox", size="1280x720")
    assert err.value.body["param"] == "size" and "1280x736" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.create(prompt="a fox", model="sora-2")
    assert err.value.body["param"] == "model" and "minimax-h3" in err.value.message
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve("no-such-video")
    with pytest.raises(openai.NotFoundError):
        client.videos.remix("no-such-video", prompt="x")
