"""A stored file over HTTP, whole or a byte range of it (RFC 9110 §14), for GET and HEAD."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio
from litestar import Response
from litestar.exceptions import HTTPException
from litestar.response import Stream

from h3core.service.ranges import Unsatisfiable, parse_range

CHUNK = 1 << 16


@dataclass(frozen=True)
class Span:
    """What to send of a file: bytes `start`..`end` (inclusive), and the headers that say so."""

    path: Path
    start: int
    end: int
    partial: bool
    headers: dict[str, str]
    media_type: str

    @property
    def status(self) -> int:
        return 206 if self.partial else 200


def span(path: Path, size: int, request_headers: Mapping[str, str], *, media_type: str, sha256: str) -> Span:
    """The part of a `size`-byte file a request asks for (Range, If-Range against the ETag);
    416 past the end."""
    etag = f'"{sha256}"'
    try:
        part = parse_range(request_headers.get("range"), size, if_range=request_headers.get("if-range"), etag=etag)
    except Unsatisfiable:
        raise HTTPException(
            status_code=416, detail=f"range not satisfiable for {size} bytes", headers={"Content-Range": f"bytes */{size}"}
        ) from None
    start, end = part if part is not None else (0, size - 1)
    headers = {"Accept-Ranges": "bytes", "Content-Length": str(end - start + 1), "ETag": etag}
    if part is not None:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return Span(path, start, end, part is not None, headers, media_type)


def stream(s: Span) -> Stream:
    async def body() -> AsyncIterator[bytes]:
        async with await anyio.open_file(s.path, "rb") as f:
            await f.seek(s.start)
            remaining = s.end - s.start + 1
            while remaining > 0:
                chunk = await f.read(min(CHUNK, remaining))
                if not chunk:
                    return
                remaining -= len(chunk)
                yield chunk

    return Stream(body(), status_code=s.status, headers=s.headers, media_type=s.media_type)


def head(s: Span) -> Response[None]:
    return Response(content=b"", status_code=s.status, headers=s.headers, media_type=s.media_type)  # type: ignore[arg-type]
