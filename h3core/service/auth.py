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

from h3core.runtime.settings import token_secret

__all__ = [
    "SESSION_COOKIE",
    "SESSION_SECONDS",
    "bearer_guard",
    "bearer_matches",
    "session_matches",
    "session_value",
    "requester",
    "token_matches",
    "token_name",
    "who",
]


def _secrets(tokens: Sequence[str]) -> list[bytes]:
    return [token_secret(t)[1].encode() for t in tokens]


def token_name(tokens: Sequence[str], index: int) -> str:
    """The name the `index`th entry of `tokens` goes by in a job's log."""
    return token_secret(tokens[index])[0] or f"token-{index + 1}"


def _index(given: bytes, tokens: Sequence[bytes]) -> int:
    """Which of `tokens` is `given` (-1: none), in constant time in the tokens' content: every
    configured token is compared, always."""
    found = -1
    for i, token in enumerate(tokens):
        if hmac.compare_digest(given, token):
            found = i
    return found


def _matches(given: bytes, tokens: Sequence[bytes]) -> bool:
    return _index(given, tokens) >= 0


SESSION_COOKIE = "h3_session"
SESSION_SECONDS = 12 * 3600  # a working day: sign in again after it


def _session_mac(token: bytes, expires: int) -> str:
    return hmac.new(token, f"h3core-console-session:{expires}".encode(), hashlib.sha256).hexdigest()


def session_value(token: str, now: float | None = None) -> str:
    """A session cookie's value for someone who gave `token`: `<expires>.<mac>`."""
    expires = int(now if now is not None else time.time()) + SESSION_SECONDS
    return f"{expires}.{_session_mac(token.encode(), expires)}"


def _session_index(cookie: str, tokens: Sequence[bytes], now: float) -> int:
    """Which of `tokens` made the session cookie (-1: none, or it has expired)."""
    expires, _, mac = cookie.partition(".")
    if not expires.isdigit() or len(expires) > 12 or int(expires) <= now:
        return -1
    found = -1
    for i, token in enumerate(tokens):  # every token, always: constant time in which one matched
        if hmac.compare_digest(mac.encode(), _session_mac(token, int(expires)).encode()):
            found = i
    return found


def _session(cookie: str, tokens: Sequence[bytes], now: float) -> bool:
    return _session_index(cookie, tokens, now) >= 0


def session_matches(cookie: str | None, tokens: list[str], now: float | None = None) -> bool:
    """Whether a session cookie's value was made from one of `tokens` and has not expired."""
    return bool(cookie) and _session(cookie or "", _secrets(tokens), now if now is not None else time.time())


def token_matches(token: str, tokens: list[str]) -> bool:
    """Whether `token` (typed into the sign-in page) is one of `tokens`."""
    return _matches(token.strip().encode(), _secrets(tokens))


def _bearer_index(authorization: str, tokens: Sequence[bytes]) -> int:
    scheme, _, given = authorization.partition(" ")
    return _index(given.strip().encode(), tokens) if scheme.lower() == "bearer" else -1


def _bearer(authorization: str, tokens: Sequence[bytes]) -> bool:
    return _bearer_index(authorization, tokens) >= 0


def requester(connection: ASGIConnection, tokens: list[str]) -> str | None:
    """The name of the token `connection` came with (`who`)."""
    return who(connection.headers.get("authorization"), connection.cookies.get(SESSION_COOKIE), tokens)


def who(authorization: str | None, cookie: str | None, tokens: list[str]) -> str | None:
    """The name of the token a request came with (its bearer token, else its session cookie's); None
    without tokens (a loopback service takes anyone) or when neither matches."""
    if not tokens:
        return None
    secrets = _secrets(tokens)
    index = _bearer_index(authorization or "", secrets)
    if index < 0 and cookie:
        index = _session_index(cookie, secrets, time.time())
    return token_name(tokens, index) if index >= 0 else None


def bearer_matches(authorization: str | None, tokens: list[str]) -> bool:
    """Whether an Authorization header carries one of `tokens` as a bearer token."""
    return _bearer(authorization or "", _secrets(tokens))


def bearer_guard(tokens: list[str]) -> Guard | None:
    """The guard for `tokens` (a bearer token, or the console's session cookie), or None when there
    are none (loopback only): no guard to run.

    An `async def`, so Litestar calls it on the event loop: a sync guard would be sent to the
    thread pool on every request, which costs far more than the comparison it makes."""
    if not tokens:
        return None
    expected = tuple(_secrets(tokens))

    async def guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        if not _bearer(connection.headers.get("authorization", ""), expected) and not _session(
            connection.cookies.get(SESSION_COOKIE, ""), expected, time.time()
        ):
            raise NotAuthorizedException(
                "a valid bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="h3core"'},
            )

    return guard
