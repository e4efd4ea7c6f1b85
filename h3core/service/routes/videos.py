"""/v1/videos: OpenAI's Videos API over h3core's jobs, so that any OpenAI SDK client generates here.

Same tokens, runner and admission as /v1/jobs; a video's id is its job's id. On these routes
only, every error is in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`).
What maps to what is pure, in `h3core.service.openai_videos`.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Literal

import anyio
from litestar import Request, Response, Router, delete, get, post
from litestar.datastructures import UploadFile
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException, NotAuthorizedException, NotFoundException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Encoding, OpenAPI, OpenAPIMediaType, RequestBody
from litestar.params import FromPath, FromQuery, HeaderParameter, JSONBody, QueryParameter
from pydantic import ValidationError

from h3core.adapters import previews
from h3core.adapters.uploads import ID_PATTERN, UploadRejected, is_upload_id
from h3core.domain.request import GenerationRequest, Keyframes
from h3core.domain.state import JobState
from h3core.runtime.errors import IdempotencyMismatch, NotCancellable, Refused, ShuttingDown
from h3core.service import files
from h3core.service.bodies import BODY_OPT, BodyNotJson, upload_limit_note
from h3core.service.cancelling import cancel
from h3core.service.compression import UNCOMPRESSED
from h3core.service.context import Service
from h3core.service.crosssite import OWN_CONTENT_TYPES_OPT
from h3core.service.methods import with_options
from h3core.service.openai_videos import (
    VIDEO_ID_PATTERN,
    ErrorResponse,
    Remix,
    Video,
    VideoApiError,
    VideoCreate,
    VideoDeleted,
    VideoList,
    bad,
    error_body,
    param_for,
    poll_after_ms,
    request_fields,
    unflatten_form,
    video_object,
    video_status,
)
from h3core.service.openapi import RawSchema, add_component, file_responses, ref
from h3core.service.requests import JobCreate, not_an_object
from h3core.service.submission import artifacts_read, in_thread, submit
from h3core.service.validation import field_errors

# A placeholder upload id, to validate a request before its input_reference is stored.
_PENDING_UPLOAD = "u_" + "0" * 32
_DATA_URL = re.compile(r"^data:(image/[A-Za-z0-9.+-]+);base64,(.*)$", re.S)
_PREVIEW_MAKERS: dict[str, tuple[Callable[..., bytes], str]] = {
    "thumbnail": (previews.thumbnail, previews.THUMBNAIL_TYPE),
    "spritesheet": (previews.spritesheet, previews.SPRITESHEET_TYPE),
}
_IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key", min_length=1, max_length=200)]


def _errors(*codes: int) -> dict[int, ResponseSpec]:
    return {code: ResponseSpec(data_container=ErrorResponse, description="OpenAI's error shape") for code in codes}


def _not_null(prop: dict) -> dict:
    options = [o for o in prop.get("anyOf", ()) if o != {"type": "null"}]
    if len(options) == 1:
        prop = {**{k: v for k, v in prop.items() if k not in ("anyOf", "default")}, **options[0]}
    return prop


def document(openapi: OpenAPI, models: Sequence[str]) -> None:
    """The create call's body in the document, as `VideoCreate` states it (the deployment's models
    listed): JSON, and the multipart form the SDK sends with a file (its scalar fields, the file);
    the content route's media types, one per variant."""
    variants = {t: f"variant=video, {what}" for t, what in files.VIDEO_MEDIA_TYPES.items()}
    variants |= {previews.THUMBNAIL_TYPE: "variant=thumbnail", previews.SPRITESHEET_TYPE: "variant=spritesheet"}
    file_responses(openapi, "/v1/videos/{video_id}/content", "get", variants)
    schema = add_component(openapi, VideoCreate)
    schema["properties"]["model"] = {"anyOf": [{"enum": list(models)}, {"type": "null"}], "default": None}
    # A form field is text, there or not: the form takes OpenAI's fields (the canvas and the length
    # as size and seconds, the mode following the file: fl2va with one, t2va without) and h3core's
    # numbers; everything else goes as JSON.
    kept = ("prompt", "model", "size", "seconds", "steps", "seed", "priority", "quality")
    scalar = {k: _not_null(v) for k, v in schema["properties"].items() if k in kept}
    form = {
        "type": "object",
        "required": ["prompt"],
        "additionalProperties": False,
        "properties": {**scalar, "input_reference": {"type": "string", "format": "binary", "minLength": 1}},  # an empty file: 400
    }
    images = "image/png, image/jpeg"  # (webp is taken too; these are the ones a client can be expected to make)
    assert openapi.paths is not None
    operation = openapi.paths["/v1/videos"].post
    assert operation is not None
    operation.request_body = RequestBody(
        required=True,
        content={
            # RawSchema: written by `to_schema`, as the Schema that Litestar's annotation asks for is.
            "application/json": OpenAPIMediaType(schema=RawSchema(ref(VideoCreate))),  # type: ignore[arg-type]
            "multipart/form-data": OpenAPIMediaType(
                schema=RawSchema(form),  # type: ignore[arg-type]
                encoding={"input_reference": Encoding(content_type=images)},
            ),
        },
    )


# -- reads ------------------------------------------------------------------------------------


def _deleted_at(svc: Service, state: JobState) -> datetime | None:
    """When DELETE deleted the video: the store's mark, whichever node took the DELETE and whichever
    holds the file; else this node's records (earlier versions recorded only those)."""
    return files.deleted_at(svc.store, svc.artifacts, state)


def _found(svc: Service, video_id: str) -> tuple[JobState | None, datetime | None]:
    state = svc.store.get(video_id)
    return state, None if state is None else _deleted_at(svc, state)


async def _state(svc: Service, video_id: str) -> JobState:
    """The video's job, or 404: there is none, or the video was deleted (as OpenAI's API answers).
    Point reads, as in /v1/jobs (`artifacts_read`: off the event loop where either store is a server)."""
    state, deleted = await artifacts_read(svc, _found, svc, video_id)
    if state is None:
        raise VideoApiError(404, f"no video {video_id!r}", param="video_id", code="video_not_found")
    if deleted is not None:
        raise VideoApiError(
            404,
            f"video {video_id!r} was deleted at {deleted.isoformat()}; its job and log stay on /v1/jobs/{video_id}",
            param="video_id",
            code="video_deleted",
        )
    return state


def _video(svc: Service, state: JobState) -> Video:
    return video_object(state, model=svc.settings.openai_models[0])


# -- create -----------------------------------------------------------------------------------


async def _params(request: Request) -> tuple[dict[str, object], bool]:
    """The create call's fields, and whether they came as a form (strings, to be coerced)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        form = await request.form()
        return unflatten_form(form.multi_items()), True
    if ctype not in ("", "application/json"):
        raise VideoApiError(
            415, f"send the body as application/json or multipart/form-data, not {ctype}", code="unsupported_media_type"
        )
    try:
        body = await request.json()
    except BodyNotJson as exc:
        raise bad(None, exc.detail, code=exc.code) from None
    if not isinstance(body, dict):
        empty = body is None and not await request.body()
        raise bad(None, "a JSON body is required" if empty else not_an_object(body), code="invalid_json")
    return body, False


def _validated(fields: dict[str, object], params: dict[str, object], *, form: bool) -> JobCreate:
    try:
        # Form fields are all strings: coerce ("20" steps). JSON keeps the model's strictness.
        return JobCreate.model_validate(fields, strict=False if form else None)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        param = param_for(e["loc"], params)
        if e["type"] == "extra_forbidden":
            raise bad(
                param,
                f"unknown parameter {param!r}: give OpenAI's (prompt, model, size, seconds, input_reference) "
                "or the fields of h3core's own request (POST /v1/jobs) through extra_body",
                code="unknown_parameter",
            ) from None
        raise bad(param, f"{param or 'request'}: {str(e['msg']).removeprefix('Value error, ')}") from None


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _stored_reference(svc: Service, ref: object) -> str:
    """The upload id an `input_reference` names or becomes: a file sent with the form, a data URL,
    or `{"file_id": <an id from POST /v1/uploads>}`."""
    if isinstance(ref, dict) and set(ref) == {"file_id"} and isinstance(ref["file_id"], str):
        if not is_upload_id(ref["file_id"]):  # the form the document gives: else 400 here, not a lookup's 404
            raise bad("input_reference", f"input_reference.file_id must be an id from POST /v1/uploads, of the form {ID_PATTERN}")
        return ref["file_id"]  # looked for with the request's other uploads
    if isinstance(ref, UploadFile):
        ctype, chunks = ref.content_type, _one(await ref.read())
    elif isinstance(ref, dict) and set(ref) == {"image_url"} and isinstance(ref["image_url"], str):
        m = _DATA_URL.match(ref["image_url"])
        if m is None:
            raise bad(
                "input_reference", "image_url must be a base64 data URL (data:image/png;base64,...); no remote URL is fetched"
            )
        try:
            ctype, chunks = m.group(1), _one(base64.b64decode(m.group(2), validate=True))
        except binascii.Error:
            raise bad("input_reference", "image_url's base64 data does not decode") from None
    else:
        raise bad("input_reference", "input_reference must be an image file, {'file_id': ...} or {'image_url': 'data:...'}")
    try:
        upload = await svc.uploads.put(ctype, chunks)
    except UploadRejected as exc:
        if exc.status == 413 and exc.limit is not None:
            message = f"input_reference: {exc} ({upload_limit_note(exc.limit, svc.settings)})"
            raise VideoApiError(413, message, param="input_reference", code="request_too_large") from None
        raise VideoApiError(400, f"input_reference: {exc}", param="input_reference", code="invalid_upload") from None
    if upload.kind != "image":
        raise bad("input_reference", f"input_reference must be an image (the first frame), not {upload.kind}")
    return upload.id


async def _submit(
    svc: Service,
    request: GenerationRequest,
    params: dict[str, object],
    *,
    priority: int,
    idempotency_key: str | None,
    remixed_from: str | None = None,
) -> JobState:
    try:
        submission = await submit(svc, request, priority=priority, idempotency_key=idempotency_key, remixed_from=remixed_from)
        return submission.state
    except NotFoundException as exc:  # an upload it names is not there
        first = exc.extra["errors"][0] if isinstance(exc.extra, dict) else {}
        key = str(first.get("field") or "")
        param = param_for(key.split(".") if key else (), params)
        raise VideoApiError(404, str(first.get("message") or exc.detail), param=param, code="upload_not_found") from None
    except ValidationException as exc:  # an upload it names is of the wrong kind
        first = exc.extra[0] if isinstance(exc.extra, list) and exc.extra else {}
        key = str(first.get("key") or "")
        raise bad(
            param_for(key.split(".") if key else (), params), str(first.get("message") or exc.detail), code="invalid_upload"
        ) from None
    except Refused as exc:
        ceiling = exc.decision.ceiling.model_dump() if exc.decision.ceiling else None
        raise VideoApiError(400, exc.decision.detail, param=exc.decision.field, code="refused", ceiling=ceiling) from None
    except IdempotencyMismatch as exc:
        raise VideoApiError(409, str(exc), code="idempotency_key_reused") from None
    except ShuttingDown as exc:
        raise VideoApiError(503, str(exc), code="shutting_down", headers={"Retry-After": "5"}) from None


@post(
    "/",
    status_code=200,
    summary="Create a video (OpenAI's Videos API)",
    description="JSON or multipart, as the OpenAI SDK sends it: prompt, model, size ('WxH', sides multiples of 32), "
    "seconds (24 fps), input_reference (an image: fl2va's first frame); any field of POST /v1/jobs besides.",
    responses={
        **_errors(400, 401, 409, 413, 415, 503),
        404: ResponseSpec(
            data_container=ErrorResponse,
            description="an upload id (`input_reference.file_id`, a keyframe or a reference), of the form the schema "
            "gives, that no upload has: `param` names it, `code` is `upload_not_found`",
        ),
    },
    # JSON or multipart (the SDK's upload): `_params` checks, 415 otherwise; each has its limit.
    opt={OWN_CONTENT_TYPES_OPT: True, BODY_OPT: "json_or_form"},
)
async def create_video(svc: NamedDependency[Service], request: Request, idempotency_key: _IdempotencyKey = None) -> Video:
    """Create a video from OpenAI's parameters and h3core's own fields, as JSON or the SDK's form:
    validated before an `input_reference` is stored, then submitted as a job; answers its video object."""
    params, form = await _params(request)
    ref = params.get("input_reference")
    fields = request_fields(params, served=svc.settings.openai_models, first_frame=_PENDING_UPLOAD if ref is not None else None)
    job = _validated(fields, params, form=form)  # before any upload is stored
    generation = job.generation()
    if ref is not None:
        generation = generation.model_copy(update={"keyframes": Keyframes(first=await _stored_reference(svc, ref))})
    state = await _submit(svc, generation, params, priority=job.priority, idempotency_key=idempotency_key)
    return _video(svc, state)


@post(
    "/{video_id:str}/remix",
    status_code=200,
    summary="Remix a video: the same parameters, a new prompt",
    responses=_errors(400, 401, 404, 409, 503),
)
async def remix_video(
    svc: NamedDependency[Service], video_id: FromPath[str], data: JSONBody[Remix], idempotency_key: _IdempotencyKey = None
) -> Video:
    """A new video with the source video's request and a new prompt, recorded as remixed from it."""
    source = await _state(svc, video_id)
    try:
        request = GenerationRequest.model_validate({**source.request.model_dump(), "prompt": data.prompt})
    except ValidationError as exc:
        raise bad("prompt", f"prompt: {exc.errors(include_url=False)[0]['msg']}") from None
    state = await _submit(svc, request, {}, priority=source.priority, idempotency_key=idempotency_key, remixed_from=video_id)
    return _video(svc, state)


# -- read, list, delete -----------------------------------------------------------------------


@get("/{video_id:str}", summary="A video", responses=_errors(401, 404))
async def retrieve_video(svc: NamedDependency[Service], video_id: FromPath[str]) -> Response[Video]:
    """The video object, with `openai-poll-after-ms` until it has ended."""
    state = await _state(svc, video_id)
    wait = poll_after_ms(state, datetime.now(UTC))
    return Response(_video(svc, state), headers={"openai-poll-after-ms": str(wait)} if wait is not None else {})


def _page(svc: Service, cursor: int | None, limit: int, oldest_first: bool) -> VideoList:
    """Up to `limit` videos past `cursor`, deleted ones left out: the store skips those it has
    marked (`list_videos`), so a page reads as much with thousands deleted as with none. A deletion
    only this node's artifact store recorded (an earlier h3core's) is found on the rows read and
    marked, once; the rows are then read again past it."""
    data: list[Video] = []
    more = False
    while not more:
        if oldest_first:
            rows = svc.store.list_videos(limit=limit + 1, oldest_first=True, after=cursor)
        else:
            rows = svc.store.list_videos(limit=limit + 1, oldest_first=False, before=cursor)
        for _, state in rows:
            deleted = files.recorded_deleted_at(svc.artifacts, state)  # the store's marks are left out already
            if deleted is not None:
                svc.store.mark_video_deleted(state.job_id, deleted)
                continue
            if len(data) == limit:
                more = True
                break
            data.append(_video(svc, state))
        if len(rows) <= limit:
            break
        cursor = rows[-1][0]
    return VideoList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=more)


@get("/", summary="Videos, newest first (order=asc: oldest first)", responses=_errors(400, 401, 404))
async def list_videos(
    svc: NamedDependency[Service],
    after: Annotated[str | None, QueryParameter(pattern=VIDEO_ID_PATTERN)] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
    order: FromQuery[Literal["asc", "desc"]] = "desc",
) -> VideoList:
    """A page of videos, newest first (`order=asc`: oldest first), past the video `after`; deleted ones
    are left out."""
    cursor = None
    if after is not None:
        cursor = svc.store.cursor_of(after)
        if cursor is None:
            raise VideoApiError(404, f"no video {after!r} to list after", param="after", code="video_not_found")
    return await in_thread(_page, svc, cursor, limit, order == "asc")


@delete(
    "/{video_id:str}",
    status_code=200,
    summary="Delete a video: it is gone from /v1/videos (404 after, as OpenAI's API answers)",
    description="A live video is cancelled and a finished one's file deleted. The deletion is recorded in the store "
    "first: from then on every /v1/videos route of every node answers 404 for it (code video_deleted), the list "
    "leaves it out, and no node serves its file; its job and event log stay on /v1/jobs. OpenAI's answer, with one "
    "field of h3core's: `file` says what became of the video's file. `removed`: this node held it and removed it. "
    "`recorded`: this node does not hold it (with an artifacts folder per node, another does) or the job has not "
    "ended yet (a cancel on its way; it may still finish with a video): the node that holds the file removes it "
    "within H3_DELETION_SWEEP seconds (default 2) of the deletion, or of the job's end. `none`: the video has no "
    "file (it failed, or was cancelled before one was made).",
    responses=_errors(401, 404),
)
async def delete_video(svc: NamedDependency[Service], video_id: FromPath[str]) -> VideoDeleted:
    """Delete the video: recorded in the store (gone from /v1/videos on every node at once),
    cancelled if it is live, and its file removed if it has ended with one this node holds; the
    answer's `file` says which (another node removes a file it holds when it next sweeps)."""
    state = await _state(svc, video_id)
    # The store's mark first: the fact every node acts on (the list selects on it, every route
    # reads it, the node that holds the file removes it); then this node's record beside the video.
    await in_thread(svc.store.mark_video_deleted, video_id, datetime.now(UTC))
    await in_thread(svc.artifacts.delete_video, video_id)
    if not state.terminal:
        try:
            state = await cancel(svc, video_id, reason="deleted through /v1/videos")
        except NotCancellable as exc:
            state = exc.state  # it ended meanwhile: delete what it left
        if not state.terminal:
            return VideoDeleted(id=video_id, deleted=True, file="recorded")  # still stopping: its node sweeps what it makes
        # Ended: cancelled, or done because the cancel came too late: its video goes as a finished one's.
    if state.artifact is None:
        return VideoDeleted(id=video_id, deleted=True, file="none")
    path = state.artifact.path
    removed = await in_thread(_remove_here, svc, path)
    return VideoDeleted(id=video_id, deleted=True, file="removed" if removed else "recorded")


def _remove_here(svc: Service, path: str) -> bool:
    """Remove the video's file where this node holds it; whether this node's copy is removed now
    (by this call, or by this node's sweep a moment before)."""
    try:
        if svc.artifacts.measure(path, hashed=False)[0] is not None:
            svc.artifacts.delete(path)
        return svc.artifacts.deleted_at(path) is not None
    except ValueError:
        return False  # a recorded path outside the store: nothing of it is here


# -- content ----------------------------------------------------------------------------------


@get(
    "/{video_id:str}/content",
    summary="A finished video's mp4 (supports Range), thumbnail (WebP) or spritesheet (JPEG)",
    responses=_errors(400, 401, 404, 416),  # 200 and 206, in each variant's type: `document`
    opt={UNCOMPRESSED: True},
)
async def video_content(
    svc: NamedDependency[Service],
    request: Request,
    video_id: FromPath[str],
    variant: FromQuery[Literal["video", "thumbnail", "spritesheet"]] = "video",
) -> Response:
    """The finished video's file (whole, or the byte range a Range asks for), or a thumbnail or
    spritesheet made from it; no video yet, or one deleted, missing or damaged, is a 404 whose code
    says why."""
    state = await _state(svc, video_id)
    artifact = state.artifact
    if artifact is None:
        raise VideoApiError(
            404, f"video {video_id} has no content: it is {video_status(state)}", param="video_id", code="video_not_ready"
        )
    try:
        # `_state` read the deletion marks (none, or it answered 404): not read again here.
        size = await in_thread(lambda: files.checked(svc.artifacts, artifact, f"video {video_id}'s", deleted=None))
        if variant == "video":
            sent = files.span(
                svc.artifacts, artifact.path, size, request.headers, media_type=artifact.media_type, sha256=artifact.sha256
            )
            return files.send(sent, serving=svc.settings.artifact_serving, ttl_s=svc.settings.artifact_url_ttl)
        make, media_type = _PREVIEW_MAKERS[variant]

        def preview() -> bytes:
            with svc.artifacts.local_file(artifact.path) as path:
                return make(path, frames=artifact.frames)

        try:
            data = await anyio.to_thread.run_sync(preview, limiter=svc.previews)
        except FileNotFoundError:
            gone = f"video {video_id}'s file went missing from the artifact store"
            raise files.ArtifactProblem(410, gone, "content_missing") from None
        except previews.DECODE_ERRORS as exc:  # the recorded size, but not a video any more
            raise files.ArtifactProblem(410, f"video {video_id}'s file cannot be decoded: {exc}", "content_damaged") from exc
    except files.ArtifactProblem as exc:  # 404 in OpenAI's API (the SDK's NotFoundError), the code says why
        raise VideoApiError(404, exc.message, param="video_id", code=exc.code) from None
    return Response(data, media_type=media_type, headers={"ETag": f'"{artifact.sha256}-{variant}"'})


# -- errors, in OpenAI's shape ----------------------------------------------------------------

_CODES = {
    401: "invalid_api_key",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    416: "range_not_satisfiable",
}


def _on_api_error(_: Request, exc: VideoApiError) -> Response:
    return Response(exc.body(), status_code=exc.status, headers=exc.headers)


def _on_validation(_: Request, exc: ValidationException) -> Response:
    first = field_errors(exc)[0]
    param = None if first["field"] == "body" else first["field"]  # the body as a whole is no parameter
    message = f"invalid {first['field']}: {first['message']}"
    return Response(error_body(400, message, param=param, code="invalid_value"), status_code=400)


def owns(path: str) -> bool:
    """Whether a path is this API's: its errors are OpenAI's shape even where no route matched."""
    return path == "/v1/videos" or path.startswith("/v1/videos/")


def on_http_error(_: Request, exc: HTTPException) -> Response:
    """An `HTTPException` in OpenAI's shape, its code the exception's own or the status's: on these
    routes, and under /v1/videos where no route matched."""
    code = getattr(exc, "code", None) or _CODES.get(exc.status_code)  # an exception's own (BodyNotJson), or the status's
    body = error_body(exc.status_code, exc.detail or "request refused", code=code)
    return Response(body, status_code=exc.status_code, headers=exc.headers or {})


def _on_internal(request: Request, exc: Exception) -> Response:
    logging.getLogger("h3core.service").exception("unhandled error on %s %s", request.method, request.scope["path"])
    return Response(error_body(500, "internal error; the server log has the details", code="internal_error"), status_code=500)


router = Router(
    path="/videos",
    route_handlers=with_options([create_video, remix_video, retrieve_video, list_videos, delete_video, video_content]),
    tags=["videos (OpenAI-compatible)"],
    exception_handlers={
        VideoApiError: _on_api_error,
        ValidationException: _on_validation,
        NotAuthorizedException: on_http_error,
        HTTPException: on_http_error,
        Exception: _on_internal,
    },
)
