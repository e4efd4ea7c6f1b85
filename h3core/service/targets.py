"""Absolute-form request targets: the target's authority is the request's host (RFC 9112 §3.2.2).

A request may name its target in full, `GET http://evil.example/v1/jobs HTTP/1.1`, as requests
to a proxy do; a server must then take the host from the target and ignore `Host`. uvicorn's
httptools protocol kept only the target's path (so the allowed-hosts check judged `Host: 127.0.0.1`
and answered a request for evil.example), and its h11 protocol kept the whole URL as the path. Here
both make such a request an origin-form one whose `Host` is the target's authority, before the
application (and its Host check, service/crosssite.py) sees it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

__all__ = ["absolute_form", "with_authority"]


def absolute_form(target: bytes) -> tuple[bytes, bytes] | None:
    """The authority and the origin-form target (path and query) of an absolute-form `target`
    (`scheme://authority[/path][?query]`); None for any other form (`/path`, `*`). Pure."""
    if target.startswith(b"/") or b"://" not in target:
        return None
    parts = urlsplit(target.decode("latin-1"))
    origin = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.netloc.encode("latin-1"), origin.encode("latin-1")


def _hosted(headers: Iterable[tuple[bytes, bytes]], authority: bytes) -> list[tuple[bytes, bytes]]:
    """`headers` with every `Host` replaced by one: the target's authority."""
    return [(k, v) for k, v in headers if k.lower() != b"host"] + [(b"host", authority)]


def with_authority(protocol: type[Any]) -> type[Any]:
    """`protocol` (one of uvicorn's HTTP protocols, httptools or h11, subclassed or not) turning an
    absolute-form request into an origin-form one whose `Host` is the target's authority."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    if issubclass(protocol, HttpToolsProtocol):

        class HttpTools(protocol):
            url: bytes  # the target as received (uvicorn's parser callbacks gather it)

            def on_headers_complete(self) -> None:
                moved = absolute_form(self.url)
                if moved is not None:
                    authority, self.url = moved
                    # The scope holds this list: replaced in place, the scope sees the change.
                    self.headers[:] = _hosted(self.headers, authority)
                super().on_headers_complete()

        return HttpTools

    import h11

    class H11(protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            next_event = self.conn.next_event

            def origin_form() -> Any:
                event = next_event()
                if isinstance(event, h11.Request) and (moved := absolute_form(event.target)) is not None:
                    authority, target = moved
                    headers = _hosted(event.headers, authority)
                    event = h11.Request(method=event.method, target=target, headers=headers, http_version=event.http_version)
                return event

            # uvicorn reads each request from its connection's next event: the request it reads is origin-form.
            self.conn.next_event = origin_form

    return H11
