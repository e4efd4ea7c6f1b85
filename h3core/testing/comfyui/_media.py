"""The real files output nodes write: solid-colour PNGs, a 1x1 WebP, and an H.264/AAC mp4.

PNGs need only the standard library; the mp4 needs numpy and PyAV, imported when SaveVideo runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Any

from ._failures import NodeFailure
from ._values import Images, Video

# A 1x1 lossless WebP: SaveAnimatedWEBP writes this (there is no encoder here).
WEBP = bytes.fromhex("524946461a000000574542505650384c0d0000002f00000010071011118888fe0700")


def png_bytes(width: int, height: int, color: int = 0x808080) -> bytes:
    """A valid solid-colour RGB PNG."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    rgb = bytes([(color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF])
    rows = (b"\x00" + rgb * width) * height
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height from its header; 64x64 for anything else (LoadImage has no decoder here)."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
        if head[:8] == b"\x89PNG\r\n\x1a\n":
            w, h = struct.unpack(">II", head[16:24])
            return int(w), int(h)
    except OSError:
        pass
    return 64, 64


def save_path(prefix: str, base: Path) -> tuple[Path, str, int, str]:
    """folder_paths.get_save_image_path: the folder, file name, next free counter and subfolder for this prefix."""
    base_s = str(base)
    subfolder = os.path.dirname(os.path.normpath(prefix))
    filename = os.path.basename(os.path.normpath(prefix))
    folder = os.path.join(base_s, subfolder)
    if os.path.commonpath((base_s, os.path.abspath(folder))) != base_s:
        raise NodeFailure(
            "Exception",
            "**** ERROR: Saving image outside the output folder is not allowed.\n full_output_folder: "
            f"{os.path.abspath(folder)}\n         output_dir: {base_s}\n         commonpath: "
            f"{os.path.commonpath((base_s, os.path.abspath(folder)))}",
        )
    os.makedirs(folder, exist_ok=True)
    counter = 0
    for name in os.listdir(folder):
        head = name[: len(filename) + 1]
        if os.path.normcase(head[:-1]) == os.path.normcase(filename) and head[-1:] == "_":
            with contextlib.suppress(ValueError):
                counter = max(counter, int(name[len(filename) + 1 :].split("_")[0]))
    return Path(folder), filename, counter + 1, subfolder


def save_images(img: Images, prefix: str, base: Path, kind: str) -> dict[str, list[Any]]:
    """SaveImage / PreviewImage into base (root/output or root/temp): one PNG per image, at most 256 px a side."""
    folder, filename, counter, subfolder = save_path(prefix, base)
    data = png_bytes(min(img.width, 256) or 1, min(img.height, 256) or 1, img.color)
    results = []
    for b in range(img.n):
        file = f"{filename.replace('%batch_num%', str(b))}_{counter:05}_.png"
        (folder / file).write_bytes(data)
        results.append({"filename": file, "subfolder": subfolder, "type": kind})
        counter += 1
    return {"images": results}


def write_video(path: Path, video: Video, size: tuple[int, int], max_frames: int) -> None:
    """A real mp4 of `size`: a colour ramp over time, and a 440 Hz tone when the video has audio."""
    import numpy as np

    from h3core.adapters.video import write_mp4

    w, h = size
    frames_n = max(1, min(int(video.frames), max_frames))
    fps = max(1, round(video.fps))
    ramp = np.linspace(0, 255, frames_n, dtype=np.float32)
    frames = np.zeros((frames_n, h, w, 3), dtype=np.uint8)
    frames[..., 0] = ramp[:, None, None].astype(np.uint8)
    frames[..., 1] = np.arange(w, dtype=np.uint8)[None, None, :] * (255 // max(1, w - 1))
    frames[..., 2] = 128
    audio = None
    if video.audio is not None:
        rate = 32_000
        t = np.arange(int(rate * frames_n / fps), dtype=np.float32) / rate
        tone = (0.2 * np.sin(2 * math.pi * 440.0 * t)).astype(np.float32)
        audio = np.stack([tone, tone])
    write_mp4(path, frames, fps=fps, audio=audio, sample_rate=32_000)
