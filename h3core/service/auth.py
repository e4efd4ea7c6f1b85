"""Bearer tokens for every /v1 route (field notes §2.7)."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard


def _matches(given: bytes, tokens: Sequence[bytes]) -> bool:
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given, token)
    return ok


def token_matches(given: str, tokens: list[str]) -> bool:
    """Constant time in the token's content: every configured token is compared, always."""
    return _matches(given.encode(), [t.encode() for t in tokens])


def bearer_guard(tokens: list[str]) -> Guard | None:
    """The guard for `tokens`, or None when there are none (loopback only): no guard to run.

    An `async def`, so Litestar calls it on the event loop: a sync guard would be sent to the
    thread pool on every request, which costs far more than the comparison it makes."""
    if not tokens:
        return None
    expected = tuple(t.encode() for t in tokens)

    async def guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        scheme, _, given = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not _matches(given.strip().encode(), expected):
            raise NotAuthorizedException(
                "a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="h3core"'},
            )

    return guard
