"""What a web page open in a browser could make this service do, refused.

Without tokens the service trusts whoever reaches its port, and a browser on the same machine
reaches it for any page it shows. Three rules, checked before any handler runs:

- **Host.** DNS rebinding points a name the attacker owns at 127.0.0.1, so that page reads the
  API as its own origin; its requests then carry that name in `Host`. Without tokens only loopback
  names, the address the service listens on and `H3_ALLOWED_HOSTS` are answered (with tokens,
  `H3_ALLOWED_HOSTS` when it is set). Anything else: 400.
- **Origin.** A page may send a cross-origin request with no preflight (a form post, `fetch` with
  a text body); the browser says whose page it is in `Origin`. A request whose `Origin` is neither
  this service's own nor in `H3_CORS_ORIGINS` is refused: 403, and so is a state-changing one
  with no `Origin` that a browser marks `Sec-Fetch-Site: cross-site`. The listed origins get Litestar's
  CORS answers (preflight and headers).
- **Content type.** A state-changing request carries JSON (`application/json`) or nothing; the
  upload route checks its own (the file types it lists). Anything else, a form or `text/plain`
  among them, is refused before its body is read: 415. A request with no body (`Content-Length:
  0`, no `Transfer-Encoding`) has nothing to judge, whatever type it names.

A header these rules read given twice (`Host`, `Origin`, `Content-Type`) is refused with 400
naming it: which copy counts would otherwise be this guard's guess, and another reader's other one.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from litestar.config.cors import CORSConfig
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Receive, Scope, Send

from h3core.runtime.settings import Settings, is_loopback

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# A route handler's `opt` key: it takes bodies other than JSON and checks their type itself (uploads).
OWN_CONTENT_TYPES_OPT = "own_content_types"
# Request headers a browser app on an allowed origin may send, and response headers it may read.
CORS_REQUEST_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "Range", "If-Range"]
CORS_EXPOSED_HEADERS = ["Location", "Content-Range", "Accept-Ranges", "ETag", "Content-Length", "Retry-After"]


def hostname(host: str) -> str:
    """The name in a Host header or URL netloc, without the port; IPv6 without brackets; lowercase."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") > 1:
        return host  # a bare IPv6 address (a setting; a Host header has brackets)
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() else host


@dataclass(frozen=True)
class CrossSitePolicy:
    """`hosts`: names answered besides loopback ones (None: any Host); `origins`: other origins allowed."""

    hosts: frozenset[str] | None
    origins: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Settings, *, listen_host: str) -> CrossSitePolicy:
        """The policy `settings` give a listener on `listen_host`: any Host with `*` among the allowed
        hosts, or with tokens and no allowed hosts; else the allowed hosts and the address it listens on
        (a wildcard address adds none), loopback names besides."""
        names = {hostname(h) for h in settings.allowed_hosts}
        origins = tuple(settings.cors_origins)
        if "*" in names or (settings.api_tokens and not names):
            return cls(None, origins)
        if listen_host not in ("0.0.0.0", "::", ""):
            names.add(hostname(listen_host))
        return cls(frozenset(names), origins)

    def cors(self) -> CORSConfig | None:
        """Litestar's CORS handling for the allowed origins (none: no CORS headers at all)."""
        if not self.origins:
            return None
        return CORSConfig(
            allow_origins=list(self.origins),
            allow_headers=CORS_REQUEST_HEADERS,
            expose_headers=CORS_EXPOSED_HEADERS,
            allow_credentials=False,
        )

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request's Host (None: it gave none) is a name this service answers to."""
        if self.hosts is None:
            return True
        return host is not None and _answered(host, self.hosts)

    def origin_allowed(self, origin: str, *, scheme: str, host: str | None) -> bool:
        """Whether a page on `origin` may call the service: an origin listed in `H3_CORS_ORIGINS`, or
        the service's own (the request's scheme and Host, with no path)."""
        if origin in self.origins:
            return True
        parts = urlsplit(origin)
        return host is not None and parts.scheme == scheme and parts.netloc.lower() == host.strip().lower() and not parts.path


@functools.lru_cache(maxsize=256)
def well_formed(host: str) -> bool:
    """Whether a Host header is a host with an optional port from 0 to 65535 (`name`, `name:8100`,
    `[::1]:8100`): anything else breaks every reader of the request's URL."""
    host = host.strip()
    try:
        parts = urlsplit(f"//{host}")
        port = parts.port
    except ValueError:  # a port that is not a number, or out of range; brackets that do not close
        return False
    colon = ":" in host.rpartition("]")[2]  # a port separator, after an IPv6 address's brackets
    return not host or (bool(parts.hostname) and (port is not None or not colon))


@functools.lru_cache(maxsize=256)  # a handful of Host values recur; parsing an address costs ~20 us
def _answered(host: str, names: frozenset[str]) -> bool:
    name = hostname(host)
    return name in names or is_loopback(name)


def _refuse(status: int, header: str, detail: str) -> ASGIResponse:
    """The service's problem body (`detail`, and `errors` naming the header at fault)."""
    body = json.dumps({"detail": detail, "errors": [{"field": header, "message": detail}]}).encode()
    return ASGIResponse(body=body, status_code=status, media_type="application/json")


_WANTED = frozenset({b"host", b"origin", b"content-type", b"content-length", b"transfer-encoding", b"sec-fetch-site"})
# Headers whose single value the rules act on: a second copy is refused, never chosen between.
_SINGLE = {"host": "Host", "origin": "Origin", "content-type": "Content-Type"}


def _headers(scope: Scope) -> tuple[dict[str, str], str | None]:
    """The headers the rules read (ASGI gives names in lower case), and the first of `_SINGLE`
    given more than once, as the client spells it."""
    out: dict[str, str] = {}
    for k, v in scope["headers"]:
        if k not in _WANTED:
            continue
        name = k.decode("latin-1")
        if name in out and name in _SINGLE:
            return out, _SINGLE[name]
        out[name] = v.decode("latin-1")
    return out, None


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


class CrossSiteGuard(ASGIMiddleware):
    """The middleware that applies a `CrossSitePolicy` to every HTTP request before any handler runs,
    answering a refused request itself (400, 403 or 415)."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, policy: CrossSitePolicy) -> None:
        self.policy = policy

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        """Answer with the refusal `judge` gives, or pass the request on to `next_app`."""
        refusal = self.judge(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
        else:
            await next_app(scope, receive, send)

    def judge(self, scope: Scope) -> ASGIResponse | None:
        """The answer refusing the request (a header given twice, a Host or Origin not allowed, a
        state-changing body that is not JSON), or None to let it through."""
        headers, repeated = _headers(scope)
        if repeated is not None:
            return _refuse(400, repeated, f"{repeated} is given more than once; send it once")
        host = headers.get("host")
        if host is not None and not well_formed(host):
            return _refuse(400, "Host", f"Host {host!r} is not a host with an optional port (0 to 65535)")
        if not self.policy.host_allowed(host):
            return _refuse(
                400,
                "Host",
                f"Host {host!r} is not a name this service answers to: loopback names, the address it listens on "
                "and H3_ALLOWED_HOSTS (a page on another site that renamed itself to this address is refused)",
            )
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_allowed(origin, scheme=scope.get("scheme", "http"), host=host):
            return _refuse(403, "Origin", f"requests from pages on {origin} are refused; allow an origin with H3_CORS_ORIGINS")
        assert scope["type"] == ScopeType.HTTP  # `scopes`: the guard sees HTTP requests only
        if scope["method"] in UNSAFE_METHODS:
            # A browser that names no Origin still says the request comes from another site.
            if origin is None and headers.get("sec-fetch-site", "").strip().lower() == "cross-site":
                return _refuse(403, "Sec-Fetch-Site", "a request a page on another site sent is refused")
            return self._content_type(scope, headers)
        return None

    def _content_type(self, scope: Scope, headers: dict[str, str]) -> ASGIResponse | None:
        handler = scope.get("route_handler")
        if handler is not None and handler.opt.get(OWN_CONTENT_TYPES_OPT):
            return None
        given = headers.get("content-type")
        # No body (a cancel): nothing to read, so whatever type it names says nothing. A request
        # naming a type counts as bodiless only with an explicit `Content-Length: 0`.
        length = headers.get("content-length", "0" if given is None else "")
        if length.strip() == "0" and "transfer-encoding" not in headers:
            return None
        if given is None:
            return _refuse(415, "Content-Type", "a request body must be JSON: Content-Type: application/json")
        if _media_type(given) != "application/json":
            return _refuse(415, "Content-Type", f"Content-Type {given!r} is not accepted: send JSON (application/json)")
        return None
