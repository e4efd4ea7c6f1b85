"""The local upload store: an image's size is read from its header and bounded before anything
decodes it; a `.part` file is swept only when no upload is writing it."""

from __future__ import annotations

import fcntl

import anyio
import pytest

from h3core.adapters import uploads as uploads_module
from h3core.adapters.uploads import LocalUploadStore, UploadRejected
from tests.factories import bomb_png, png

pytestmark = pytest.mark.anyio


async def chunks(data: bytes, size: int = 1 << 16):
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.fixture
def no_decoding(monkeypatch):
    """Any decode of pixels fails the test: Pillow's `load`, and PyAV's probe of a whole file."""
    from PIL import Image

    def refuse(*args, **kwargs):
        raise AssertionError("an upload's pixels were decoded")

    monkeypatch.setattr(Image.Image, "load", refuse)
    monkeypatch.setattr(uploads_module, "probe", refuse)


@pytest.mark.usefixtures("no_decoding")
async def test_an_image_over_the_pixel_bound_is_refused_from_its_header(tmp_path):
    uploads = LocalUploadStore(tmp_path, max_pixels=4000 * 4000)
    with pytest.raises(UploadRejected) as refused:
        await uploads.put("image/png", chunks(bomb_png(4001, 4000)))
    assert refused.value.limit == 4000 * 4000 and refused.value.status == 422 and refused.value.field == "body"
    assert str(refused.value) == "the image may have at most 16000000 pixels; it has 4001 x 4000, 16004000"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("no_decoding")
async def test_an_image_past_pillows_own_bound_is_refused_with_its_pixel_count(tmp_path):
    with pytest.raises(UploadRejected, match="at most 16777216 pixels; it has 256000000$"):
        await LocalUploadStore(tmp_path).put("image/png", chunks(bomb_png(16000, 16000)))


@pytest.mark.usefixtures("no_decoding")
async def test_an_image_within_the_bound_is_stored_with_its_size(tmp_path):
    upload = await LocalUploadStore(tmp_path, max_pixels=64 * 48).put("image/png", chunks(png(64, 48)))
    assert (upload.width, upload.height, upload.kind) == (64, 48, "image")


def test_a_part_file_is_swept_only_when_no_upload_writes_it(tmp_path):
    uploads = LocalUploadStore(tmp_path)
    writing, cut_off = tmp_path / f"u_{'a' * 32}.part", tmp_path / f"u_{'b' * 32}.part"
    writing.write_bytes(b"x" * 10)
    cut_off.write_bytes(b"y" * 20)
    with open(writing, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as `put` holds the file it streams to
        assert uploads.sweep_parts(dry_run=True) == [(cut_off.name, 20)] and cut_off.exists()
        assert uploads.sweep_parts() == [(cut_off.name, 20)]
        assert writing.exists() and not cut_off.exists()
    assert uploads.sweep_parts() == [(writing.name, 10)] and not writing.exists()


async def test_a_cancelled_upload_leaves_no_part(tmp_path):
    uploads = LocalUploadStore(tmp_path)

    async def stalled():
        yield png()[:16]
        await anyio.sleep_forever()

    with anyio.move_on_after(0.5):
        await uploads.put("image/png", stalled())
    assert list(tmp_path.iterdir()) == []
