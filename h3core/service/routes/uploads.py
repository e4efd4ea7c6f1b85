"""/v1/uploads: keyframes and references, stored by id."""

from __future__ import annotations

from typing import Annotated

from litestar import Request, post
from litestar.exceptions import HTTPException
from litestar.params import Parameter

from h3core.adapters.uploads import CONTENT_TYPES, Upload, UploadRejected
from h3core.service.context import Service
from h3core.service.views import problems


@post(
    "/uploads",
    status_code=201,
    summary="Upload a keyframe or reference",
    description="The raw file as the body, its type in Content-Type (" + ", ".join(sorted(CONTENT_TYPES)) + "). "
    "Returns the id that requests name in keyframes or references.",
    responses=problems(400, 401, 413, 415, 422),
    request_max_body_size=None,  # the upload store enforces the per-kind limit while it streams
)
async def upload(
    svc: Service,
    request: Request,
    content_type: Annotated[str, Parameter(header="Content-Type")],
) -> Upload:
    try:
        return await svc.uploads.put(content_type, request.stream())
    except UploadRejected as exc:
        extra = {"errors": [{"field": exc.field, "message": str(exc)}]}
        if exc.limit is not None:
            extra["limit"] = exc.limit
        raise HTTPException(status_code=exc.status, detail=str(exc), extra=extra) from None


handlers = [upload]
