"""Submitting a request, as every HTTP dialect does: through the service's `Submissions`, which
check the webhook and uploads it names, then admit and store it. Each dialect answers the
refusals in its own shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
from litestar.exceptions import NotFoundException, ValidationException

from h3core.adapters.artifacts.location import is_s3_url
from h3core.adapters.store.location import is_postgres_url
from h3core.domain.request import GenerationRequest
from h3core.domain.state import JobState
from h3core.domain.webhooks import WebhookTarget
from h3core.runtime.errors import InvalidSubmission
from h3core.runtime.submissions import Submission
from h3core.service.context import Service

T = TypeVar("T")


async def in_thread(fn, *args):
    """`fn(*args)` on a worker thread, awaited: for store reads that can be long."""
    return await anyio.to_thread.run_sync(lambda: fn(*args))


async def point_read(svc: Service, fn: Callable[..., T], *args: object) -> T:
    """A point read of the store (one indexed row): inline on the event loop where the store is a
    local file (a hop to a thread costs more than the read), on a worker thread where it is a server
    (PostgreSQL): there a read waits on the network, and while the server restarts on a connection,
    which must not stall every other request, /healthz among them."""
    if is_postgres_url(svc.settings.db):
        return await in_thread(fn, *args)
    return fn(*args)


async def artifacts_read(svc: Service, fn: Callable[..., T], *args: object) -> T:
    """A point read that also reads the artifact store (whether a video was deleted: marks beside
    it): as `point_read` where the artifacts are a folder (a file or two), on a worker thread
    where they are an object store, where each mark is a request over the network."""
    if is_s3_url(svc.settings.artifacts):
        return await in_thread(fn, *args)
    return await point_read(svc, fn, *args)


async def job_state(svc: Service, job_id: str) -> JobState:
    """The job, or 404 (a point read)."""
    state = await point_read(svc, svc.store.get, job_id)
    if state is None:
        raise NotFoundException(f"no job {job_id!r}")
    return state


async def submit(
    svc: Service,
    request: GenerationRequest,
    *,
    priority: int = 0,
    idempotency_key: str | None = None,
    remixed_from: str | None = None,
    webhook: WebhookTarget | None = None,
    retry_of: str | None = None,
    by: str | None = None,
) -> Submission:
    """`svc.submissions.submit`, with the uploads it names answered for each dialect to shape: a
    `NotFoundException` (404) where each one at fault is a well-formed id no upload has (`extra`
    names each field, its id and why), a `ValidationException` naming each where one is of the
    wrong kind; its `InvalidSubmission` for a webhook, `Refused`, `IdempotencyMismatch` and
    `ShuttingDown` pass through, for each dialect to answer its way."""
    try:
        return await svc.submissions.submit(
            request,
            priority=priority,
            idempotency_key=idempotency_key,
            remixed_from=remixed_from,
            webhook=webhook,
            retry_of=retry_of,
            by=by,
        )
    except InvalidSubmission as exc:
        if exc.about != "uploads":
            raise
        if len(exc.missing) == len(exc.errors):
            # The request is as the document says (a malformed id never gets here: 422 on its
            # form); what it names is not there, as a job id in a path that is not.
            ids = dict(exc.missing)
            errors = [{"field": field, "message": message, "upload_id": ids[field]} for field, message in exc.errors]
            raise NotFoundException(detail=str(exc), extra={"errors": errors}) from None
        raise ValidationException(
            detail="invalid uploads", extra=[{"key": field, "message": message} for field, message in exc.errors]
        ) from None
