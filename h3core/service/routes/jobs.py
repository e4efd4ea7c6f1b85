"""/v1/jobs: submit, read, list, cancel, the event log, its live stream, the video."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import anyio
from litestar import Request, Response, get, head, post
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter
from litestar.response import ServerSentEvent, Stream
from litestar.response.sse import ServerSentEventMessage

from h3core.domain.adoption import mismatch
from h3core.domain.events import Event
from h3core.domain.geometry import Media
from h3core.domain.request import GenerationRequest
from h3core.domain.state import JobState
from h3core.runner import IdempotencyMismatch, NotCancellable, Refused, ShuttingDown, new_job_id
from h3core.service.context import Service
from h3core.service.ranges import Unsatisfiable, parse_range
from h3core.service.views import ApiStatus, JobCreate, JobPage, JobView, job_view, problems

STREAM_RESYNC_S = 10.0  # also catch events stored by other processes (a CLI cancel)


# Point reads (`get`, `by_idempotency_key`, `queue_position`: one indexed row or a count of the
# queue, tens of microseconds) run inline on the event loop: a hop to a thread costs more than
# the read. The store serves them on a connection of their own, apart from the writer's (in WAL
# mode a read never waits for a write) and from long reads. Reads that can be long (a page of
# the list, a job's whole log) go to a thread.


async def _call(fn, *args):
    return await anyio.to_thread.run_sync(lambda: fn(*args))


async def _state(svc: Service, job_id: str) -> JobState:
    state = svc.store.get(job_id)
    if state is None:
        raise NotFoundException(f"no job {job_id!r}")
    return state


async def _view(svc: Service, state: JobState) -> JobView:
    position = svc.store.queue_position(state.job_id) if state.status == "queued" else None
    return job_view(state, now=datetime.now(UTC), queue_position=position)


def _media(svc: Service, request: GenerationRequest) -> dict[str, Media]:
    """Check every upload the request names exists and is of the right kind; collect their media."""
    wanted: list[tuple[str, str, str]] = []  # (field, id, kind)
    if request.keyframes is not None:
        wanted += [(f"keyframes.{k}", v, "image") for k, v in (("first", request.keyframes.first), ("last", request.keyframes.last)) if v]
    if request.references is not None:
        for name, kind in (("images", "image"), ("videos", "video"), ("audios", "audio")):
            wanted += [(f"references.{name}.{i}", v, kind) for i, v in enumerate(getattr(request.references, name))]
    media: dict[str, Media] = {}
    errors = []
    for where, upload_id, kind in wanted:
        upload = svc.uploads.get(upload_id)
        if upload is None:
            errors.append({"field": where, "message": f"no upload {upload_id!r} (POST /v1/uploads first)"})
        elif upload.kind != kind:
            errors.append({"field": where, "message": f"upload {upload_id!r} is {upload.kind}, not {kind}"})
        else:
            media[upload_id] = upload.media()
    if errors:
        raise ValidationException(detail="invalid uploads", extra=[{"key": e["field"], "message": e["message"]} for e in errors])
    return media


@post(
    "/jobs",
    status_code=201,
    summary="Submit a job",
    responses={**problems(400, 401, 409, 415, 422, 503), 200: ResponseSpec(data_container=JobView, description="an idempotent replay: the job already submitted with this key")},
    description="Admits the request against the capacity profile (422 with the ceiling if it is over) and queues it. "
    "With an Idempotency-Key header, the same key and body return the same job (200); another body, 409.",
)
async def create_job(
    svc: Service,
    data: JobCreate,
    idempotency_key: Annotated[str | None, Parameter(header="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> Response[JobView]:
    request = data.generation()
    # Reading the uploads' records is file I/O: a thread, and only when the request names any.
    media = await _call(_media, svc, request) if request.keyframes is not None or request.references is not None else {}
    # The id this request would create: any other id back is the job an earlier (or concurrent)
    # request with the same key created, so exactly one request per key gets 201.
    job_id = new_job_id()
    try:
        state = await svc.runner.submit(request, priority=data.priority, idempotency_key=idempotency_key, media=media, job_id=job_id)
    except Refused as exc:
        ceiling = exc.decision.ceiling.model_dump() if exc.decision.ceiling else None
        raise HTTPException(status_code=422, detail=exc.decision.detail, extra={"ceiling": ceiling}) from None
    except IdempotencyMismatch as exc:
        raise HTTPException(status_code=409, detail=str(exc), extra={"job_id": exc.job_id}) from None
    except ShuttingDown as exc:
        raise HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": "5"}) from None
    return Response(
        await _view(svc, state),
        status_code=201 if state.job_id == job_id else 200,
        headers={"Location": f"/v1/jobs/{state.job_id}"},
    )


@get("/jobs/{job_id:str}", summary="A job's status", responses=problems(401, 404, 422))
async def get_job(svc: Service, job_id: str) -> JobView:
    return await _view(svc, await _state(svc, job_id))


@get("/jobs", summary="Jobs, newest first", responses=problems(400, 401, 422))
async def list_jobs(
    svc: Service,
    status: ApiStatus | None = None,
    cursor: Annotated[str | None, Parameter(pattern=r"^\d{1,18}$")] = None,
    limit: Annotated[int, Parameter(ge=1, le=500)] = 50,
) -> JobPage:
    rows = await _call(lambda: svc.store.list_jobs(status=status, limit=limit + 1, before=int(cursor) if cursor else None))
    now = datetime.now(UTC)
    page = rows[:limit]
    items = [job_view(s, now=now, queue_position=None) for _, s in page]
    return JobPage(items=items, next_cursor=str(page[-1][0]) if len(rows) > limit else None)


@post("/jobs/{job_id:str}/cancel", status_code=202, summary="Cancel a job", responses=problems(401, 404, 409, 415, 422))
async def cancel_job(svc: Service, job_id: str) -> JobView:
    try:
        state = await svc.runner.cancel(job_id)
    except KeyError:
        raise NotFoundException(f"no job {job_id!r}") from None
    except NotCancellable as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    return await _view(svc, state)


@get("/jobs/{job_id:str}/events", summary="A job's event log", responses=problems(401, 404, 422))
async def job_events(svc: Service, job_id: str) -> list[Event]:
    await _state(svc, job_id)
    return await _call(svc.store.events, job_id)


def _sse(event: Event) -> ServerSentEventMessage:
    return ServerSentEventMessage(data=event.model_dump_json(), event=event.type, id=event.seq)


# The largest seq SQLite can hold; a Last-Event-ID past it is refused (422), not sent to the store.
MAX_SEQ = 2**63 - 1


@get(
    "/jobs/{job_id:str}/stream",
    summary="A job's events, live (Server-Sent Events)",
    media_type="text/event-stream",
    responses={
        **problems(401, 404, 422),
        204: ResponseSpec(data_container=None, description="the job has ended and has no event after Last-Event-ID: nothing to stream"),
    },
)
async def job_stream(
    svc: Service,
    job_id: str,
    # schema_extra: Litestar leaves a bound of 0 out of the document (it tests the bound for truth).
    last_event_id: Annotated[int | None, Parameter(header="Last-Event-ID", ge=0, le=MAX_SEQ, schema_extra={"minimum": 0})] = None,
) -> Response:
    """The history so far (after Last-Event-ID), then each event as it is stored, ending after the
    terminal one. A job that has ended streams what follows Last-Event-ID and ends at once; with
    nothing after it, 204 (an EventSource then stops reconnecting)."""
    state = await _state(svc, job_id)
    # A Last-Event-ID past the end of the log (another job's, or a made-up one) reads as the end:
    # the stream still sees this job's later events, its terminal one included.
    start = min(last_event_id or 0, state.last_seq)
    if state.terminal and start >= state.last_seq:
        return Response(content=None, status_code=204)

    async def events() -> AsyncIterator[ServerSentEventMessage]:
        after = start
        while True:
            # Subscribe before reading the store, so nothing falls between the two.
            async with svc.bus.subscribe(job_id) as live:
                for e in await _call(svc.store.events, job_id, after):
                    yield _sse(e)
                    after = e.seq
                    if e.terminal:
                        return
                while True:
                    with anyio.move_on_after(STREAM_RESYNC_S):
                        try:
                            e = await live.receive()
                        except anyio.EndOfStream:
                            if svc.bus.closed:
                                return  # the service is stopping: end the stream, let it stop
                            break  # we fell behind and were dropped: catch up from the store
                        if e.seq <= after:
                            continue
                        if e.seq != after + 1:
                            break  # a gap: catch up from the store
                        yield _sse(e)
                        after = e.seq
                        if e.terminal:
                            return
                        continue
                    if svc.stopping:
                        return
                    yield ServerSentEventMessage(comment="keep-alive", data=None)
                    break  # resync: events from other processes reach us through the store

    return ServerSentEvent(events())


async def _video(svc: Service, request: Request, job_id: str) -> tuple[Path, int, int, bool, dict[str, str], str]:
    """(file, first byte, last byte, partial?, headers, media type) of a job's video, or the 4xx
    that says why there is none to send."""
    state = await _state(svc, job_id)
    if state.artifact is None:
        raise HTTPException(status_code=409, detail=f"job {job_id} has no video: it is {state.status}")
    artifact = state.artifact
    try:
        path = svc.artifacts.resolve(artifact.path)
        size, _ = await _call(lambda: svc.artifacts.measure(artifact.path, hashed=False))
    except ValueError:
        raise NotFoundException(f"job {job_id}'s recorded video path is not in the artifact store") from None
    if (problem := mismatch(artifact, size, None)) is not None:
        raise HTTPException(status_code=410, detail=f"job {job_id} is done but {problem} in the artifact store")
    assert size is not None
    etag = f'"{artifact.sha256}"'
    try:
        span = parse_range(request.headers.get("range"), size, if_range=request.headers.get("if-range"), etag=etag)
    except Unsatisfiable:
        raise HTTPException(status_code=416, detail=f"range not satisfiable for {size} bytes", headers={"Content-Range": f"bytes */{size}"}) from None
    start, end = span if span is not None else (0, size - 1)
    headers = {"Accept-Ranges": "bytes", "Content-Length": str(end - start + 1), "ETag": etag}
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return path, start, end, span is not None, headers, artifact.media_type


_VIDEO_ERRORS = problems(401, 404, 409, 410, 416, 422)


@get("/jobs/{job_id:str}/video", summary="The finished video (supports Range)", responses=_VIDEO_ERRORS, media_type="video/mp4")
async def job_video(svc: Service, request: Request, job_id: str) -> Stream:
    path, start, end, partial, headers, media_type = await _video(svc, request, job_id)

    async def body() -> AsyncIterator[bytes]:
        async with await anyio.open_file(path, "rb") as f:
            await f.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = await f.read(min(1 << 16, remaining))
                if not chunk:
                    return
                remaining -= len(chunk)
                yield chunk

    return Stream(body(), status_code=206 if partial else 200, headers=headers, media_type=media_type)


@head("/jobs/{job_id:str}/video", summary="The finished video's headers (size, ETag)", responses=_VIDEO_ERRORS, media_type="video/mp4")
async def job_video_head(svc: Service, request: Request, job_id: str) -> Response[None]:
    _, _, _, partial, headers, media_type = await _video(svc, request, job_id)
    return Response(content=b"", status_code=206 if partial else 200, headers=headers, media_type=media_type)


handlers = [create_job, get_job, list_jobs, cancel_job, job_events, job_stream, job_video, job_video_head]
