"""Webhooks, as data: where a job's events go (`WebhookTarget`, stored in its `submitted` event),
which of them go (Replicate's filter names), what each delivery says and its stable id, and which
addresses a delivery may reach. Sending is I/O and lives in `h3core.adapters.webhooks`.

The filter, as Replicate names it: `start` (an attempt began running), `progress`, `completed`
(done, failed or cancelled). Without one a job gets all but `progress`.

Addresses: a delivery goes to a globally routable address only. Loopback, private, link-local
(where cloud metadata answers: 169.254.169.254), shared, reserved and multicast ones are refused,
unless the operator allows a host name or a range (`H3_WEBHOOKS_ALLOW`); an IPv4 address written as
IPv6 is judged as the IPv4 one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from h3core.domain.events import Event

__all__ = [
    "DEFAULT_EVENTS",
    "MAX_URL_CHARS",
    "Allow",
    "WebhookEvent",
    "WebhookTarget",
    "address_refusal",
    "event_kind",
    "payload",
    "url_refusal",
    "webhook_id",
]

WebhookEvent = Literal["start", "progress", "completed"]
DEFAULT_EVENTS: tuple[WebhookEvent, ...] = ("start", "completed")
MAX_URL_CHARS = 2048

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebhookTarget(BaseModel):
    """Where a job's events are sent, and which kinds of them."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    url: str = Field(min_length=1, max_length=MAX_URL_CHARS)
    events: tuple[WebhookEvent, ...] = DEFAULT_EVENTS

    def wants(self, event: Event) -> bool:
        kind = event_kind(event)
        return kind is not None and kind in self.events


def event_kind(event: Event) -> WebhookEvent | None:
    """The filter name an event is sent under; None for events no webhook is sent for."""
    if event.terminal:
        return "completed"
    if event.type == "running":
        return "start"
    if event.type == "progress":
        return "progress"
    return None


def webhook_id(event: Event) -> str:
    """The same for every delivery of one event, in this process or the next: receivers drop repeats by it."""
    return f"msg_{event.job_id}_{event.seq}"


def payload(event: Event) -> dict[str, Any]:
    """What a `/v1/jobs` webhook carries, in Standard Webhooks' envelope (type, timestamp, data)."""
    return {
        "type": f"job.{event.type}",
        "timestamp": event.at.isoformat(),
        "data": {"job_id": event.job_id, "seq": event.seq, "event": event.body.model_dump(mode="json")},
    }


def url_refusal(url: str) -> str | None:
    """Why `url` cannot be a webhook target, before any name is resolved; None if it can."""
    if len(url) > MAX_URL_CHARS:
        return f"the URL is longer than {MAX_URL_CHARS} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is no number or out of range
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"the scheme must be http or https, not {parts.scheme or 'none'!r}"
    if not parts.hostname:
        return "the URL names no host"
    if parts.username is not None or parts.password is not None:
        return "the URL must not carry credentials"
    return None


class Allow:
    """What `H3_WEBHOOKS_ALLOW` lets through anyway: host names (exact) and address ranges (CIDR)."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.hosts: set[str] = set()
        self.networks: list[IpNetwork] = []
        for entry in entries:
            try:
                self.networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                self.hosts.add(entry.strip().lower().rstrip("."))

    def host(self, name: str) -> bool:
        return name.lower().rstrip(".") in self.hosts

    def address(self, ip: IpAddress) -> bool:
        return any(ip in net for net in self.networks if net.version == ip.version)


def address_refusal(address: str, allow: Allow) -> str | None:
    """What `address` (an IP, as resolved) is, if a delivery may not go there ("a loopback
    address"); None if it may."""
    ip: IpAddress = ipaddress.ip_address(address.split("%", 1)[0])  # a scope id (fe80::1%eth0) is no part of it
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if allow.address(ip):
        return None
    for refused, why in (
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local (cloud metadata services answer there)"),
        (ip.is_multicast, "multicast"),
        (ip.is_private, "private"),
        (not ip.is_global, "not globally routable"),
    ):
        if refused:
            return f"a {why} address"
    return None
