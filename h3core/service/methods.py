"""OPTIONS answers that name every method of a path.

Litestar's own OPTIONS answer lists the methods of the handler registered first for a path only
(GET /v1/jobs was missing from its Allow); these are made from all of a router's handlers."""

from __future__ import annotations

from litestar import HttpMethod, Response, route
from litestar.handlers import HTTPRouteHandler
from litestar.status_codes import HTTP_204_NO_CONTENT


def _allow(methods: set[str]):
    allow = ", ".join(sorted(methods | {"OPTIONS"}))

    def options() -> Response:
        return Response(content=None, status_code=HTTP_204_NO_CONTENT, headers={"Allow": allow})

    return options


def with_options(handlers: list[HTTPRouteHandler]) -> list[HTTPRouteHandler]:
    """`handlers`, and an OPTIONS handler for each of their paths."""
    methods: dict[str, set[str]] = {}
    for handler in handlers:
        for path in handler.paths:
            methods.setdefault(path, set()).update(handler.http_methods)
    options = [
        route(path, http_method=[HttpMethod.OPTIONS], include_in_schema=False, sync_to_thread=False)(_allow(m))
        for path, m in methods.items()
    ]
    return [*options, *handlers]
