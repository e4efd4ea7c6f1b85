"""/v1/uploads: keyframes and references, stored by id."""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Request, post
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException
from litestar.openapi.spec import OpenAPIMediaType as MediaTypeSpec
from litestar.openapi.spec import Operation, RequestBody, Schema
from litestar.openapi.spec.enums import OpenAPIFormat, OpenAPIType

from h3core.adapters.uploads import CONTENT_TYPES, Upload, UploadRejected
from h3core.service.bodies import BODY_OPT, upload_limit_note
from h3core.service.context import Service
from h3core.service.crosssite import OWN_CONTENT_TYPES_OPT
from h3core.service.views import problems


@dataclass
class _RawFileOperation(Operation):
    """The body is the file itself, in one of the accepted types (read as a stream, so not a
    handler parameter Litestar could describe)."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            required=True,
            description="The file's bytes; its type in Content-Type.",
            content={
                t: MediaTypeSpec(schema=Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY))
                for t in sorted(CONTENT_TYPES)
            },
        )


@post(
    "/uploads",
    status_code=201,
    summary="Upload a keyframe or reference",
    description="The raw file as the body, its type in Content-Type (" + ", ".join(sorted(CONTENT_TYPES)) + "). "
    "Returns the id that requests name in keyframes or references.",
    responses=problems(400, 401, 413, 415, 422),
    # File types, not JSON: the upload store checks them (415) and each kind's limit as it streams.
    opt={OWN_CONTENT_TYPES_OPT: True, BODY_OPT: "own"},
    operation_class=_RawFileOperation,
)
async def upload(svc: NamedDependency[Service], request: Request) -> Upload:
    """Store the body as an upload (its type from Content-Type, its kind's limit applied as it streams)
    and answer its record, whose id requests name. A refusal answers `UploadRejected`'s status, naming
    the limit where one was passed."""
    try:
        return await svc.uploads.put(request.headers.get("content-type", ""), request.stream())
    except UploadRejected as exc:
        detail = str(exc) if exc.status != 413 or exc.limit is None else f"{exc} ({upload_limit_note(exc.limit, svc.settings)})"
        extra: dict[str, object] = {"errors": [{"field": exc.field, "message": detail}]}
        if exc.limit is not None:
            extra["limit"] = exc.limit
        raise HTTPException(status_code=exc.status, detail=detail, extra=extra) from None


handlers = [upload]
