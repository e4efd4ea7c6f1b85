"""Bearer tokens for every /v1 route (docs/design.md §2.7)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard


def _matches(given: bytes, tokens: Sequence[bytes]) -> bool:
    """Constant time in the token's content: every configured token is compared, always."""
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given, token)
    return ok


def _bearer(authorization: str, tokens: Sequence[bytes]) -> bool:
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and _matches(given.strip().encode(), tokens)


def bearer_matches(authorization: str | None, tokens: list[str]) -> bool:
    """Whether an Authorization header carries one of `tokens` as a bearer token."""
    return _bearer(authorization or "", [t.encode() for t in tokens])


def bearer_guard(tokens: list[str]) -> Guard | None:
    """The guard for `tokens`, or None when there are none (loopback only): no guard to run.

    An `async def`, so Litestar calls it on the event loop: a sync guard would be sent to the
    thread pool on every request, which costs far more than the comparison it makes."""
    if not tokens:
        return None
    expected = tuple(t.encode() for t in tokens)

    async def guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        if not _bearer(connection.headers.get("authorization", ""), expected):
            raise NotAuthorizedException(
                "a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="h3core"'},
            )

    return guard
