"""Bearer tokens for every /v1 route (field notes §2.7)."""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler


def token_matches(given: str, tokens: list[str]) -> bool:
    """Constant time in the token's content: every configured token is compared, always."""
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given.encode(), token.encode())
    return ok


def bearer_guard(tokens: list[str]):
    def guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        if not tokens:
            return
        scheme, _, given = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token_matches(given.strip(), tokens):
            raise NotAuthorizedException(
                "a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="h3core"'},
            )

    return guard
