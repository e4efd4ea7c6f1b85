"""What the real service refuses, and how it says so: invalid fields, requests over capacity
(the same ceilings /v1/ceilings lists), unknown or wrong uploads, and bad upload bodies."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from tests.factories import png
from tests.integration.service.conftest import DEFAULT_SERVER, SMALL, submit, wait_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def refused(client: httpx.Client, body: dict, status: int = 422) -> dict:
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == status, f"{body} -> {r.status_code} {r.text}"
    assert r.headers["content-type"].startswith("application/json")
    problem = r.json()
    assert isinstance(problem["detail"], str) and problem["detail"], problem
    return problem


def fields(problem: dict) -> list[str]:
    return [e["field"] for e in problem.get("errors") or []]


def ceiling_row(client: httpx.Client, width: int, height: int, mode: str = "t2va", **shape: int) -> dict:
    r = client.get("/v1/ceilings")
    assert r.status_code == 200, r.text
    rows = [
        row
        for row in r.json()["ceilings"]
        if (row["mode"], row["width"], row["height"]) == (mode, width, height)
        and row["keyframes"] == shape.get("keyframes", 0)
        and row["reference_images"] == shape.get("reference_images", 0)
    ]
    assert len(rows) == 1, r.json()
    return rows[0]


# -- 3. invalid fields ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "a fox", "width": 100}, "width"),  # not a multiple of 32
        ({"prompt": "a fox", "height": 16}, "height"),  # below the smallest side
        ({"prompt": "a fox", "colour": "red"}, "colour"),  # unknown field
        ({"prompt": ""}, "prompt"),
        ({"width": 448}, "prompt"),  # missing
        ({"prompt": "a fox", "steps": 0}, "steps"),
        ({"prompt": "a fox", "fps": 30}, "fps"),
        ({"prompt": "a fox", "mode": "ref2va"}, "body"),  # a rule across fields names no one field
    ],
    ids=["width", "height", "unknown", "empty-prompt", "missing-prompt", "steps", "fps", "ref2va-no-references"],
)
def test_an_invalid_field_is_422_naming_it(api, body, field):
    problem = refused(api, body)
    assert field in fields(problem), problem
    assert all(e["message"] for e in problem["errors"])


@pytest.mark.parametrize(
    "body",
    [{"frames": "124"}, {"width": 448.5}, {"steps": 1.000001}, {"turbo": "true"}, {"seed": True}],
    ids=["frames", "width", "steps", "turbo", "seed"],
)
def test_a_wrongly_typed_field_is_422_not_coerced(api, body):
    problem = refused(api, {"prompt": "a fox", **SMALL, "steps": 1, **body})
    assert list(body) == fields(problem), problem


def test_a_whole_number_written_with_a_fraction_is_that_integer(api):
    # JSON has one number type and JSON Schema's "integer" is any number with no fraction: the
    # OpenAPI document allows 448.0, so the server takes it (and "448", text, stays refused).
    job = submit(api, prompt="a fox [fake step=0]", width=448.0, frames=24.0, steps=1.0, priority=-0.0)
    assert (job["request"]["width"], job["request"]["frames"], job["request"]["steps"]) == (448, 24, 1)
    assert all(type(job["request"][k]) is int for k in ("width", "frames", "steps"))


def test_a_body_that_is_not_a_json_object_is_refused(api):
    r = api.post("/v1/jobs", content=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    r = api.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["detail"]


# -- 3. over capacity, and the ceilings table -----------------------------------------------------


def test_over_capacity_is_422_with_the_ceiling_that_v1_ceilings_lists(api):
    problem = refused(api, {"prompt": "a long fox", "frames": 900})  # at the default 1344x768, t2va
    assert set(problem) == {"detail", "ceiling", "reason", "errors"}, problem
    assert problem["errors"] == [{"field": "frames", "message": problem["detail"]}]
    assert problem["reason"] == "vram"
    assert problem["ceiling"]["max_frames"] == 430
    assert problem["ceiling"]["reason"] == "vram"
    assert problem["ceiling"]["verified"] is True
    assert "430" in problem["detail"]

    row = ceiling_row(api, 1344, 768)
    assert row["max_frames"] == problem["ceiling"]["max_frames"] == 430
    assert row["reason"] == "vram"
    assert row["max_seconds"] == pytest.approx(430 / 24, abs=1e-3)

    # The ceiling is exact: one frame more is refused with the same ceiling, the ceiling itself admitted.
    assert refused(api, {"prompt": "a long fox", "frames": 431})["ceiling"]["max_frames"] == 430
    at_ceiling = submit(api, prompt="a long fox", width=1344, height=768, frames=430, steps=1)
    assert at_ceiling["tokens"] == row["tokens_at_max"]
    r = api.post(f"/v1/jobs/{at_ceiling['id']}/cancel")
    assert r.status_code in (202, 409)
    wait_job(api, at_ceiling["id"])


def test_over_the_quality_cap_is_422_with_reason_quality(api):
    problem = refused(api, {"prompt": "a long fox", "width": 448, "height": 256, "frames": 1201})
    assert problem["ceiling"]["max_frames"] == 1200
    assert problem["ceiling"]["reason"] == "quality"
    row = ceiling_row(api, 448, 256)
    assert (row["max_frames"], row["reason"]) == (1200, "quality")


def test_ceilings_lists_every_profile_resolution_and_mode(api):
    r = api.get("/v1/ceilings")
    assert r.status_code == 200
    body = r.json()
    assert body["profile"] == "4x2080ti-sage-fp16"
    assert body["api_max_frames"] == 1200 and body["fps"] == 24
    assert body["executor"] == "fake" and body["budgets"] == [
        {"group_size": 1, "tokens": 133_236, "verified": True, "source": "profile 4x2080ti-sage-fp16"}
    ]
    shapes = {(c["width"], c["height"]) for c in body["ceilings"]}
    assert shapes == {(832, 480), (1024, 576), (1344, 768), (448, 256)}
    for w, h in shapes:
        modes = {(c["mode"], c["keyframes"]) for c in body["ceilings"] if (c["width"], c["height"]) == (w, h)}
        assert {("t2va", 0), ("fl2va", 1), ("fl2va", 2), ("ref2va", 0)} <= modes
    refs = [c for c in body["ceilings"] if c["mode"] == "ref2va"]
    assert refs and all(c["verified"] is False for c in refs)  # the reference budget is unmeasured


# -- 3. uploads -----------------------------------------------------------------------------------


def upload(client: httpx.Client, data: bytes, content_type: str) -> httpx.Response:
    return client.post("/v1/uploads", content=data, headers={"Content-Type": content_type})


def ref2va(*images: str) -> dict:
    return {"prompt": "a fox like this one", **SMALL, "steps": 1, "mode": "ref2va", "references": {"images": list(images)}}


def test_a_request_needs_its_uploads_to_exist(api):
    missing = "u_" + "0" * 32
    problem = refused(api, ref2va(missing), 404)  # an id of the right form that no upload has
    assert fields(problem) == ["references.images.0"], problem
    assert missing in problem["errors"][0]["message"] and problem["errors"][0]["upload_id"] == missing

    image = png(64, 48)
    r = upload(api, image, "image/png")
    assert r.status_code == 201, r.text
    up = r.json()
    assert up["id"].startswith("u_") and up["kind"] == "image" and up["content_type"] == "image/png"
    assert up["bytes"] == len(image) and up["sha256"] == hashlib.sha256(image).hexdigest()
    assert (up["width"], up["height"]) == (64, 48)

    job = submit(api, **ref2va(up["id"]))
    assert job["request"]["mode"] == "ref2va"
    assert job["request"]["references"]["images"] == [up["id"]]
    # Only the missing one is named when one of two is missing.
    problem = refused(api, ref2va(up["id"], missing), 404)
    assert fields(problem) == ["references.images.1"], problem
    # An image is not a video.
    problem = refused(api, {**ref2va(up["id"]), "references": {"videos": [up["id"]]}})
    assert fields(problem) == ["references.videos.0"], problem
    # Keyframes are checked the same way.
    fl2va = {"prompt": "from this frame", **SMALL, "steps": 1, "mode": "fl2va"}
    assert fields(refused(api, {**fl2va, "keyframes": {"first": missing}}, 404)) == ["keyframes.first"]
    first = submit(api, **fl2va, keyframes={"first": up["id"]})
    assert wait_job(api, job["id"])["status"] == "done"
    assert wait_job(api, first["id"])["status"] == "done"


@pytest.mark.parametrize(
    ("data", "content_type", "status", "field"),
    [
        (png(), "image/jpeg", 415, "content-type"),  # the bytes say PNG
        (png(), "text/html", 415, "content-type"),  # not an accepted type at all
        (b"", "image/png", 422, "body"),  # empty
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "image/png", 422, "body"),  # a PNG signature, no picture
    ],
    ids=["png-as-jpeg", "html", "empty", "undecodable"],
)
def test_a_bad_upload_is_refused(api, data, content_type, status, field):
    r = upload(api, data, content_type)
    assert r.status_code == status, r.text
    problem = r.json()
    assert problem["detail"]
    assert [e["field"] for e in problem["errors"]] == [field], problem


@DEFAULT_SERVER
def test_the_default_server_states_only_the_models_window(default_server):
    """The default server (the pipeline on the tiny model, on a CPU): no profile describes it, so
    /v1/ceilings shows no ceiling but the model's window and the longest video made as segments past
    it (H3_MAX_VIDEO_SECONDS), and a submit past that is refused so."""
    with default_server.client() as api:
        body = api.get("/v1/ceilings").json()
        assert body["profile"] is None and body["window"] == {
            "min_seconds": 0.0,
            "max_seconds": 15.0,
            "source": "model facts of minimax-h3-tiny",
        }
        rows = {(c["mode"] == "ref2va", c["max_frames"], c["reason"]) for c in body["ceilings"]}
        assert rows == {(False, 1440, "api_limit"), (True, 345, "model_window")}, "ref2va is never made as segments"
        problem = refused(api, {"prompt": "a long fox", "width": 64, "height": 64, "frames": 1441})
        assert problem["reason"] == "api_limit" and problem["ceiling"]["max_frames"] == 1440
        assert "a video made as segments is at most 60 s (1440 frames)" in problem["detail"]
        assert problem["errors"] == [{"field": "frames", "message": problem["detail"]}], "named like every other 422"
