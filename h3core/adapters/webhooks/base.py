"""The webhook-transport contract: the one-request seam under `WebhookSender`, as a transport is
under an httpx client. It POSTs one body to one address and says what status came back.

What to send, and where, is decided above it: the sender checks the target (`vet`: the URL, then
every address its host resolves to), signs the body, and hands the transport the very address it
checked. Every implementation keeps these promises (`h3core.testing.webhooks.WebhookTransportContract`
checks them; run it against yours):

- **The checked address, never a lookup.** `post(url, headers, body, address=...)` connects to
  `address`, an IP address, and never resolves the URL's host: the name is only the `host` header
  and, for https, the name the server's certificate must bear (SNI). An `address` that is no IP
  address is refused (`ValueError`) before anything is sent, so no transport looks a name up
  behind the sender's check (DNS rebinding).
- **One request, as given.** One POST of `body` to the URL's path and query, with `headers` in
  their order, after `host` (the URL's host and port, as the URL writes them) and before
  `content-length`: the transport writes those two itself, and `headers` naming either is refused
  (`ValueError`), so the host a receiver reads is always the URL's. The URL is http or https
  (anything else is a `ValueError`). A transport that keeps connections may send the request once
  more on a fresh one where a kept one failed before any answer (webhooks are at least once: a
  receiver tells a repeat by its `webhook-id`).
- **The status, whatever it is.** The answer's status is returned: a 3xx is a status (no redirect
  is followed), as are a 4xx and a 5xx; judging it is the sender's.
- **No answer is `PostFailed`.** Where no answer came (nothing listening, a certificate refused, a
  timeout, a connection closed before an answer, a broken answer) `post` raises `PostFailed`, and
  nothing else for those; a cancellation stays a cancellation.
- **Closing.** `aclose` releases what the transport keeps (connections); a later `post` still
  works, afresh.

`outgoing` is what every transport does first: the checks above, and the request as it goes out.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

__all__ = ["Outgoing", "PostFailed", "WebhookTransport", "outgoing"]

# Headers a transport writes itself, from the URL and the body.
OWN_HEADERS = frozenset({"host", "content-length"})


class PostFailed(Exception):
    """No answer: the connection, TLS, a timeout, or the protocol failed."""


@dataclass(frozen=True)
class Outgoing:
    """One POST as a transport puts it on the wire: the URL it was for, the `address` connected
    to, the `host` name (the certificate's, for https), `scheme` and `port`, the `target` (path
    and query) and every header in order, `host` first and `content-length` last."""

    url: str
    scheme: str
    host: str
    address: str
    port: int
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


def outgoing(url: str, headers: Sequence[tuple[str, str]], body: bytes, address: str) -> Outgoing:
    """The request `post(url, headers, body, address=address)` sends, checked as the contract says;
    `ValueError` for an address that is no IP address, a URL that is not http(s) or names no
    host, or headers that name `host` or `content-length`."""
    try:
        ipaddress.ip_address(address.split("%", 1)[0])  # a scope id (fe80::1%eth0) is no part of it
    except ValueError:
        raise ValueError(f"{address!r} is no IP address: a transport connects to the address checked, never to a name") from None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http or https URL with a host: {url!r}")
    own = sorted({name.lower() for name, _ in headers} & OWN_HEADERS)
    if own:
        raise ValueError(f"headers may not name {', '.join(own)}: the transport writes them from the URL and the body")
    return Outgoing(
        url=url,
        scheme=parts.scheme,
        host=parts.hostname,
        address=address,
        port=parts.port or (443 if parts.scheme == "https" else 80),
        target=(parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
        headers=(("host", parts.netloc), *headers, ("content-length", str(len(body)))),
        body=body,
    )


@runtime_checkable
class WebhookTransport(Protocol):
    """Sends one webhook POST to a checked address (the contract above)."""

    async def post(self, url: str, headers: Sequence[tuple[str, str]], body: bytes, *, address: str) -> int:
        """POST `body` to `url` at `address` (an IP address, never looked up) with `headers` (neither
        `host` nor `content-length`: the transport writes both); the answer's status, whatever it
        is. `PostFailed` where no answer came; `ValueError` for what the contract refuses."""
        ...

    async def aclose(self) -> None:
        """Release what the transport keeps (connections); a later `post` still works."""
        ...
