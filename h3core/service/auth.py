"""Bearer tokens for every /v1 route (docs/design.md §2.7), or the console's session cookie.

The cookie never holds a token: it holds an expiry and an HMAC of it keyed by one of the tokens,
so it is checked against the tokens as they are now (one removed from H3_API_TOKENS ends its
sessions) and a stolen cookie is good only until it expires. It is HttpOnly and SameSite=Strict,
and the cross-site rules (service/crosssite.py) hold for every request it rides on."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

__all__ = [
    "SESSION_COOKIE",
    "SESSION_SECONDS",
    "bearer_guard",
    "bearer_matches",
    "session_matches",
    "session_value",
    "token_matches",
]


def _matches(given: bytes, tokens: Sequence[bytes]) -> bool:
    """Constant time in the token's content: every configured token is compared, always."""
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given, token)
    return ok


SESSION_COOKIE = "h3_session"
SESSION_SECONDS = 12 * 3600  # a working day: sign in again after it


def _session_mac(token: bytes, expires: int) -> str:
    return hmac.new(token, f"h3core-console-session:{expires}".encode(), hashlib.sha256).hexdigest()


def session_value(token: str, now: float | None = None) -> str:
    """A session cookie's value for someone who gave `token`: `<expires>.<mac>`."""
    expires = int(now if now is not None else time.time()) + SESSION_SECONDS
    return f"{expires}.{_session_mac(token.encode(), expires)}"


def _session(cookie: str, tokens: Sequence[bytes], now: float) -> bool:
    expires, _, mac = cookie.partition(".")
    if not expires.isdigit() or len(expires) > 12 or int(expires) <= now:
        return False
    ok = False
    for token in tokens:  # every token, always: constant time in which one matched
        ok |= hmac.compare_digest(mac.encode(), _session_mac(token, int(expires)).encode())
    return ok


def session_matches(cookie: str | None, tokens: list[str], now: float | None = None) -> bool:
    """Whether a session cookie's value was made from one of `tokens` and has not expired."""
    return bool(cookie) and _session(cookie or "", [t.encode() for t in tokens], now if now is not None else time.time())


def token_matches(token: str, tokens: list[str]) -> bool:
    """Whether `token` (typed into the sign-in page) is one of `tokens`."""
    return _matches(token.strip().encode(), [t.encode() for t in tokens])


def _bearer(authorization: str, tokens: Sequence[bytes]) -> bool:
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and _matches(given.strip().encode(), tokens)


def bearer_matches(authorization: str | None, tokens: list[str]) -> bool:
    """Whether an Authorization header carries one of `tokens` as a bearer token."""
    return _bearer(authorization or "", [t.encode() for t in tokens])


def bearer_guard(tokens: list[str]) -> Guard | None:
    """The guard for `tokens` (a bearer token, or the console's session cookie), or None when there
    are none (loopback only): no guard to run.

    An `async def`, so Litestar calls it on the event loop: a sync guard would be sent to the
    thread pool on every request, which costs far more than the comparison it makes."""
    if not tokens:
        return None
    expected = tuple(t.encode() for t in tokens)

    async def guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        if not _bearer(connection.headers.get("authorization", ""), expected) and not _session(
            connection.cookies.get(SESSION_COOKIE, ""), expected, time.time()
        ):
            raise NotAuthorizedException(
                "a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="h3core"'},
            )

    return guard
