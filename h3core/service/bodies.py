"""Reading a request body: within its limit, and as JSON, each failure a 4xx that says why.

Every route's body is JSON of at most `H3_MAX_BODY_BYTES`, checked against Content-Length before
a byte is read and counted as the bytes arrive, so nothing larger is held or parsed. Two routes
say otherwise in their `opt` (`BODY_OPT`): POST /v1/uploads streams the file to the upload store,
which applies each kind's limit (`H3_MAX_UPLOAD_BYTES` caps them all); POST /v1/videos takes JSON
under the same limit or, as the SDK sends a file, a multipart form held whole to be parsed: up
to the image limit and room for the form's other fields. Over its limit: 413 naming the limit
and the setting. A body that is not JSON: 400 saying so, in the same shape as other refusals.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from litestar import Request
from litestar.exceptions import ClientException, HTTPException, SerializationException

from h3core.runtime.settings import Settings

# A route handler's `opt` key: how its body is bounded ("json" when unset).
BODY_OPT = "body"
BodyKind = Literal["json", "json_or_form", "own"]
FORM_FIELDS_BYTES = 1 << 20  # a multipart create's fields besides its file
JSON_SETTING = "H3_MAX_BODY_BYTES"
UPLOAD_SETTING = "H3_MAX_UPLOAD_BYTES"


@dataclass(frozen=True)
class BodyLimit:
    """A limit on a request body: its size in bytes, the setting that sets it, and the body it bounds,
    which a 413 names."""

    bytes: int
    setting: str
    what: str  # the body it bounds, for the message

    def message(self) -> str:
        """The 413's detail: the limit, the body it bounds, and the setting to raise it."""
        return f"the request body is larger than {self.bytes} bytes, the limit for {self.what}; {self.setting} sets it"


@dataclass(frozen=True)
class BodyLimits:
    """The limit of each kind of body, made once from the settings (`app.state.body_limits`): a JSON
    body, a JSON create that could have come as a form, and a multipart create."""

    json: BodyLimit
    json_create: BodyLimit  # the same limit, on a route that also takes a file as a form
    form: BodyLimit

    @classmethod
    def of(cls, settings: Settings, *, image_bytes: int) -> BodyLimits:
        """`image_bytes`: the upload store's limit for an image (H3_MAX_UPLOAD_BYTES caps it)."""
        images = "a JSON body (send an image as a multipart input_reference file, or through POST /v1/uploads)"
        return cls(
            json=BodyLimit(settings.max_body_bytes, JSON_SETTING, "a JSON body"),
            json_create=BodyLimit(settings.max_body_bytes, JSON_SETTING, images),
            form=BodyLimit(
                image_bytes + FORM_FIELDS_BYTES,
                UPLOAD_SETTING,
                f"a multipart create: an image of {image_bytes} bytes and {FORM_FIELDS_BYTES} for the other fields",
            ),
        )

    def of_request(self, kind: BodyKind, media_type: Callable[[], str]) -> BodyLimit | None:
        """`media_type` is asked only where the kind depends on it (parsing the header costs)."""
        if kind == "own":
            return None
        if kind == "json_or_form":
            return self.form if media_type() == "multipart/form-data" else self.json_create
        return self.json


class BodyTooLarge(HTTPException):
    """413: a body over its route's limit; the answer names the limit in bytes and the setting that
    sets it."""

    status_code = 413

    def __init__(self, limit: BodyLimit) -> None:
        detail = limit.message()
        extra = {"errors": [{"field": "body", "message": detail}], "limit": limit.bytes, "setting": limit.setting}
        super().__init__(detail=detail, extra=extra)


class BodyNotJson(ClientException):
    """400: a body that does not parse as JSON, saying why; `code` is the one OpenAI's shape gives
    it on /v1/videos."""

    code = "invalid_json"  # OpenAI's shape names it (/v1/videos)

    def __init__(self, reason: str) -> None:
        detail = f"the body is not valid JSON: {reason}"
        super().__init__(detail=detail, extra={"errors": [{"field": "body", "message": detail}]})


def upload_limit_note(limit: int, settings: Settings) -> str:
    """What sets an upload store's limit for a kind: the setting, or the kind's own (which it only lowers)."""
    if limit >= settings.max_upload_bytes:
        return f"{UPLOAD_SETTING} sets it"
    return f"the built-in limit for this kind; {UPLOAD_SETTING} ({settings.max_upload_bytes}) can only lower it"


class ServiceRequest(Request):
    """A request whose body is read within its route's limit (`app.state.body_limits`), and
    whose JSON is refused with `BodyNotJson` when it does not parse."""

    async def json(self) -> Any:
        """The body parsed as JSON; a body that does not parse, or is nested too deeply to, raises
        `BodyNotJson`."""
        try:
            return await super().json()
        except SerializationException as exc:
            raise BodyNotJson(str(exc)) from None
        except RecursionError:  # msgspec's bound on nesting: a client's body, not our fault
            raise BodyNotJson("it is nested too deeply to read") from None

    def body_limit(self) -> BodyLimit | None:
        """The limit on this request's body: its route's kind (`BODY_OPT` in its `opt`) and, on a route
        that takes a form, its Content-Type decide which; None where the route bounds its body itself."""
        limits: BodyLimits = self.app.state.body_limits
        return limits.of_request(self.route_handler.opt.get(BODY_OPT, "json"), lambda: self.content_type[0].lower())

    async def stream(self) -> AsyncGenerator[bytes, None]:
        """The body's chunks as they arrive, within `body_limit`: `BodyTooLarge` before a byte is read
        when Content-Length is over it, else as soon as the bytes received are."""
        limit = self.body_limit()
        if limit is None:  # the route bounds its body itself
            async for chunk in super().stream():
                yield chunk
            return
        if self.content_length is not None and self.content_length > limit.bytes:
            raise BodyTooLarge(limit)  # before a byte is read
        seen = 0
        async for chunk in super().stream():
            seen += len(chunk)
            if seen > limit.bytes:
                raise BodyTooLarge(limit)
            yield chunk
