"""Small builders for tests: requests, artifacts, whole job logs."""

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


def request(**kw) -> GenerationRequest:
    return GenerationRequest(**{"prompt": "a red fox in snow", "steps": 4, "frames": 24, "width": 64, "height": 64, **kw})


def artifact(path: str = "j/attempt-1.mp4") -> Artifact:
    return Artifact(path=path, bytes=10, sha256="0" * 64, frames=24, duration_s=1.0)


def submitted(retry: RetryPolicy | None = None, **kw) -> Submitted:
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


def png(width: int = 64, height: int = 48) -> bytes:
    """A valid, tiny RGB PNG."""
    import struct
    import zlib

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes([(x + y) % 256 for x in range(width) for _ in range(3)]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
