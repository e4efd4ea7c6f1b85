"""Litestar's validation errors in the client's terms: each one's field as the client sent it
(the body as `body`, a header as it is spelled on the wire), and its message."""

from __future__ import annotations

from litestar.exceptions import ValidationException

# Header parameters are named in errors as the client sends them, not as Python spells them.
HEADER_NAMES = {"idempotency_key": "Idempotency-Key", "last_event_id": "Last-Event-ID", "content_type": "Content-Type"}


def _error(e: dict) -> dict[str, str]:
    key = str(e.get("key") or "body")
    if key == "data":  # the request body, as Litestar names the handler's parameter
        message = str(e.get("message"))
        return {"field": "body", "message": "a JSON body is required" if message == "'data'" else message}
    return {"field": HEADER_NAMES.get(key, key), "message": str(e.get("message"))}


def field_errors(exc: ValidationException) -> list[dict[str, str]]:
    """`{"field", "message"}` for each error; one for the body when Litestar names none."""
    errors = [_error(e) for e in (exc.extra if isinstance(exc.extra, list) else [])]
    return errors or [{"field": "body", "message": exc.detail or "invalid request"}]
