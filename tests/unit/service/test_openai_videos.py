"""The OpenAI Videos mapping, without I/O: video objects from job states, create parameters to
h3core's request, the SDK's multipart encoding read back, errors in OpenAI's shape."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3core.domain.events import Admitted, Cancelled, CancelRequested, Done, Failed, Progress, Running, Submitted
from h3core.domain.request import MAX_SIDE
from h3core.domain.state import JobState
from h3core.domain.state import extend as extend
from h3core.service.openai_videos import (
    FPS,
    SECONDS_PATTERN,
    SIZE_PATTERN,
    VideoApiError,
    error_body,
    frames_for,
    param_for,
    parse_size,
    poll_after_ms,
    progress,
    request_fields,
    seconds_text,
    unflatten_form,
    video_object,
)
from tests.factories import artifact, request

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SERVED = ("minimax-h3", "h3-alias")


def state_after(*bodies, at: datetime = T0, remixed_from: str | None = None) -> JobState:
    first = Submitted(request=request(width=448, height=256, frames=96, prompt="a fox"), remixed_from=remixed_from)
    state, _ = extend(None, "job1", [first, *bodies], at)
    return state


RUNNING = (Admitted(), Running(attempt=1, executor="fake"))


# -- the video object -------------------------------------------------------------------------


def test_each_job_status_becomes_openais_status_with_its_fields():
    queued = video_object(state_after(Admitted()), model="minimax-h3")
    assert queued.model_dump() == {
        "id": "job1",
        "object": "video",
        "model": "minimax-h3",
        "status": "queued",
        "progress": 0,
        "created_at": int(T0.timestamp()),
        "completed_at": None,
        "expires_at": None,
        "prompt": "a fox",
        "size": "448x256",
        "seconds": "4",
        "remixed_from_video_id": None,
        "error": None,
    }
    running = video_object(state_after(*RUNNING, Progress(step=3, total=4)), model="m")
    assert (running.status, running.progress) == ("in_progress", 75)
    done = video_object(state_after(*RUNNING, Done(artifact=artifact())), model="m")
    assert (done.status, done.progress, done.completed_at, done.error) == ("completed", 100, int(T0.timestamp()), None)
    oom = video_object(state_after(*RUNNING, Failed(kind="oom", message="out of memory at step 2")), model="m")
    assert (
        oom.status == "failed"
        and oom.error is not None
        and (oom.error.code, oom.error.message) == ("oom", "out of memory at step 2")
    )
    cancelled = video_object(state_after(*RUNNING, CancelRequested(), Cancelled()), model="m")
    assert cancelled.status == "failed" and cancelled.error is not None and cancelled.error.code == "cancelled"
    assert cancelled.completed_at == int(T0.timestamp())


def test_a_remix_names_its_source_and_no_video_expires():
    state = state_after(*RUNNING, Done(artifact=artifact()), remixed_from="job0")
    video = video_object(state, model="m")
    assert video.remixed_from_video_id == "job0"
    assert video.expires_at is None and video.status == "completed"


@given(st.integers(1, 500).flatmap(lambda total: st.tuples(st.integers(1, total), st.just(total))))
def test_progress_is_0_to_99_from_the_steps_and_100_only_when_done(step_total):
    step, total = step_total
    state = state_after(*RUNNING, Progress(step=step, total=total))
    assert progress(state) == min(99, step * 100 // total)
    assert progress(state) < 100
    assert progress(state_after(*RUNNING, Progress(step=step, total=total), Done(artifact=artifact()))) == 100


def test_the_poll_hint_follows_the_step_pace_within_bounds_and_stops_at_the_end():
    running = state_after(*RUNNING, Progress(step=4, total=10))
    assert poll_after_ms(running, T0 + timedelta(seconds=2)) == 500  # 0.5 s a step
    assert poll_after_ms(running, T0 + timedelta(milliseconds=4)) == 100  # never below 100 ms
    assert poll_after_ms(running, T0 + timedelta(hours=1)) == 5000  # nor above 5 s
    assert poll_after_ms(state_after(Admitted()), T0) == 1000
    assert poll_after_ms(state_after(*RUNNING, Done(artifact=artifact())), T0) is None


# -- seconds and size -------------------------------------------------------------------------


@given(st.integers(1, 100_000))
def test_seconds_text_reads_back_as_the_same_frames(frames):
    assert frames_for(seconds_text(frames)) == frames


def test_seconds_are_frames_at_24_fps():
    assert [seconds_text(f) for f in (96, 24, 22, 124)] == ["4", "1", "0.917", "5.167"]
    assert frames_for("4") == 96 and frames_for(8) == 192 and frames_for(0.5) == 12 and frames_for(" 12 ") == 12 * FPS


@pytest.mark.parametrize("value", ["0", "-1", "0.0", "four", "", "nan", "inf", "1e308", 10**400, "4167", None, True, [4]])
def test_seconds_that_are_no_positive_length_are_refused_naming_seconds(value):
    with pytest.raises(VideoApiError) as err:
        frames_for(value)
    assert (err.value.status, err.value.param) == (400, "seconds")


@given(st.from_regex(SECONDS_PATTERN, fullmatch=True))
def test_every_length_the_document_allows_is_taken_and_at_least_one_frame(text):
    frames = frames_for(text)
    assert 1 <= frames <= 24_000 and frames == max(1, round(float(text) * FPS))


def test_a_positive_length_under_a_frame_is_one_frame():
    assert frames_for("0.01") == 1 and frames_for("0.001") == 1


@given(st.integers(1, MAX_SIDE // 32), st.integers(1, MAX_SIDE // 32))
def test_every_size_on_the_32_pixel_grid_is_accepted(w, h):
    assert parse_size(f"{w * 32}x{h * 32}") == (w * 32, h * 32)


@given(st.integers(1, 5000), st.integers(1, 5000))
def test_a_size_off_the_grid_is_refused_naming_the_nearest_one_that_is_on_it(w, h):
    on_grid = all(s % 32 == 0 and 32 <= s <= MAX_SIDE for s in (w, h))
    if on_grid:
        assert parse_size(f"{w}x{h}") == (w, h)
        return
    with pytest.raises(VideoApiError) as err:
        parse_size(f"{w}x{h}")
    assert err.value.param == "size"
    nearest = err.value.message.rsplit(" ", 1)[-1]
    sides = tuple(int(s) for s in nearest.split("x"))
    assert parse_size(nearest) == sides  # what it names, it makes
    for asked, near in zip((w, h), sides, strict=True):
        assert abs(near - min(max(asked, 32), MAX_SIDE)) <= 16


def test_openais_named_sizes_the_model_cannot_make_are_refused_clearly():
    for size in ("720x1280", "1280x720"):
        with pytest.raises(VideoApiError, match=r"720 is not a multiple of 32; the nearest size it makes is"):
            parse_size(size)
    for size, fault in (
        ("4480x256", "4480 is above 4096"),
        ("16x256", "16 is below 32"),
        ("4500x16", "4500 is above 4096 and 16"),
    ):
        with pytest.raises(VideoApiError, match=fault):
            parse_size(size)  # a multiple of 32 out of range is not called "not a multiple of 32"
    assert parse_size("1024x1792") == (1024, 1792) and parse_size("1792x1024") == (1792, 1024)
    for junk in ("1280", "1280x", "axb", 1280, None):
        with pytest.raises(VideoApiError, match="WIDTHxHEIGHT"):
            parse_size(junk)


# -- create parameters ------------------------------------------------------------------------


def test_openai_parameters_map_to_h3cores_fields_and_its_own_fields_pass_through():
    params = {"prompt": "p", "model": "h3-alias", "size": "448x256", "seconds": "2", "steps": 3, "seed": 9}
    assert request_fields(params, served=SERVED) == {
        "prompt": "p",
        "width": 448,
        "height": 256,
        "frames": 48,
        "steps": 3,
        "seed": 9,
    }
    assert request_fields({"prompt": "p", "size": None, "seconds": None, "model": None}, served=SERVED) == {"prompt": "p"}
    with_image = request_fields({"prompt": "p", "input_reference": object()}, served=SERVED, first_frame="u_1")
    assert with_image == {"prompt": "p", "mode": "fl2va", "keyframes": {"first": "u_1"}}


@pytest.mark.parametrize(
    ("params", "first_frame", "param", "says"),
    [
        ({"prompt": "p", "model": "sora-2"}, None, "model", "serves: minimax-h3, h3-alias"),
        ({"prompt": "p", "size": "64x64", "width": 64}, None, "size", "give size or width, not both"),
        ({"prompt": "p", "seconds": "1", "frames": 24}, None, "seconds", "give seconds or frames, not both"),
        ({"prompt": "p", "keyframes": {"first": "u_2"}}, "u_1", "input_reference", "not both"),
        ({"prompt": "p", "mode": "ref2va"}, "u_1", "input_reference", "needs mode 'fl2va'"),
    ],
)
def test_conflicting_or_unknown_create_parameters_are_refused_naming_the_parameter(params, first_frame, param, says):
    with pytest.raises(VideoApiError, match=says) as err:
        request_fields(params, served=SERVED, first_frame=first_frame)
    assert (err.value.status, err.value.param) == (400, param)


def test_validation_errors_point_at_the_openai_parameter_that_set_the_field():
    params = {"size": "64x64", "seconds": "1", "input_reference": "x"}
    assert param_for(("width",), params) == "size" and param_for(("frames",), params) == "seconds"
    assert param_for(("keyframes", "first"), params) == "input_reference"
    assert param_for(("keyframes", "first"), {}) == "keyframes.first"
    assert param_for(("width",), {}) == "width" and param_for((), {}) is None


# -- the SDK's multipart encoding, read back --------------------------------------------------


@pytest.fixture(scope="module")
def sdk():
    openai = pytest.importorskip("openai")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return openai.OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")


def sdk_form_items(client, data: dict) -> list[tuple[str, object]]:
    """What the real openai SDK puts in a multipart body for `data` (its own serializer)."""
    items = []
    for key, value in client._serialize_multipartform(data).items():
        items += [(key, v) for v in value] if isinstance(value, list) else [(key, value)]
    return items


def as_form_strings(value):
    if isinstance(value, dict):
        return {k: as_form_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_form_strings(v) for v in value]
    return str(value).lower() if isinstance(value, bool) else str(value)


upload_ids = st.from_regex(r"u_[0-9a-f]{8}", fullmatch=True)
extra_bodies = st.fixed_dictionaries(
    {"prompt": st.text(min_size=1, max_size=20), "steps": st.integers(1, 50)},
    optional={
        "seed": st.integers(0, 2**40),
        "turbo": st.booleans(),
        "keyframes": st.fixed_dictionaries({"first": upload_ids}, optional={"last": upload_ids}),
        "references": st.fixed_dictionaries(
            {"images": st.lists(upload_ids, min_size=1, max_size=4)},
            optional={"audios": st.lists(upload_ids, min_size=1, max_size=3)},
        ),
    },
)


@given(body=extra_bodies)
def test_what_the_sdk_flattens_into_form_fields_reads_back_as_the_same_data(sdk, body):
    assert unflatten_form(sdk_form_items(sdk, body)) == as_form_strings(body)


@pytest.mark.parametrize(
    "items",
    [
        [("prompt", "a"), ("prompt", "b")],
        [("keyframes", "x"), ("keyframes[first]", "y")],
        [("references[images][]", "a"), ("references[images][x]", "b")],
        [("bad]name", "x")],
    ],
)
def test_form_fields_that_contradict_each_other_are_refused_naming_the_field(items):
    with pytest.raises(VideoApiError) as err:
        unflatten_form(items)
    assert err.value.status == 400 and err.value.param == items[-1][0]


# -- errors -----------------------------------------------------------------------------------


def test_errors_have_openais_shape_and_a_refusal_carries_its_ceiling():
    assert error_body(404, "no video 'x'", param="video_id", code="video_not_found") == {
        "error": {"message": "no video 'x'", "type": "invalid_request_error", "param": "video_id", "code": "video_not_found"}
    }
    ceiling = {"max_frames": 1200, "reason": "quality", "verified": True}
    refused = VideoApiError(400, "too long", code="refused", ceiling=ceiling).body()
    assert refused["error"]["ceiling"] == ceiling and refused["error"]["param"] is None
    assert error_body(503, "stopping")["error"]["type"] == "server_error"


@given(st.from_regex(SIZE_PATTERN, fullmatch=True))
def test_every_size_the_document_allows_is_made(text):
    w, h = parse_size(text)
    assert f"{w}x{h}" == text


@given(st.text(max_size=12))
def test_a_size_the_document_refuses_is_refused(text):
    import re

    if re.fullmatch(SIZE_PATTERN, text) is None and re.fullmatch(r"\s*\d+\s*[xX]\s*\d+\s*", text) is None:
        with pytest.raises(VideoApiError):
            parse_size(text)
