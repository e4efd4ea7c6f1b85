"""The OpenAPI document the service serves says what the server does: each case here is one
that schemathesis (`--checks all`) found the document and the server disagreeing on."""

from __future__ import annotations

import re

import pytest
from jsonschema import Draft202012Validator

from tests.unit.service.conftest import finished_video

UPLOAD_ID = "^u_[0-9a-f]{32}$"


@pytest.fixture(scope="module")
def document(client) -> dict:
    r = client.get("/schema/openapi.json")
    assert r.status_code == 200, r.text
    return r.json()


def body_schema(document: dict, path: str, method: str = "post", media: str = "application/json") -> dict:
    return document["paths"][path][method]["requestBody"]["content"][media]["schema"]


def valid(document: dict, schema: dict, value: object) -> bool:
    return Draft202012Validator({**schema, "components": document["components"]}).is_valid(value)


def test_upload_ids_have_the_form_the_upload_store_mints(document):
    schemas = document["components"]["schemas"]
    job = schemas["JobCreate"]["properties"]
    keyframes = schemas[job["keyframes"]["anyOf"][0]["$ref"].rsplit("/", 1)[1]]["properties"]
    references = schemas[job["references"]["anyOf"][0]["$ref"].rsplit("/", 1)[1]]["properties"]
    assert keyframes["first"]["anyOf"][0]["pattern"] == UPLOAD_ID == keyframes["last"]["anyOf"][0]["pattern"]
    for kind in ("images", "videos", "audios"):
        assert references[kind]["items"]["pattern"] == UPLOAD_ID, kind
    assert schemas["FileReference"]["properties"]["file_id"]["pattern"] == UPLOAD_ID
    jobs, videos = body_schema(document, "/v1/jobs"), body_schema(document, "/v1/videos")
    for bad in ("abc", "up-first", "u_" + "0" * 31):
        assert not valid(document, jobs, {"prompt": "p", "mode": "fl2va", "keyframes": {"first": bad}}), bad
        assert not valid(document, videos, {"prompt": "p", "input_reference": {"file_id": bad}}), bad
    assert valid(document, jobs, {"prompt": "p", "mode": "fl2va", "keyframes": {"first": "u_" + "a" * 32}})


def test_a_prompt_is_documented_as_not_blank_wherever_one_is_taken(document):
    remix = body_schema(document, "/v1/videos/{video_id}/remix")
    form = body_schema(document, "/v1/videos", media="multipart/form-data")
    for name, schema, extra in [
        ("jobs", body_schema(document, "/v1/jobs"), {}),
        ("videos", body_schema(document, "/v1/videos"), {}),
        ("remix", remix, {}),
        ("form", form, {}),
    ]:
        for blank in ("", " ", "\t\n", "\u3000", "\x1f"):
            assert not valid(document, schema, {"prompt": blank, **extra}), (name, blank)
        assert valid(document, schema, {"prompt": " a fox "}), name
    prompt = document["components"]["schemas"]["Remix"]["properties"]["prompt"]
    assert prompt["minLength"] == 1 and prompt["maxLength"] == 8000 and re.search(prompt["pattern"], " x ")


def test_an_input_reference_needs_image_data_as_a_data_url_or_a_file(client, document):
    videos = body_schema(document, "/v1/videos")
    assert not valid(document, videos, {"prompt": "p", "input_reference": {"image_url": "data:image/png;base64,"}})
    assert valid(document, videos, {"prompt": "p", "input_reference": {"image_url": "data:image/png;base64,iVBO"}})
    form = body_schema(document, "/v1/videos", media="multipart/form-data")
    assert form["properties"]["input_reference"]["minLength"] == 1
    empty = client.post("/v1/videos", data={"prompt": "a fox"}, files={"input_reference": ("f.png", b"", "image/png")})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "input_reference", empty.text


def documents(content: dict, media_type: str) -> bool:
    main = media_type.split(";")[0].strip().split("/")[0]
    return media_type.split(";")[0].strip() in content or f"{main}/*" in content


def test_every_file_is_sent_in_a_type_its_route_documents(client, document):
    video = finished_video(client)
    content = document["paths"]["/v1/videos/{video_id}/content"]["get"]["responses"]
    jobs = document["paths"]["/v1/jobs/{job_id}/video"]
    for variant, sent in [("thumbnail", "image/webp"), ("spritesheet", "image/jpeg"), ("video", None)]:
        r = client.get(f"/v1/videos/{video['id']}/content", params={"variant": variant})
        assert r.status_code == 200, r.text
        assert sent is None or r.headers["content-type"] == sent
        assert documents(content["200"]["content"], r.headers["content-type"]), (variant, r.headers["content-type"])
    ranged = {"Range": "bytes=0-9"}
    r = client.get(f"/v1/videos/{video['id']}/content", headers=ranged)
    assert r.status_code == 206 and documents(content["206"]["content"], r.headers["content-type"])
    for method in ("get", "head"):
        for headers, status in (({}, "200"), (ranged, "206")):
            r = client.request(method.upper(), f"/v1/jobs/{video['id']}/video", headers=headers)
            assert r.status_code == int(status), r.text
            assert documents(jobs[method]["responses"][status]["content"], r.headers["content-type"]), (method, status)


def test_the_schema_page_loads_everything_from_the_service_itself(client):
    """An offline GPU box shows it: no asset from a CDN (Litestar's default loads Swagger UI from one)."""
    page = client.get("/schema")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text
    urls = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]+)""", page.text)
    assert len(urls) >= 3, urls  # the script, its preset and the style at least
    assert "://" not in page.text.split("<body", 1)[0]
    kinds = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url  # same origin
        r = client.get(url)
        assert r.status_code == 200 and r.content, (url, r.status_code)
        assert r.headers["content-type"].split(";")[0] == kinds[url[url.rindex(".") :]], (url, r.headers["content-type"])
    assert b"SwaggerUIBundle" in client.get(next(u for u in urls if u.endswith("-bundle.js"))).content


@pytest.mark.parametrize("name", ["swagger-editor-bundle.js", "index.css", "..%2F__init__.py", "LICENSE"])
def test_only_the_pages_own_assets_are_served(client, name):
    assert client.get(f"/schema/assets/{name}").status_code == 404


def test_a_webhook_filter_without_a_webhook_is_refused_by_the_document_as_by_the_server(document, client):
    jobs = body_schema(document, "/v1/jobs")
    job = {"prompt": "a fox", "width": 64, "height": 64, "frames": 24, "steps": 2}
    assert valid(document, jobs, job) and valid(document, jobs, {**job, "webhook_events_filter": None})
    assert not valid(document, jobs, {**job, "webhook_events_filter": ["completed"]})
    assert not valid(document, jobs, {**job, "webhook": None, "webhook_events_filter": ["completed"]})
    r = client.post("/v1/jobs", json={**job, "webhook_events_filter": ["completed"]})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "webhook_events_filter", r.text
