"""The local upload store beyond the contract (tests/unit/adapters/test_upload_contract.py): an
image's size is read from its header and bounded before anything decodes it, a bomb that decodes
to gigabytes included; a `.part` file is swept only when no upload is writing it."""

from __future__ import annotations

import fcntl

import pytest

from h3core.adapters.uploads import LocalUploadStore, UploadRejected, probing
from h3core.testing.uploads import chunks
from tests.factories import bomb_png

pytestmark = pytest.mark.anyio


@pytest.fixture
def no_decoding(monkeypatch):
    """Any decode of pixels fails the test: Pillow's `load`, and PyAV's probe of a whole file."""
    from PIL import Image

    def refuse(*args, **kwargs):
        raise AssertionError("an upload's pixels were decoded")

    monkeypatch.setattr(Image.Image, "load", refuse)
    monkeypatch.setattr(probing, "probe", refuse)


@pytest.mark.usefixtures("no_decoding")
async def test_a_png_that_decodes_to_a_gigabyte_is_refused_with_its_pixel_count(tmp_path):
    """The contract's case has a header alone; this one is a whole bomb, 4.5 MB of real data."""
    with pytest.raises(UploadRejected, match="at most 16777216 pixels; it has 256000000$"):
        await LocalUploadStore(tmp_path).put("image/png", chunks(bomb_png(16000, 16000)))
    assert list(tmp_path.iterdir()) == []


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
