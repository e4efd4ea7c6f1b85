"""Every route bounds its body before it parses it, and a 413 names the limit in bytes and the
setting behind it: H3_MAX_BODY_BYTES for JSON (/v1/jobs, /v1/videos, remix), H3_MAX_UPLOAD_BYTES
for files (POST /v1/uploads, a multipart /v1/videos)."""

from __future__ import annotations

import io
import json
import random

import pytest
from PIL import Image

JSON_LIMIT = 4096
IMAGE_LIMIT = 50_000


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from tests.unit.service.conftest import app_client

    with app_client(tmp_path_factory.mktemp("limits"), max_body_bytes=JSON_LIMIT, max_upload_bytes=IMAGE_LIMIT) as c:
        yield c


def padded(size: int, **fields) -> bytes:
    """A JSON object of exactly `size` bytes (its prompt pads it)."""
    body = {"prompt": "", **fields}
    empty = len(json.dumps(body).encode())
    return json.dumps({**body, "prompt": "p" * (size - empty)}).encode()


def chunked(data: bytes):
    """The body with no Content-Length (sent chunked): only counting the bytes can bound it."""
    yield from (data[i : i + 1024] for i in range(0, len(data), 1024))


def problem_413(r, limit: int, setting: str) -> str:
    assert r.status_code == 413, r.text
    body = r.json()
    message = body["error"]["message"] if "error" in body else body["detail"]
    assert str(limit) in message and setting in message, message
    if "error" not in body:
        assert (body["limit"], body["setting"]) == (limit, setting)
        assert body["errors"] == [{"field": "body", "message": message}]
    return message


@pytest.mark.parametrize("send", [bytes, chunked], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/videos", "/v1/videos/{id}/remix"])
def test_a_json_body_over_h3_max_body_bytes_is_413_naming_it_on_every_route(small, path, send):
    source = small.post("/v1/jobs", json={"prompt": "a slow fox [fake step=5]"}).json()["id"]
    path = path.replace("{id}", source)
    over = small.post(path, content=send(padded(JSON_LIMIT + 1)), headers={"Content-Type": "application/json"})
    problem_413(over, JSON_LIMIT, "H3_MAX_BODY_BYTES")
    at = small.post(
        path, content=send(padded(JSON_LIMIT, width=448, height=256, frames=12)), headers={"Content-Type": "application/json"}
    )
    assert at.status_code != 413, at.text  # read and judged on what it says (a long prompt)
    small.post(f"/v1/jobs/{source}/cancel")


def test_a_json_create_points_a_large_image_elsewhere(small):
    over = small.post("/v1/videos", content=padded(JSON_LIMIT + 1), headers={"Content-Type": "application/json"})
    assert "multipart input_reference" in problem_413(over, JSON_LIMIT, "H3_MAX_BODY_BYTES")


def noise_png(side: int) -> bytes:
    """A PNG that does not compress: random pixels."""
    pixels = random.Random(side).randbytes(side * side * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(out, format="PNG")
    return out.getvalue()


def test_a_multipart_create_follows_the_upload_limit(small):
    image = noise_png(64)
    assert JSON_LIMIT < len(image) < IMAGE_LIMIT
    fits = small.post(
        "/v1/videos",
        data={"prompt": "a fox", "size": "448x256", "seconds": "0.5"},
        files={"input_reference": ("f.png", image, "image/png")},
    )
    assert fits.status_code == 200, fits.text  # larger than the JSON limit: a file's form is not JSON
    big = b"\x89PNG\r\n\x1a\n" + bytes(IMAGE_LIMIT)
    store = small.post("/v1/videos", data={"prompt": "a fox"}, files={"input_reference": ("f.png", big, "image/png")})
    assert store.json()["error"]["param"] == "input_reference"
    problem_413(store, IMAGE_LIMIT, "H3_MAX_UPLOAD_BYTES")
    huge = small.post(
        "/v1/videos", data={"prompt": "a fox"}, files={"input_reference": ("f.png", big + bytes(2 << 20), "image/png")}
    )
    problem_413(huge, IMAGE_LIMIT + (1 << 20), "H3_MAX_UPLOAD_BYTES")


def test_an_upload_over_its_limit_names_the_setting(small):
    r = small.post("/v1/uploads", content=b"\x89PNG\r\n\x1a\n" + bytes(IMAGE_LIMIT), headers={"Content-Type": "image/png"})
    assert r.status_code == 413, r.text
    message = r.json()["detail"]
    assert str(IMAGE_LIMIT) in message and "H3_MAX_UPLOAD_BYTES sets it" in message, message
    assert r.json()["limit"] == IMAGE_LIMIT and r.json()["errors"] == [{"field": "body", "message": message}]


def test_with_the_default_limit_the_image_kind_sets_it(client):
    r = client.post("/v1/uploads", content=b"\x89PNG\r\n\x1a\n" + bytes(20 << 20), headers={"Content-Type": "image/png"})
    assert r.status_code == 413 and "an image upload may be at most 20971520 bytes" in r.json()["detail"], r.text
    assert "built-in limit" in r.json()["detail"]
