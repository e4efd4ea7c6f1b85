"""A stored file over HTTP, whole or a byte range of it (RFC 9110 §14), for GET and HEAD; and a
job's video checked against its record, and against its deletion, before any of it is served.

A deletion (DELETE /v1/videos/{id}) is a fact in the store, and every route that serves or offers
a video reads it there (`deleted_at`): nodes may each keep their own artifacts folder, and a node
that still holds the file of a video deleted through another node must not serve it, nor offer it,
before it has removed it (h3core.runtime.deletions)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import anyio
from litestar import Response
from litestar.exceptions import HTTPException
from litestar.response import Stream

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.base import JobProjections
from h3core.domain.adoption import mismatch
from h3core.domain.events import Artifact
from h3core.domain.state import JobState
from h3core.service.ranges import Unsatisfiable, parse_range

# A video is sent as its record says: mp4 from the pipeline; the fake's YUV4MPEG2 where PyAV is
# missing and the container a ComfyUI workflow saves are other video types.
VIDEO_MEDIA_TYPES = {"video/mp4": "the pipeline's video", "video/*": "another executor's container (its record's type)"}


class ArtifactProblem(Exception):
    """Why a done job's video cannot be served: `status` 404 (no such path in the store) or 410
    (deleted on purpose, missing, or no longer the file its record describes)."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


# Files whose sha256 was found to be their record's, by version (a local file's inode, size and
# modification time; an object's ETag): one is hashed again only once it has changed, so a file is
# verified once, not on every request.
_VERIFIED: OrderedDict[str, str] = OrderedDict()
_VERIFIED_MAX = 4096
_VERIFIED_LOCK = threading.Lock()  # `checked` runs on several worker threads at once


def deleted_at(store: JobProjections, artifacts: ArtifactStore, state: JobState) -> datetime | None:
    """When the job's video was deleted: the store's mark, whichever node holds the file; else
    what this node's artifact store recorded (a deletion by an earlier h3core, or one whose mark
    in the store a failure cut off). A point read and a file or two, or two requests to an object
    store: `h3core.service.submission.artifacts_read` runs it where it belongs."""
    return store.video_deleted_at(state.job_id) or recorded_deleted_at(artifacts, state)


def recorded_deleted_at(artifacts: ArtifactStore, state: JobState) -> datetime | None:
    """When this node's artifact store recorded the job's video deleted (as a whole, or its file);
    None where it did not."""
    when = artifacts.video_deleted_at(state.job_id)
    if when is None and state.artifact is not None:
        try:
            when = artifacts.deleted_at(state.artifact.path)
        except ValueError:
            return None  # a recorded path outside the store: its video route says so
    return when


def checked(artifacts: ArtifactStore, artifact: Artifact, whose: str, *, deleted: datetime | None) -> int:
    """The video's size, if the file is still the one its record describes, byte for byte
    (sha256, read again whenever the file changed); else `ArtifactProblem`: a video deleted
    (`deleted`: when, as the caller's `deleted_at` just said: the marks are read once a request,
    each a round trip in an object store), or a truncated, damaged or replaced file, is never
    served. Blocking (it reads the file): call it in a worker thread."""
    try:
        seen = artifacts.stat(artifact.path)
    except ValueError:
        raise ArtifactProblem(404, f"{whose} recorded video path is not in the artifact store", "content_missing") from None
    if deleted is not None:
        raise ArtifactProblem(410, f"{whose} video was deleted at {deleted.isoformat()}; its log remains", "video_deleted")
    problem = None
    with _VERIFIED_LOCK:
        known = _VERIFIED.get(artifact.path)
    if seen is None or known != seen.version:
        size, sha = artifacts.measure(artifact.path)
        problem = mismatch(artifact, size, sha)
        if problem is None and seen is not None:
            with _VERIFIED_LOCK:
                _VERIFIED[artifact.path] = seen.version
                _VERIFIED.move_to_end(artifact.path)
                while len(_VERIFIED) > _VERIFIED_MAX:
                    _VERIFIED.popitem(last=False)
    if problem is not None:
        code = "content_missing" if seen is None else "content_changed"
        raise ArtifactProblem(410, f"{whose} video cannot be served: {problem} in the artifact store", code)
    assert seen is not None
    return seen.size


@dataclass(frozen=True)
class Span:
    """What to send of a stored file (`path` in `artifacts`): bytes `start`..`end` (inclusive),
    and the headers that say so."""

    artifacts: ArtifactStore
    path: str
    start: int
    end: int
    partial: bool
    headers: dict[str, str]
    media_type: str

    @property
    def status(self) -> int:
        """206 for a byte range, 200 for the whole file."""
        return 206 if self.partial else 200


def span(
    artifacts: ArtifactStore, path: str, size: int, request_headers: Mapping[str, str], *, media_type: str, sha256: str
) -> Span:
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
    return Span(artifacts, path, start, end, part is not None, headers, media_type)


def stream(s: Span) -> Stream:
    """The response that sends the span, read from the store a chunk at a time as it is sent
    (each read on a worker thread: an object store's read waits on the network)."""

    async def body() -> AsyncIterator[bytes]:
        chunks = await anyio.to_thread.run_sync(s.artifacts.read, s.path, s.start, s.end)
        try:
            while (chunk := await anyio.to_thread.run_sync(next, chunks, None)) is not None:
                yield chunk
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_close, chunks)

    return Stream(body(), status_code=s.status, headers=s.headers, media_type=s.media_type)


def _close(chunks: object) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


def send(s: Span, *, serving: str, ttl_s: int, head_only: bool = False) -> Response:
    """The span, streamed (its status and headers only, for HEAD); with `serving` "redirect", a
    307 to the address the store gives for the file, valid `ttl_s` seconds (`H3-Url-Expires`
    says until when), where it has one: the client then reads (and ranges) the object directly."""
    if serving == "redirect" and (url := s.artifacts.url(s.path, ttl_s)) is not None:
        expires = (datetime.now(UTC) + timedelta(seconds=ttl_s)).isoformat(timespec="seconds")
        headers = {"Location": url, "Cache-Control": "no-store", "H3-Url-Expires": expires}
        return Response(content=b"", status_code=307, headers=headers)
    return head(s) if head_only else stream(s)


def head(s: Span) -> Response[None]:
    """The answer to HEAD for the span: its status and headers, and no body."""
    return Response(content=b"", status_code=s.status, headers=s.headers, media_type=s.media_type)  # type: ignore[arg-type]
