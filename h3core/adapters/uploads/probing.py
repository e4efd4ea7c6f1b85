"""What an upload's file says of itself: an image's dimensions from its header (Pillow), a video's
or a sound's from its container (PyAV). Each reads a path or an open binary file (an upload kept
in memory), and imports its library only when called."""

from __future__ import annotations

import re
from pathlib import Path
from typing import IO, TypedDict

__all__ = ["Probed", "Source", "probe", "probe_image"]

Source = Path | IO[bytes]  # a file on disk, or bytes read like one


class Probed(TypedDict, total=False):
    """What probing a media file read; a key is absent where the file did not say."""

    width: int | None
    height: int | None
    seconds: float
    has_audio: bool
    pixels: int | None  # `probe_image` only: Pillow refused the header of an image this large (None: it did not say)


def probe_image(source: Source) -> Probed:
    """An image's dimensions from its header (Pillow), without decoding it; {} if unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as image:  # the header only: no pixel is decoded
            width, height = image.size
    except Image.DecompressionBombError as exc:
        # Pillow's own bound (far above the store's) refused the header; its message has the count.
        found = re.search(r"\((\d+) pixels\)", str(exc))
        return {"pixels": int(found.group(1)) if found else None}
    except (UnidentifiedImageError, OSError, ValueError):
        return {}
    return {"width": width or None, "height": height or None}


def probe(source: Source) -> Probed:
    """Dimensions, duration and sound of a media file (PyAV); {} if it cannot be decoded."""
    import av

    try:
        with av.open(str(source) if isinstance(source, Path) else source, "r") as container:
            out: Probed = {"has_audio": bool(container.streams.audio)}
            if container.streams.video:
                v = container.streams.video[0]
                out["width"], out["height"] = v.codec_context.width or None, v.codec_context.height or None
            if container.duration:
                out["seconds"] = container.duration / 1_000_000
            return out
    except (av.error.FFmpegError, OSError, ValueError):
        return {}
