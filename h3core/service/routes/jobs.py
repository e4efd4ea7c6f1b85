"""/v1/jobs: submit, read, list, cancel, the event log, its live stream, the video."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated

from litestar import Request, Response, get, head, patch, post
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPI
from litestar.params import FromPath, FromQuery, HeaderParameter, JSONBody, QueryParameter
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from h3core.domain.events import Event
from h3core.domain.request import GenerationRequest
from h3core.domain.state import JobState
from h3core.domain.webhooks import Delivery, WebhookTarget
from h3core.runtime.errors import IdempotencyMismatch, InvalidSubmission, NotCancellable, NotQueued, Refused, ShuttingDown
from h3core.runtime.follow import follow
from h3core.runtime.submissions import Submission
from h3core.service import files
from h3core.service.auth import requester
from h3core.service.cancelling import CANCEL_ANSWER_S, cancel, refusal
from h3core.service.compression import UNCOMPRESSED
from h3core.service.context import Service
from h3core.service.openapi import file_responses
from h3core.service.requests import JobCreate, JobPatch
from h3core.service.submission import artifacts_read, in_thread, job_state, point_read, submit
from h3core.service.views import ApiStatus, JobPage, JobView, Problem, api_status, job_view, problems

STREAM_RESYNC_S = 10.0  # also catch events stored by other processes (a CLI cancel)
UNKNOWN_UPLOAD = (
    "an upload id in `keyframes` or `references`, of the form the schema gives, that no upload has: "
    "`errors` names each such field and its `upload_id` (an id of another form, or an upload of the wrong kind: 422)"
)


# Point reads (`get`, `by_idempotency_key`, `queue_position`: one indexed row, or a count of the
# jobs ahead: on SQLite under a millisecond below 10,000 queued, bench.throughput.queue_position) run
# inline on the event loop on SQLite: a hop to a thread costs more than the read. The store serves
# them on a connection of their own, apart from the writer's (in WAL mode a read never waits for a
# write) and from long reads. On PostgreSQL they go to a thread (`point_read`), as reads that can be
# long (a page of the list, a job's whole log) always do. Whether a done job's video was deleted
# also reads the artifact store: a file or two in a folder, inline the same way; in an object store,
# requests over the network, on a thread (`artifacts_read`).


async def _view(svc: Service, state: JobState) -> JobView:
    position = await point_read(svc, svc.store.queue_position, state.job_id) if state.status == "queued" else None
    waiting = svc.contract.source().waiting_reason(state.request.mode) if state.status == "queued" else None
    deleted = await artifacts_read(svc, _deleted_at, svc, state) if state.artifact is not None else None
    return job_view(state, now=datetime.now(UTC), queue_position=position, waiting=waiting, deleted_at=deleted)


def _deleted_at(svc: Service, state: JobState) -> datetime | None:
    """When a done job's video was deleted on purpose (the store's mark, or a record beside the
    file), so that the view never offers a url that answers 410. Blocking where either store is a
    server: `artifacts_read`."""
    return files.deleted_at(svc.store, svc.artifacts, state) if state.artifact is not None else None


def _refuse(field: str, message: str) -> HTTPException:
    return HTTPException(
        status_code=422, detail=f"invalid {field}: {message}", extra={"errors": [{"field": field, "message": message}]}
    )


def _webhook(data: JobCreate) -> WebhookTarget | None:
    """The request's webhook (vetted by the submission: a secret to sign with, a target a delivery
    may reach), or a 422 for a filter without one."""
    target = data.webhook_target()
    if target is None and data.webhook_events_filter is not None:
        raise _refuse("webhook_events_filter", "it applies to a webhook; give `webhook` too")
    return target


async def admit(svc: Service, request: GenerationRequest, **how) -> Submission:
    """`submit`, its refusals answered: 422 (over a ceiling, a webhook refused), 409 (an idempotency
    key reused with another body), 503 (shutting down)."""
    try:
        # Exactly one request per key is told it created the job (201); the others replay it (200).
        return await submit(svc, request, **how)
    except InvalidSubmission as exc:  # the webhook: the uploads' come as a ValidationException
        field, message = exc.errors[0]
        raise _refuse(field, message) from None
    except Refused as exc:
        ceiling = exc.decision.ceiling.model_dump() if exc.decision.ceiling else None
        decision = exc.decision
        errors = [{"field": decision.field, "message": decision.detail}]  # as every other 422 names its field
        raise HTTPException(
            status_code=422, detail=decision.detail, extra={"ceiling": ceiling, "reason": decision.reason, "errors": errors}
        ) from None
    except IdempotencyMismatch as exc:
        raise HTTPException(status_code=409, detail=str(exc), extra={"job_id": exc.job_id}) from None
    except ShuttingDown as exc:
        raise HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": "5"}) from None


@post(
    "/jobs",
    status_code=201,
    summary="Submit a job",
    responses={
        **problems(400, 401, 409, 415, 422, 503),
        200: ResponseSpec(data_container=JobView, description="an idempotent replay: the job already submitted with this key"),
        404: ResponseSpec(data_container=Problem, description=UNKNOWN_UPLOAD),
    },
    description="Admits the request against the capacity profile (422 with the ceiling if it is over) and queues it. "
    "With an Idempotency-Key header, the same key and body return the same job (200); another body, 409. "
    "`webhook`: a URL the job's events are POSTed to, signed per Standard Webhooks (`webhook_events_filter`: "
    "`start`, `progress`, `completed`; all but `progress` when absent); a target that is not http(s), or that "
    "resolves to a private, loopback or link-local address not allowed by H3_WEBHOOKS_ALLOW, is refused (422).",
)
async def create_job(
    svc: NamedDependency[Service],
    request: Request,
    data: JSONBody[JobCreate],
    idempotency_key: Annotated[str | None, HeaderParameter(name="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> Response[JobView]:
    """Submit a job: 201 with its view and Location, or 200 replaying the job an Idempotency-Key
    already made. Refused: 422 (over a ceiling, a webhook refused, an upload of the wrong kind), 404
    (an upload that is not there), 409 (the key reused with another body), 503 (shutting down)."""
    submission = await admit(
        svc,
        data.generation(),
        priority=data.priority,
        idempotency_key=idempotency_key,
        webhook=_webhook(data),
        by=requester(request, svc.settings.api_tokens),
    )
    state = submission.state
    return Response(
        await _view(svc, state),
        status_code=201 if submission.created else 200,
        headers={"Location": f"/v1/jobs/{state.job_id}"},
    )


@get("/jobs/{job_id:str}", summary="A job's status", responses=problems(401, 404, 422))
async def get_job(svc: NamedDependency[Service], job_id: FromPath[str]) -> JobView:
    """The job's view, with its queue position and what it waits for while queued; 404 for an unknown id."""
    return await _view(svc, await job_state(svc, job_id))


@get("/jobs", summary="Jobs, newest first", responses=problems(400, 401, 422))
async def list_jobs(
    svc: NamedDependency[Service],
    status: FromQuery[ApiStatus | None] = None,
    cursor: Annotated[str | None, QueryParameter(pattern=r"^\d{1,18}$")] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
) -> JobPage:
    """A page of jobs, newest first, of one status if `status` is given; `next_cursor` asks for the next
    page, null on the last."""

    def read() -> tuple[list[tuple[int, JobState]], dict[str, datetime | None]]:
        rows = svc.store.list_jobs(status=status, limit=limit + 1, before=int(cursor) if cursor else None)
        videos = [s for _, s in rows[:limit] if s.artifact is not None]
        marked = svc.store.videos_deleted_at([s.job_id for s in videos])  # one read for the page
        return rows, {s.job_id: marked.get(s.job_id) or _deleted_at(svc, s) for s in videos}

    rows, deleted = await in_thread(read)
    now = datetime.now(UTC)
    page = rows[:limit]
    caps = svc.contract.source()
    items = [
        job_view(s, now=now, queue_position=None, waiting=caps.waiting_reason(s.request.mode), deleted_at=deleted.get(s.job_id))
        for _, s in page
    ]
    return JobPage(items=items, next_cursor=str(page[-1][0]) if len(rows) > limit else None)


@post(
    "/jobs/{job_id:str}/cancel",
    status_code=202,
    summary="Cancel a job",
    responses=problems(401, 404, 409, 415, 422),
    description="A queued job is cancelled at once; a running one once its executor has stopped, which the answer "
    f"waits up to {CANCEL_ANSWER_S:g} s for: 202 with the job as it is then (`cancelled`, or still `running` with "
    "`cancel_requested`). 409 when the job has ended, with the `status` it ended in; `reason: too_late` where it is "
    "`done`: its work finished before the cancel could take effect, and its video is kept.",
)
async def cancel_job(svc: NamedDependency[Service], request: Request, job_id: FromPath[str]) -> JobView:
    """Cancel the job: 202 with its view once it has ended or `CANCEL_ANSWER_S` has passed; 409 when it
    had ended already, or finished before the cancel could take effect."""
    try:
        state = await cancel(svc, job_id, by=requester(request, svc.settings.api_tokens))
    except KeyError:
        raise NotFoundException(f"no job {job_id!r}") from None
    except NotCancellable as exc:
        state = exc.state  # it had ended before this request
    else:
        if state.status != "done":  # cancelled, stopping, or (a stop not confirmed) failed: this cancel's doing
            return await _view(svc, state)
    detail, fields = refusal(state)
    raise HTTPException(status_code=409, detail=detail, extra=fields)


async def retry(svc: Service, ended: JobState, request: Request) -> Submission:
    """A new job with the ended job's request, priority and webhook, naming it and who asked
    (`admit`'s refusals)."""
    return await admit(
        svc,
        ended.request,
        priority=ended.priority,
        webhook=ended.webhook,
        retry_of=ended.job_id,
        by=requester(request, svc.settings.api_tokens),
    )


@post(
    "/jobs/{job_id:str}/retry",
    status_code=201,
    summary="Run an ended job again",
    responses=problems(401, 404, 409, 415, 422, 503),
    description="A new job with the ended job's request, priority and webhook, admitted as any submission is; its "
    "log and view name the job it retries (`retry_of`) and who asked (`submitted_by`). 409 for a job that has not "
    "ended (a retry would run it twice).",
)
async def retry_job(svc: NamedDependency[Service], request: Request, job_id: FromPath[str]) -> Response[JobView]:
    """201 with the new job's view and Location; 404 for an unknown job, 409 for one still queued or running."""
    state = await job_state(svc, job_id)
    if not state.terminal:
        detail = f"job {job_id} has not ended ('{api_status(state)}'): only an ended job is retried"
        raise HTTPException(status_code=409, detail=detail, extra={"status": api_status(state)})
    new = (await retry(svc, state, request)).state
    return Response(await _view(svc, new), status_code=201, headers={"Location": f"/v1/jobs/{new.job_id}"})


@patch(
    "/jobs/{job_id:str}",
    summary="Change a queued job's priority",
    responses=problems(400, 401, 404, 409, 415, 422),
    description="A queued job moves in the queue (higher `priority` starts first, -100 to 100); the change is logged "
    "(`reprioritized`, with who asked). 409 once the job has started or ended: it keeps its place.",
)
async def patch_job(svc: NamedDependency[Service], request: Request, job_id: FromPath[str], data: JSONBody[JobPatch]) -> JobView:
    """The job's view with its new priority; 404 for an unknown job, 409 for one not queued."""
    try:
        state = await svc.submissions.reprioritize(job_id, data.priority, by=requester(request, svc.settings.api_tokens))
    except KeyError:
        raise NotFoundException(f"no job {job_id!r}") from None
    except NotQueued as exc:
        raise HTTPException(status_code=409, detail=str(exc), extra={"status": api_status(exc.state)}) from None
    return await _view(svc, state)


@get("/jobs/{job_id:str}/events", summary="A job's event log", responses=problems(401, 404, 422))
async def job_events(svc: NamedDependency[Service], job_id: FromPath[str]) -> list[Event]:
    """The job's event log, in seq order; 404 for an unknown id."""
    await job_state(svc, job_id)
    return await in_thread(svc.store.events, job_id)


@get(
    "/jobs/{job_id:str}/webhooks",
    summary="What became of a job's webhooks",
    responses=problems(401, 404, 422),
    description="One record per event and endpoint a webhook was sent for: its webhook-id, tries, the last "
    "failure, and `trying`, `delivered` or `given_up`. Saved as deliveries end (within a fraction of a second).",
)
async def job_webhooks(svc: NamedDependency[Service], job_id: FromPath[str]) -> list[Delivery]:
    """The job's webhook delivery records, one per event and endpoint; 404 for an unknown id."""
    await job_state(svc, job_id)
    return await in_thread(svc.store.deliveries, job_id)


def _sse(event: Event) -> ServerSentEventMessage:
    return ServerSentEventMessage(data=event.model_dump_json(), event=event.type, id=event.seq)


# The largest seq SQLite can hold; a Last-Event-ID past it is refused (422), not sent to the store.
MAX_SEQ = 2**63 - 1


@get(
    "/jobs/{job_id:str}/stream",
    summary="A job's events, live (Server-Sent Events)",
    media_type="text/event-stream",
    opt={UNCOMPRESSED: True},
    responses={
        **problems(401, 404, 422),
        204: ResponseSpec(
            data_container=None, description="the job has ended and has no event after Last-Event-ID: nothing to stream"
        ),
    },
)
async def job_stream(
    svc: NamedDependency[Service],
    job_id: FromPath[str],
    # schema_extra: Litestar leaves a bound of 0 out of the document (it tests the bound for truth).
    last_event_id: Annotated[
        int | None, HeaderParameter(name="Last-Event-ID", ge=0, le=MAX_SEQ, schema_extra={"minimum": 0})
    ] = None,
) -> Response:
    """The history so far (after Last-Event-ID), then each event as it is stored, ending after the
    terminal one. A job that has ended streams what follows Last-Event-ID and ends at once; with
    nothing after it, 204 (an EventSource then stops reconnecting)."""
    state = await job_state(svc, job_id)
    # A Last-Event-ID past the end of the log (another job's, or a made-up one) reads as the end:
    # the stream still sees this job's later events, its terminal one included.
    start = min(last_event_id or 0, state.last_seq)
    if state.terminal and start >= state.last_seq:
        return Response(content=None, status_code=204)

    async def events() -> AsyncIterator[ServerSentEventMessage]:
        async for e in follow(svc.bus, svc.store.events, job_id, start, resync_s=STREAM_RESYNC_S, stopping=lambda: svc.stopping):
            yield _sse(e) if e is not None else ServerSentEventMessage(comment="keep-alive", data=None)

    return ServerSentEvent(events())


async def _video(svc: Service, request: Request, job_id: str) -> files.Span:
    """What to send of a job's video, or the 4xx that says why there is none to send."""
    state = await job_state(svc, job_id)
    if state.artifact is None:
        raise HTTPException(status_code=409, detail=f"job {job_id} has no video: it is {state.status}")
    artifact = state.artifact
    try:
        # Both on the one worker thread: in an object store each is a request over the network.
        size = await in_thread(lambda: files.checked(svc.artifacts, artifact, f"job {job_id}'s", deleted=_deleted_at(svc, state)))
    except files.ArtifactProblem as exc:
        raise HTTPException(status_code=exc.status, detail=exc.message) from None
    return files.span(svc.artifacts, artifact.path, size, request.headers, media_type=artifact.media_type, sha256=artifact.sha256)


_VIDEO_ERRORS = problems(401, 404, 409, 410, 416, 422)


@get(
    "/jobs/{job_id:str}/video",
    summary="The finished video (supports Range)",
    responses=_VIDEO_ERRORS,
    media_type="video/mp4",
    opt={UNCOMPRESSED: True},
)
async def job_video(svc: NamedDependency[Service], request: Request, job_id: FromPath[str]) -> Response:
    """The job's video, whole or the byte range a Range asks for, once it is found to be the file its
    record describes: 409 before there is one, 410 once it is deleted, missing or changed. With
    H3_ARTIFACT_SERVING=redirect and an object store, a 307 to a presigned URL instead."""
    return _send(svc, await _video(svc, request, job_id))


@head(
    "/jobs/{job_id:str}/video",
    summary="The finished video's headers (size, ETag)",
    responses=_VIDEO_ERRORS,
    media_type="video/mp4",
    opt={UNCOMPRESSED: True},
)
async def job_video_head(svc: NamedDependency[Service], request: Request, job_id: FromPath[str]) -> Response[None]:
    """GET's status and headers for the job's video (its size, ETag, the range), without the body."""
    return _send(svc, await _video(svc, request, job_id), head_only=True)


def _send(svc: Service, span: files.Span, *, head_only: bool = False) -> Response:
    settings = svc.settings
    return files.send(span, serving=settings.artifact_serving, ttl_s=settings.artifact_url_ttl, head_only=head_only)


def document(openapi: OpenAPI) -> None:
    """The video's media types, whole (200) or a range (206), for GET and HEAD."""
    for method in ("get", "head"):
        file_responses(openapi, "/v1/jobs/{job_id}/video", method, files.VIDEO_MEDIA_TYPES)


handlers = [
    create_job,
    get_job,
    patch_job,
    list_jobs,
    cancel_job,
    retry_job,
    job_events,
    job_webhooks,
    job_stream,
    job_video,
    job_video_head,
]
