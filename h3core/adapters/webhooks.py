"""Sending webhooks: a target checked after DNS resolution, and one signed POST (Standard Webhooks).

`target_refusal` resolves the URL's host and refuses it if any address it resolves to is one a
delivery may not reach (`h3core.domain.webhooks.address_refusal`): a name that resolves to a
private address is refused like the address itself. The check runs at submission (a 422 there)
and again before every send, so a name re-pointed since is refused then too.

`WebhookSender.send` POSTs one signed body: `webhook-id`, `webhook-timestamp` (now: receivers
refuse old timestamps, and a retry is sent later than the first try) and `webhook-signature`,
signed with the `standardwebhooks` package; connect and read timeouts; no redirect followed (a
3xx is a failure, as is every answer but 2xx). Needs the `service` extra (httpx, standardwebhooks).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import urlsplit

import anyio
import httpx
from standardwebhooks import Webhook

from h3core.domain.webhooks import Allow, address_refusal, url_refusal

__all__ = ["DeliveryFailed", "WebhookSender", "check_secret", "target_refusal"]

ALLOW_NOTE = "H3_WEBHOOKS_ALLOW lists the hosts and ranges allowed anyway"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 15.0


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


async def target_refusal(url: str, allow: Allow) -> str | None:
    """Why a delivery may not go to `url`; None if it may."""
    why = url_refusal(url)
    if why is not None:
        return why
    parts = urlsplit(url)
    host = parts.hostname or ""
    if allow.host(host):
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # an address already: judged as it is, with no lookup (no thread, no resolver)
        why = address_refusal(host, allow)
        return None if why is None else f"{host} is {why}; {ALLOW_NOTE}"
    try:
        infos = await anyio.getaddrinfo(host, parts.port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot encode ("a..b")
        return f"{host} does not resolve: {exc}"
    for info in infos:
        address = str(info[4][0])
        why = address_refusal(address, allow)
        if why is not None:
            return f"{host} resolves to {address}, {why}; {ALLOW_NOTE}"
    return None


class WebhookSender:
    """Signs and POSTs webhook bodies, over one connection pool."""

    def __init__(self, secrets: str | Sequence[str], allow: Allow, *, client: httpx.AsyncClient | None = None) -> None:
        """`secrets`: one, or several while one is rotated out (each delivery is signed with every
        one, so a receiver that knows either verifies it)."""
        secrets = [secrets] if isinstance(secrets, str) else list(secrets)
        if not secrets:
            raise ValueError("a webhook sender needs a secret")
        for secret in secrets:
            check_secret(secret)
        self._signers = [Webhook(secret) for secret in secrets]
        self.allow = allow
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), follow_redirects=False
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def headers(self, msg_id: str, body: str, at: datetime) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": " ".join(signer.sign(msg_id, at, body) for signer in self._signers),
        }

    async def send(self, url: str, msg_id: str, body: str) -> None:
        """One try; `DeliveryFailed` unless the receiver answered 2xx."""
        why = await target_refusal(url, self.allow)
        if why is not None:
            raise DeliveryFailed(f"refused target: {why}", retryable=False)
        try:
            answer = await self._client.post(url, content=body.encode(), headers=self.headers(msg_id, body, datetime.now(UTC)))
        except httpx.HTTPError as exc:
            raise DeliveryFailed(f"{type(exc).__name__}: {exc}", retryable=True) from exc
        if not answer.is_success:
            raise DeliveryFailed(f"the receiver answered {answer.status_code}", retryable=True)
