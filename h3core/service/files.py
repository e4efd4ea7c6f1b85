"""A stored file over HTTP, whole or a byte range of it (RFC 9110 §14)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from litestar.exceptions import HTTPException
from litestar.response import Stream

from h3core.service.ranges import Unsatisfiable, parse_range

CHUNK = 1 << 16


async def ranged_file(path: Path, range_header: str | None, *, media_type: str, etag: str) -> Stream:
    """200 with the file, or 206 with the part `range_header` asks for; 416 past the end.
    Raises FileNotFoundError if the file is not there."""
    size = (await anyio.Path(path).stat()).st_size
    try:
        span = parse_range(range_header, size)
    except Unsatisfiable:
        raise HTTPException(status_code=416, detail=f"range not satisfiable for {size} bytes", headers={"Content-Range": f"bytes */{size}"}) from None
    start, end = span if span is not None else (0, size - 1)
    headers = {"Accept-Ranges": "bytes", "Content-Length": str(end - start + 1), "ETag": f'"{etag}"'}
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"

    async def body() -> AsyncIterator[bytes]:
        async with await anyio.open_file(path, "rb") as f:
            await f.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = await f.read(min(CHUNK, remaining))
                if not chunk:
                    return
                remaining -= len(chunk)
                yield chunk

    return Stream(body(), status_code=206 if span else 200, headers=headers, media_type=media_type)
