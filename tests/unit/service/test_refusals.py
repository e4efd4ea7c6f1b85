"""What the service refuses, and how it says so: each case in the shape of its API (h3core's
`detail` and `errors` on /v1/jobs, OpenAI's `error` on /v1/videos), naming the field at fault."""

from __future__ import annotations

import pytest

from tests.unit.service.conftest import QUICK

BLANK = ["", " ", "   \t\n", "\u3000\u00a0", "\x1c\x1f"]


def job_error(r) -> tuple[str, str]:
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    return error["field"], error["message"]


def video_error(r, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


@pytest.mark.parametrize("prompt", BLANK)
def test_a_blank_prompt_is_refused_naming_it(client, prompt):
    field, message = job_error(client.post("/v1/jobs", json={**QUICK, "prompt": prompt}))
    assert field == "prompt" and ("whitespace" in message or "at least 1" in message), message
    error = video_error(client.post("/v1/videos", json={**QUICK, "prompt": prompt}))
    assert error["param"] == "prompt", error
    form = client.post("/v1/videos", files={"prompt": (None, prompt)})  # as the SDK sends it with a file
    assert video_error(form)["param"] == "prompt", form.text


def test_a_blank_remix_prompt_is_refused_naming_it(client):
    source = client.post("/v1/videos", json={**QUICK, "prompt": "a slow fox [fake step=5]"}).json()["id"]
    for prompt in BLANK:
        error = video_error(client.post(f"/v1/videos/{source}/remix", json={"prompt": prompt}))
        assert error["param"] == "prompt", error
    client.delete(f"/v1/videos/{source}")


@pytest.mark.parametrize("upload_id", ["abc", "up-first", "u_" + "0" * 31, "u_" + "G" * 32, "U_" + "0" * 32])
def test_an_upload_id_that_no_upload_could_have_is_refused_by_its_form(client, upload_id):
    body = {**QUICK, "mode": "fl2va", "keyframes": {"first": upload_id}}
    field, message = job_error(client.post("/v1/jobs", json=body))
    assert field == "keyframes.first" and "^u_[0-9a-f]{32}$" in message, message
    refs = {**QUICK, "mode": "ref2va", "references": {"images": [upload_id]}}
    assert job_error(client.post("/v1/jobs", json=refs))[0] == "references.images.0"
    error = video_error(client.post("/v1/videos", json={"prompt": "p", "input_reference": {"file_id": upload_id}}))
    assert error["param"] == "input_reference" and "^u_[0-9a-f]{32}$" in error["message"], error


def test_a_well_formed_upload_id_that_does_not_exist_is_404_naming_the_field_and_the_id(client):
    # The request is as the document says; what it names is not there (as a job id in a path that is not).
    missing = "u_" + "0" * 32
    r = client.post("/v1/jobs", json={**QUICK, "mode": "fl2va", "keyframes": {"first": missing}})
    assert r.status_code == 404, r.text
    message = f"no upload {missing!r} (POST /v1/uploads first)"
    assert r.json() == {
        "detail": f"keyframes.first: {message}",
        "errors": [{"field": "keyframes.first", "message": message, "upload_id": missing}],
    }
    r = client.post("/v1/jobs", json={**QUICK, "mode": "ref2va", "references": {"images": [missing, "u_" + "1" * 32]}})
    assert r.status_code == 404, r.text
    assert [(e["field"], e["upload_id"]) for e in r.json()["errors"]] == [
        ("references.images.0", missing),
        ("references.images.1", "u_" + "1" * 32),
    ]
    error = video_error(client.post("/v1/videos", json={"prompt": "p", "input_reference": {"file_id": missing}}), 404)
    assert error == {"message": message, "type": "invalid_request_error", "param": "input_reference", "code": "upload_not_found"}
    body = {"prompt": "p", "mode": "ref2va", "references": {"videos": [missing]}}
    error = video_error(client.post("/v1/videos", json=body), 404)
    assert (error["param"], error["code"]) == ("references.videos.0", "upload_not_found"), error


def test_an_upload_that_exists_is_taken_and_one_of_the_wrong_kind_stays_422(client):
    from tests.factories import png

    image = client.post("/v1/uploads", content=png(64, 48), headers={"Content-Type": "image/png"})
    assert image.status_code == 201, image.text
    upload_id = image.json()["id"]
    r = client.post("/v1/jobs", json={**QUICK, "mode": "fl2va", "keyframes": {"first": upload_id}})
    assert r.status_code == 201, r.text
    assert r.json()["request"]["keyframes"]["first"] == upload_id
    video = client.post("/v1/videos", json={"prompt": "p", "seconds": "1", "input_reference": {"file_id": upload_id}})
    assert video.status_code == 200, video.text
    # An image where a video goes: there, but not what the field takes (and with it, one missing).
    refs = {"images": [upload_id], "videos": [upload_id, "u_" + "0" * 32]}
    r = client.post("/v1/jobs", json={**QUICK, "mode": "ref2va", "references": refs})
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["references.videos.0", "references.videos.1"]
    error = video_error(client.post("/v1/videos", json={"prompt": "p", "mode": "ref2va", "references": {"videos": [upload_id]}}))
    assert (error["param"], error["code"]) == ("references.videos.0", "invalid_upload"), error


INTERNAL = ("JobCreate", "VideoCreate", "Remix", "GenerationRequest", "instance of")
NOT_JSON = [b"{", b'{"prompt": "a fox",}', b"\xff\xfe", b"[" * 100_000]
NOT_AN_OBJECT = [(b"[1,2]", "an array"), (b"null", "null"), (b'"a fox"', "a string"), (b"3", "a number")]


def json_post(client, path: str, body: bytes):
    return client.post(path, content=body, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("body", NOT_JSON, ids=["truncated", "trailing-comma", "not-utf8", "too-deep"])
def test_a_body_that_is_not_json_is_400_with_errors_like_every_refusal(client, body):
    r = json_post(client, "/v1/jobs", body)
    assert r.status_code == 400, r.text
    problem = r.json()
    assert problem["errors"] == [{"field": "body", "message": problem["detail"]}] and "not valid JSON" in problem["detail"]
    source = client.post("/v1/videos", json={"prompt": "a slow fox [fake step=5]"}).json()["id"]
    for path in ("/v1/videos", f"/v1/videos/{source}/remix"):
        error = video_error(json_post(client, path, body))
        assert error["code"] == "invalid_json" and "not valid JSON" in error["message"], (path, error)
    client.delete(f"/v1/videos/{source}")


@pytest.mark.parametrize(("body", "kind"), NOT_AN_OBJECT, ids=[k for _, k in NOT_AN_OBJECT])
def test_a_body_that_is_not_an_object_says_so_in_the_clients_terms(client, body, kind):
    source = client.post("/v1/videos", json={"prompt": "a slow fox [fake step=5]"}).json()["id"]
    field, message = job_error(json_post(client, "/v1/jobs", body))
    assert field == "body" and f"must be a JSON object with at least 'prompt', not {kind}" in message, message
    for path in ("/v1/videos", f"/v1/videos/{source}/remix"):
        r = json_post(client, path, body)
        error = video_error(r)
        assert f"must be a JSON object with at least 'prompt', not {kind}" in error["message"], (path, error)
        assert error["param"] is None and not any(name in r.text for name in INTERNAL), r.text
    assert not any(name in json_post(client, "/v1/jobs", body).text for name in INTERNAL)
    client.delete(f"/v1/videos/{source}")


@pytest.mark.parametrize(
    ("field", "value", "nearest"), [("width", 333, 320), ("height", 5000, 4096), ("width", 0, 32), ("height", 40, 32)]
)
def test_a_side_the_model_cannot_make_names_the_rule_and_the_nearest_side(client, field, value, nearest):
    rule = "MiniMax-H3 makes sides that are multiples of 32 from 32 to 4096"
    got, message = job_error(client.post("/v1/jobs", json={**QUICK, field: value}))
    assert got == field and rule in message and message.endswith(f"the nearest side it makes is {nearest}"), message
    error = video_error(client.post("/v1/videos", json={"prompt": "a fox", field: value}))  # h3core's field, as extra_body
    assert error["param"] == field and rule in error["message"] and error["message"].endswith(f"is {nearest}"), error
    size = {"width": f"{value}x256", "height": f"448x{value}"}[field]
    error = video_error(client.post("/v1/videos", json={"prompt": "a fox", "size": size}))  # OpenAI's: the same words
    assert error["param"] == "size" and rule in error["message"], error
    assert error["message"].endswith({"width": f"{nearest}x256", "height": f"448x{nearest}"}[field]), error
