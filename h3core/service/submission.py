"""Submitting a request, as every HTTP dialect does: check the uploads it names, then admit and
store it through the runner. Each dialect answers the runner's refusals in its own shape."""

from __future__ import annotations

import anyio
from litestar.exceptions import NotFoundException, ValidationException

from h3core.domain.geometry import Media
from h3core.domain.request import UPLOAD_KINDS, GenerationRequest
from h3core.domain.state import JobState
from h3core.domain.webhooks import WebhookTarget
from h3core.service.context import Service


async def in_thread(fn, *args):
    return await anyio.to_thread.run_sync(lambda: fn(*args))


def job_state(svc: Service, job_id: str) -> JobState:
    """The job, or 404. A point read: inline on the event loop (cheaper than a thread hop)."""
    state = svc.store.get(job_id)
    if state is None:
        raise NotFoundException(f"no job {job_id!r}")
    return state


def upload_media(svc: Service, request: GenerationRequest) -> dict[str, Media]:
    """Check every upload the request names exists and is of the right kind; collect their media."""
    wanted: list[tuple[str, str, str]] = []  # (field, id, kind)
    for name, ids in request.uploads().items():
        single = name.startswith("keyframes.")
        wanted += [(name if single else f"{name}.{i}", v, UPLOAD_KINDS[name]) for i, v in enumerate(ids)]
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


async def submit(
    svc: Service,
    request: GenerationRequest,
    *,
    priority: int = 0,
    idempotency_key: str | None = None,
    remixed_from: str | None = None,
    job_id: str | None = None,
    webhook: WebhookTarget | None = None,
) -> JobState:
    """Check the request's uploads (a `ValidationException` naming each bad one), then
    `runner.submit`, whose `Refused`, `IdempotencyMismatch` and `ShuttingDown` pass through."""
    # Reading the uploads' records is file I/O: a thread, and only when the request names any.
    media = await in_thread(upload_media, svc, request) if request.keyframes is not None or request.references is not None else {}
    return await svc.runner.submit(
        request,
        priority=priority,
        idempotency_key=idempotency_key,
        media=media,
        remixed_from=remixed_from,
        job_id=job_id,
        webhook=webhook,
    )
