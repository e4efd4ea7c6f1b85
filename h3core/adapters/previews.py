"""Still previews of a finished video, made on request from its mp4 (PyAV decodes, Pillow draws):
a thumbnail (one frame, WebP) and a spritesheet (a grid of evenly spaced frames, JPEG).

Nothing is written to disk: each is made in memory and returned as bytes.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import av
from PIL import Image

# What making a preview of a file that is no longer a whole video raises.
DECODE_ERRORS = (av.error.FFmpegError, ValueError)
THUMBNAIL_TYPE = "image/webp"
SPRITESHEET_TYPE = "image/jpeg"
TILES = 16  # frames in a spritesheet, at most (fewer for a shorter video)
TILE_WIDTH = 256  # pixels; a tile keeps the video's aspect ratio and is never upscaled


def _frame_count(stream: av.video.stream.VideoStream, frames: int | None) -> int:
    return max(1, frames or stream.frames or 1)


def thumbnail(path: Path, *, frames: int | None = None) -> bytes:
    """The frame in the middle of the video, as WebP. `frames`: the video's frame count if known."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        wanted = _frame_count(stream, frames) // 2
        image = None
        for i, frame in enumerate(container.decode(stream)):
            image = frame
            if i >= wanted:
                break
        if image is None:
            raise ValueError(f"{path.name} has no video frames")
        out = io.BytesIO()
        image.to_image().save(out, format="WEBP", quality=85)
    return out.getvalue()


def spritesheet(path: Path, *, frames: int | None = None, tiles: int = TILES, tile_width: int = TILE_WIDTH) -> bytes:
    """Up to `tiles` evenly spaced frames, first and last included, in a near-square grid, as JPEG."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        total = _frame_count(stream, frames)
        count = min(tiles, total)
        picks = sorted({round(i * (total - 1) / max(count - 1, 1)) for i in range(count)})
        width, height = stream.codec_context.width, stream.codec_context.height
        tw = min(tile_width, width)
        th = max(1, round(height * tw / width))
        columns = math.ceil(math.sqrt(len(picks)))
        rows = math.ceil(len(picks) / columns)
        sheet = Image.new("RGB", (columns * tw, rows * th))
        placed = 0
        for i, frame in enumerate(container.decode(stream)):
            if placed < len(picks) and i == picks[placed]:
                tile = frame.to_image().resize((tw, th), Image.Resampling.BILINEAR)
                sheet.paste(tile, ((placed % columns) * tw, (placed // columns) * th))
                placed += 1
                if placed == len(picks):
                    break
        if placed == 0:
            raise ValueError(f"{path.name} has no video frames")
    out = io.BytesIO()
    sheet.save(out, format="JPEG", quality=85)
    return out.getvalue()
