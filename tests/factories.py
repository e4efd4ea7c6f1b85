"""Small builders for tests: requests, artifacts, whole job logs (shared with implementers in
`h3core.testing.factories`, a PNG among them), and a PNG that decodes to a gigabyte."""

from __future__ import annotations

from h3core.domain.events import Artifact
from h3core.domain.segments import SegmentPlan
from h3core.testing.factories import artifact, done_log, png, request, submitted

__all__ = ["artifact", "done_log", "png", "request", "segment_file", "submitted"]


def segment_file(plan: SegmentPlan, index: int, job: str = "j") -> Artifact:
    """The record of segment `index` of `plan` made (`segment_done`'s artifact; no file behind it)."""
    frames = plan.segments[index].keep
    return Artifact(path=f"{job}/segment-{index}.mp4", bytes=10, sha256=f"{index + 1:x}" * 64, frames=frames, duration_s=1.0)


def bomb_png(width: int = 16000, height: int = 16000) -> bytes:
    """A valid RGBA PNG of zeros, 4.5 MB for 16000 x 16000, that decodes to width x height x 4
    bytes (1 GB): made row by row, so making it takes no such memory here."""
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    packer, row, idat = zlib.compressobj(1), bytes(1 + 4 * width), []
    for _ in range(height):
        idat.append(packer.compress(row))
    idat.append(packer.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(idat)) + chunk(b"IEND", b"")
