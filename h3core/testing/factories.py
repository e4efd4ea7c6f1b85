"""Small builders of valid requests, artifacts, whole job logs and PNGs, for tests of h3core and of
code built on it (a store, an executor, an upload store)."""

from __future__ import annotations

from h3core.domain.events import (
    Admitted,
    Artifact,
    Body,
    Done,
    Progress,
    Running,
    Submitted,
)
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy

__all__ = ["artifact", "done_log", "png", "request", "submitted"]


def request(**kw) -> GenerationRequest:
    """A small valid request (64x64, 24 frames, 4 steps); `kw` overrides any field."""
    return GenerationRequest(**{"prompt": "a red fox in snow", "steps": 4, "frames": 24, "width": 64, "height": 64, **kw})


def artifact(path: str = "j/attempt-1.mp4") -> Artifact:
    """An artifact record at `path` (its size and sha256 made up: no file is behind it)."""
    return Artifact(path=path, bytes=10, sha256="0" * 64, frames=24, duration_s=1.0)


def submitted(retry: RetryPolicy | None = None, **kw) -> Submitted:
    """A job's first event, for `request(**kw)` under `retry` (by default the default policy)."""
    return Submitted(request=request(**kw), retry=retry or RetryPolicy())


def done_log(steps: int = 3) -> list[Body]:
    """The bodies of a job that ran once and finished."""
    return [
        submitted(),
        Admitted(),
        Running(attempt=1, executor="fake"),
        *[Progress(step=i, total=steps) for i in range(1, steps + 1)],
        Done(artifact=artifact()),
    ]


def png(width: int = 64, height: int = 48, *, pixels: bool = True) -> bytes:
    """A valid, tiny RGB PNG; with `pixels` False, its header alone: a PNG that declares a canvas
    of any size in a few bytes and holds nothing to decode (what an upload store's probe reads)."""
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    if not pixels:
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")
    rows = b"".join(b"\x00" + bytes([(x + y) % 256 for x in range(width) for _ in range(3)]) for y in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
