from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from h3core.domain.request import GenerationRequest
from tests.strategies import requests


def error_fields(body: dict) -> list[str]:
    with pytest.raises(ValidationError) as err:
        GenerationRequest.model_validate(body)
    return [".".join(str(p) for p in e["loc"]) for e in err.value.errors()]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"width": 100}, "width"),
        ({"height": 16}, "height"),
        ({"frames": 0}, "frames"),
        ({"steps": 0}, "steps"),
        ({"seed": -1}, "seed"),
        ({"fps": 30}, "fps"),
        ({"prompt": ""}, "prompt"),
        ({"mode": "i2v"}, "mode"),
        ({"frames": "124"}, "frames"),  # strict: no silent coercion of strings
        ({"surprise": 1}, "surprise"),  # unknown fields are refused, not ignored
        ({"mode": "ref2va", "references": {"images": ["../../etc/passwd"]}}, "references.images.0"),
        ({"mode": "ref2va", "references": {"images": [f"i{n}" for n in range(10)]}}, "references.images"),
        ({"mode": "ref2va", "references": {"audios": ["a", "b", "c", "d"]}}, "references.audios"),
        ({"mode": "fl2va", "keyframes": {"first": "a/b"}}, "keyframes.first"),
    ],
)
def test_validation_errors_name_the_field(patch, field):
    assert field in error_fields({"prompt": "p", **patch})


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"mode": "fl2va"}, "needs 'keyframes'"),
        ({"mode": "ref2va"}, "needs 'references'"),
        ({"mode": "t2va", "keyframes": {"first": "a"}}, "only accepted with mode 'fl2va'"),
        ({"mode": "fl2va", "keyframes": {}}, "at least one of 'first' or 'last'"),
        ({"mode": "ref2va", "references": {}}, "at least one image"),
    ],
)
def test_mode_inputs_are_checked(body, text):
    with pytest.raises(ValidationError, match=text):
        GenerationRequest.model_validate({"prompt": "p", **body})


def test_inert_fields_are_accepted_and_each_gives_a_warning():
    r = GenerationRequest(prompt="p", cfg_scale=7.0, negative_prompt="blurry", turbo=False)
    assert [w.split("'")[1] for w in r.warnings()] == ["cfg_scale", "negative_prompt", "turbo"]
    assert GenerationRequest(prompt="p").warnings() == ()


@pytest.mark.parametrize(
    ("frames", "said"), [(48, "48 frames snapped to 56: MiniMax-H3 makes 17n+5"), (1, "1 frames snapped to 5")]
)
def test_a_frame_count_the_model_does_not_make_is_a_warning(frames, said):
    assert GenerationRequest(prompt="p", frames=frames).warnings()[-1].startswith(said)


@pytest.mark.parametrize("frames", [5, 22, 56, 124, 362, 1127])
def test_a_frame_count_the_model_makes_is_not(frames):
    assert GenerationRequest(prompt="p", frames=frames).warnings() == ()


def test_upload_ids_lists_keyframes_and_references():
    r = GenerationRequest(prompt="p", mode="ref2va", references={"images": ["a", "b"], "audios": ["c"]})
    assert r.upload_ids() == ("a", "b", "c")


@given(requests)
def test_requests_round_trip_through_json(req):
    assert GenerationRequest.model_validate_json(req.model_dump_json()) == req


@given(st.integers(-(2**70), 2**70))
def test_frames_outside_the_field_bounds_are_refused_by_name(frames):
    body = {"prompt": "p", "frames": frames}
    if 1 <= frames <= 100_000:
        assert GenerationRequest.model_validate(body).frames == frames
    else:
        assert error_fields(body) == ["frames"]
