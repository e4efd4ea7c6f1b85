"""Thumbnails and spritesheets decoded from a real mp4: the right frames, in the right places."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from h3core.adapters.previews import spritesheet, thumbnail
from h3core.adapters.video import write_mp4

FRAMES = 9
W, H = 96, 64


def level(i: int) -> int:
    return 20 + 25 * i  # frame i is a flat grey of this level: far enough apart to tell after H.264


@pytest.fixture(scope="module")
def mp4(tmp_path_factory):
    path = tmp_path_factory.mktemp("previews") / "v.mp4"
    frames = np.stack([np.full((H, W, 3), level(i), np.uint8) for i in range(FRAMES)])
    write_mp4(path, frames, fps=24)
    return path


def mean(image: Image.Image, box=None) -> float:
    return float(np.asarray(image.crop(box) if box else image, dtype=np.float32).mean())


def test_the_thumbnail_is_the_middle_frame_as_webp(mp4):
    image = Image.open(io.BytesIO(thumbnail(mp4, frames=FRAMES)))
    assert image.format == "WEBP" and image.size == (W, H)
    assert abs(mean(image) - level(FRAMES // 2)) < 6
    assert abs(mean(Image.open(io.BytesIO(thumbnail(mp4)))) - level(FRAMES // 2)) < 6  # the count read from the file


def test_the_spritesheet_is_a_grid_of_evenly_spaced_frames_first_and_last_included(mp4):
    sheet = Image.open(io.BytesIO(spritesheet(mp4, frames=FRAMES, tiles=4, tile_width=48)))
    assert sheet.format == "JPEG" and sheet.size == (2 * 48, 2 * 32)  # 2x2 tiles, each 48 wide at the video's aspect
    tiles = [mean(sheet, (x * 48 + 4, y * 32 + 4, x * 48 + 44, y * 32 + 28)) for y in range(2) for x in range(2)]
    wanted = [level(i) for i in (0, 3, 5, 8)]  # round(i * 8 / 3) for i in 0..3
    assert all(abs(t - w) < 8 for t, w in zip(tiles, wanted, strict=True)), (tiles, wanted)


def test_a_short_video_gives_one_tile_per_frame_and_tiles_are_never_upscaled(mp4):
    sheet = Image.open(io.BytesIO(spritesheet(mp4, frames=FRAMES, tiles=100, tile_width=1000)))
    assert sheet.size == (3 * W, 3 * H)


def test_a_missing_file_is_file_not_found(tmp_path):
    for make in (thumbnail, spritesheet):
        with pytest.raises(FileNotFoundError):
            make(tmp_path / "gone.mp4")
