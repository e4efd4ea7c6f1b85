"""Sending webhooks: a target checked after DNS resolution, and one signed POST (Standard Webhooks)
through a transport (`h3core.adapters.webhooks.base`).

`target_refusal` resolves the URL's host and refuses it if any address it resolves to is one a
delivery may not reach (`h3core.domain.webhooks.address_refusal`): a name that resolves to a
private address is refused like the address itself. The check runs at submission (a 422 there)
and again before every send, so a name re-pointed since is refused then too; and a send connects
to the address it checked (the name only in `host` and TLS's SNI): the sender hands the transport
that address, and a transport never looks a name up (its contract), so a name that answers a
public address to the check and a private one a moment later (DNS rebinding) cannot reach the
private one. Answers are kept 30 s per host (`RESOLVE_TTL_S`).

`WebhookSender.send` POSTs one signed body: `webhook-id`, `webhook-timestamp` (now: receivers
refuse old timestamps, and a retry is sent later than the first try) and `webhook-signature`,
signed with the `standardwebhooks` package; through `HttpPostClient` by default, with connect and
read timeouts; no redirect followed (a 3xx is a failure, as is every answer but 2xx). Needs the
`service` extra (h11, standardwebhooks).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import anyio
from standardwebhooks import Webhook

from h3core.adapters.webhooks.base import PostFailed, WebhookTransport
from h3core.adapters.webhooks.http_post import HttpPostClient
from h3core.domain.webhooks import Allow, address_refusal, url_refusal

__all__ = [
    "DeliveryFailed",
    "Resolve",
    "Vetted",
    "WebhookSender",
    "check_secret",
    "system_resolve",
    "target_refusal",
    "vet",
]

ALLOW_NOTE = "H3_WEBHOOKS_ALLOW lists the hosts and ranges allowed anyway"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 15.0
RESOLVE_TTL_S = 30.0
MAX_RESOLVED = 10_000  # host names whose answers are kept; past it, the expired are dropped


class DeliveryFailed(Exception):
    """A send that did not end in a 2xx; `retryable`: worth trying again later."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def check_secret(secret: str) -> None:
    """Raise ValueError unless `secret` is a Standard Webhooks secret (`whsec_` + base64)."""
    if not secret.startswith("whsec_"):
        raise ValueError("a webhook secret starts with 'whsec_' (then base64 of 24 to 64 random bytes)")
    try:
        Webhook(secret)
    except Exception as exc:  # the package raises binascii's errors for bad base64
        raise ValueError(f"the webhook secret's base64 does not decode: {exc}") from None


Resolve = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> the addresses it resolves to


async def system_resolve(host: str, port: int) -> list[str]:
    """The system resolver's addresses for `host` (getaddrinfo, in a thread)."""
    return [str(info[4][0]) for info in await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


@dataclass(frozen=True)
class Vetted:
    """What a check of a target found: why not (`refusal`), or where to connect: `address`, the
    address that was checked (None: the URL's host as it is, an address or a host allowed by name)."""

    refusal: str | None = None
    address: str | None = None


async def vet(url: str, allow: Allow, resolve: Resolve = system_resolve) -> Vetted:
    """Check `url`'s target once: refused, or the checked address a send must connect to."""
    why = url_refusal(url)
    if why is not None:
        return Vetted(refusal=why)
    parts = urlsplit(url)
    host = parts.hostname or ""
    if allow.host(host):
        return Vetted()
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # an address already: judged as it is, with no lookup (no thread, no resolver)
        why = address_refusal(host, allow)
        return Vetted(refusal=None if why is None else f"{host} is {why}; {ALLOW_NOTE}")
    try:
        addresses = await resolve(host, parts.port or (443 if parts.scheme == "https" else 80))
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot encode ("a..b")
        return Vetted(refusal=f"{host} does not resolve: {exc}")
    if not addresses:
        return Vetted(refusal=f"{host} resolves to no address")
    for address in addresses:
        why = address_refusal(address, allow)
        if why is not None:
            return Vetted(refusal=f"{host} resolves to {address}, {why}; {ALLOW_NOTE}")
    return Vetted(address=addresses[0])


async def target_refusal(url: str, allow: Allow, resolve: Resolve = system_resolve) -> str | None:
    """Why a delivery may not go to `url`; None if it may."""
    return (await vet(url, allow, resolve)).refusal


class WebhookSender:
    """Checks targets, signs webhook bodies and POSTs them through a transport (`HttpPostClient`,
    over kept-alive connections, by default)."""

    def __init__(
        self,
        secrets: str | Sequence[str],
        allow: Allow,
        *,
        resolve: Resolve = system_resolve,
        resolve_ttl_s: float = RESOLVE_TTL_S,
        ssl_context: ssl.SSLContext | None = None,
        transport: WebhookTransport | None = None,
    ) -> None:
        """`secrets`: one, or several while one is rotated out (each delivery is signed with every
        one, so a receiver that knows either verifies it); none: only endpoints with their own.
        `resolve`: the resolver (tests stub it); its answers are kept `resolve_ttl_s`, per host and
        port. `transport`: what POSTs (an `HttpPostClient` by default); `ssl_context`: the CAs the
        default one checks https targets against (the system's), none with a transport given."""
        if transport is not None and ssl_context is not None:
            raise ValueError("ssl_context is the default transport's: give it to the transport instead")
        self._default = self._signers_of(secrets)
        self.allow = allow
        self._resolve = resolve
        self.resolve_ttl_s = resolve_ttl_s
        self._resolved: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._by_secrets: dict[tuple[str, ...], list[Webhook]] = {}  # endpoints' own secrets, signers made once
        self.transport = transport or HttpPostClient(
            connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=READ_TIMEOUT_S, ssl_context=ssl_context
        )

    @staticmethod
    def _signers_of(secrets: str | Sequence[str]) -> list[Webhook]:
        secrets = [secrets] if isinstance(secrets, str) else list(secrets)
        for secret in secrets:
            check_secret(secret)
        return [Webhook(secret) for secret in secrets]

    async def aclose(self) -> None:
        """Close the transport's kept-alive connections."""
        await self.transport.aclose()

    def headers(self, msg_id: str, body: str, at: datetime, signers: Sequence[Webhook] | None = None) -> dict[str, str]:
        """The Standard Webhooks headers of one delivery of `body`: its id, `at` as its timestamp,
        and a signature by each of `signers` (None: the sender's own secrets)."""
        return {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": " ".join(
                signer.sign(msg_id, at, body) for signer in (self._default if signers is None else signers)
            ),
        }

    async def _lookup(self, host: str, port: int) -> list[str]:
        """The resolver's answer, reused for `resolve_ttl_s`: what is checked is still what is
        connected to (the send connects to the checked address), so reuse weakens no check."""
        now = anyio.current_time()
        hit = self._resolved.get((host, port))
        if hit is not None and hit[0] > now:
            return hit[1]
        addresses = await self._resolve(host, port)
        if len(self._resolved) > MAX_RESOLVED:
            self._resolved = {k: v for k, v in self._resolved.items() if v[0] > now}
        self._resolved[(host, port)] = (now + self.resolve_ttl_s, addresses)
        return addresses

    async def send(self, url: str, msg_id: str, body: str, *, secrets: Sequence[str] | None = None) -> None:
        """One try; `DeliveryFailed` unless the receiver answered 2xx. The target is checked, and
        the request goes to the very address checked (never a second lookup: a name re-pointed
        between the check and the connection, DNS rebinding, reaches nothing it was not checked
        for); the name is the `host` header and, for https, the name the certificate must bear.
        `secrets`: the endpoint's own, instead of the sender's."""
        vetted = await vet(url, self.allow, self._lookup)
        if vetted.refusal is not None:
            raise DeliveryFailed(f"refused target: {vetted.refusal}", retryable=False)
        signers = self._signers(secrets) if secrets else self._default
        if not signers:  # never sent unsigned
            raise DeliveryFailed("no secret to sign with: H3_WEBHOOK_SECRET is not set", retryable=False)
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            address = vetted.address or _literal(host) or (await self._lookup(host, port))[0]  # the last: allowed by name
            headers = self.headers(msg_id, body, datetime.now(UTC), signers)
            status = await self.transport.post(url, list(headers.items()), body.encode(), address=address)
        except (PostFailed, OSError, IndexError) as exc:  # OSError, IndexError: an allowed name that does not resolve
            raise DeliveryFailed(str(exc) or type(exc).__name__, retryable=True) from exc
        if not 200 <= status < 300:
            raise DeliveryFailed(f"the receiver answered {status}", retryable=True)

    def _signers(self, secrets: Sequence[str]) -> list[Webhook]:
        key = tuple(secrets)
        if key not in self._by_secrets:
            self._by_secrets[key] = self._signers_of(secrets)
        return self._by_secrets[key]


def _literal(host: str) -> str | None:
    """`host` if it is an address already."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return host
