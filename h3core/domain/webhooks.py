"""Webhooks, as data: where a job's events go (`WebhookTarget`, stored in its `submitted` event),
which of them go (Replicate's filter names), what each delivery says and its stable id, and which
addresses a delivery may reach. Sending is I/O and lives in `h3core.adapters.webhooks`.

The filter, as Replicate names it: `start` (an attempt began running), `progress` (each step, and
for a long video its plan and each segment made: a segment's steps start again at 1, so a receiver
counts the whole job by them), `completed` (done, failed or cancelled). Without one a job gets all
but `progress`.

An `Endpoint` is where deliveries go: a job's own webhook (h3core's shape, `job.<event type>`),
or one the deployment configures for every job (`H3_WEBHOOK_ENDPOINTS`): in h3core's shape with a
filter, or in OpenAI's Videos shape (`video.completed`, `video.failed` for failed and cancelled
jobs, as /v1/videos reports them), which the `openai` SDK's `client.webhooks.unwrap` reads.

Addresses: a delivery goes to a globally routable address only. Loopback, private, link-local
(where cloud metadata answers: 169.254.169.254), shared, reserved and multicast ones are refused,
unless the operator allows a host name or a range (`H3_WEBHOOKS_ALLOW`); an IPv4 address written as
IPv6 is judged as the IPv4 one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from h3core.domain.events import Event

__all__ = [
    "DEFAULT_EVENTS",
    "Delivery",
    "Endpoint",
    "Shape",
    "MAX_URL_CHARS",
    "Allow",
    "WebhookEvent",
    "WebhookTarget",
    "address_refusal",
    "event_kind",
    "openai_payload",
    "parse_endpoint",
    "payload",
    "superseded_by_later",
    "url_refusal",
    "webhook_id",
]

WebhookEvent = Literal["start", "progress", "completed"]
Shape = Literal["jobs", "openai"]
EVENT_NAMES: tuple[WebhookEvent, ...] = ("start", "progress", "completed")
DEFAULT_EVENTS: tuple[WebhookEvent, ...] = ("start", "completed")
MAX_URL_CHARS = 2048
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebhookTarget(BaseModel):
    """Where a job's events are sent, and which kinds of them."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    url: str = Field(min_length=1, max_length=MAX_URL_CHARS)
    events: tuple[WebhookEvent, ...] = DEFAULT_EVENTS


class Endpoint(BaseModel):
    """Where deliveries go, in which shape, for which kinds of events."""

    model_config = ConfigDict(frozen=True)

    url: str
    shape: Shape = "jobs"
    events: tuple[WebhookEvent, ...] = DEFAULT_EVENTS
    # The environment variable holding this endpoint's own secret(s) (two, comma-separated, while
    # one is rotated out); None: the deployment's H3_WEBHOOK_SECRET. A name, so no secret is a flag.
    secret_env: str | None = None

    @classmethod
    def of(cls, target: WebhookTarget) -> Endpoint:
        """A job's own webhook."""
        return cls(url=target.url, events=target.events)

    def wants(self, event: Event) -> bool:
        """Whether this endpoint gets `event` (its kind is one of `events`)."""
        kind = event_kind(event)
        return kind is not None and kind in self.events

    def body(self, event: Event) -> dict[str, Any]:
        """What a delivery of `event` to this endpoint carries, in its shape (`payload` or `openai_payload`)."""
        return openai_payload(event) if self.shape == "openai" else payload(event)


def parse_endpoint(entry: str) -> Endpoint:
    """`jobs=URL`, `jobs:start+progress+completed=URL` (a filter) or `openai=URL`, each with
    `@ENV_NAME` before the `=` for an endpoint with its own secret in that variable
    (`openai@H3_OPENAI_HOOK_SECRET=URL`); ValueError saying why not."""
    head, sep, url = entry.strip().partition("=")
    head, at, secret_env = head.strip().partition("@")
    shape, _, events = head.strip().partition(":")
    if not sep or shape not in ("jobs", "openai"):
        raise ValueError(
            f"{entry!r} is not jobs=URL, jobs:start+progress+completed=URL or openai=URL (each maybe with @ENV_NAME)"
        )
    if at and not ENV_NAME.fullmatch(secret_env):
        raise ValueError(
            f"{entry!r}: after '@' comes the name of the environment variable holding its secret, e.g. @H3_HOOK_SECRET"
        )
    why = url_refusal(url.strip())
    if why is not None:
        raise ValueError(f"{entry!r}: {why}")
    own = secret_env if at else None
    if shape == "openai":
        if events:
            raise ValueError(f"{entry!r}: an openai endpoint gets video.completed and video.failed, no filter")
        return Endpoint(url=url.strip(), shape="openai", events=("completed",), secret_env=own)
    names = tuple(e.strip() for e in events.split("+")) if events else DEFAULT_EVENTS
    unknown = [n for n in names if n not in EVENT_NAMES]
    if unknown:
        raise ValueError(f"{entry!r}: unknown event(s) {unknown}; known: {list(EVENT_NAMES)}")
    return Endpoint(url=url.strip(), events=tuple(dict.fromkeys(names)), secret_env=own)  # type: ignore[arg-type]


class Delivery(BaseModel):
    """What became of one event's delivery to one endpoint: kept beside the log (not in it: a job's
    log ends with its terminal event, and deliveries outlive it), shown per job."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    seq: int
    event_type: str
    url: str
    webhook_id: str
    outcome: Literal["trying", "delivered", "given_up"]
    tries: int = 0
    last_error: str | None = None
    updated_at: datetime


def event_kind(event: Event) -> WebhookEvent | None:
    """The filter name an event is sent under; None for events no webhook is sent for."""
    if event.terminal:
        return "completed"
    if event.type == "running":
        return "start"
    if event.type in ("progress", "planned", "segment_done"):
        return "progress"
    return None


def superseded_by_later(event: Event) -> bool:
    """Whether a later event of the same kind makes this one's delivery needless (a step's progress:
    the latest says more); a plan or a segment made is always sent."""
    return event.type == "progress"


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


def openai_payload(event: Event) -> dict[str, Any]:
    """A terminal event as OpenAI's Videos API sends it: `video.completed`, or `video.failed` for a
    job that failed or was cancelled (its video object's status then); `data.id` is the video's id."""
    kind = "video.completed" if event.type == "done" else "video.failed"
    return {
        "id": f"evt_{event.job_id}_{event.seq}",
        "object": "event",
        "created_at": int(event.at.timestamp()),
        "type": kind,
        "data": {"id": event.job_id},
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
        """Whether the host name `name` is allowed (case and a trailing dot ignored)."""
        return name.lower().rstrip(".") in self.hosts

    def address(self, ip: IpAddress) -> bool:
        """Whether `ip` lies in an allowed range."""
        return any(ip in net for net in self.networks if net.version == ip.version)


def address_refusal(address: str, allow: Allow) -> str | None:
    """What `address` (an IP, as resolved) is, if a delivery may not go there ("a loopback
    address"); None if it may. An IPv6 address that carries an IPv4 one (mapped, compatible,
    SIIT, NAT64, 6to4, Teredo) is refused if any IPv4 it may reach is: Python calls most of
    these forms global, yet through a translator they reach the IPv4 host they name."""
    ip: IpAddress = ipaddress.ip_address(address.split("%", 1)[0])  # a scope id (fe80::1%eth0) is no part of it
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if allow.address(ip):
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in embedded_ipv4(ip):
            why = address_refusal(str(inner), allow)
            if why is not None:
                return f"an address that reaches {inner}, {why}"
    for refused, why in (
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local (cloud metadata services answer there)"),
        (ip.is_multicast, "multicast"),
        (ip.is_private, "private"),
        (not ip.is_global, "not globally routable"),
    ):
        if refused:
            return f"{'an' if why[0] in 'aeiou' else 'a'} {why} address"
    return None


_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: the operator picks the prefix length
_SIIT = ipaddress.IPv6Network("::ffff:0:0:0/96")  # RFC 2765's IPv4-translated addresses
_COMPATIBLE = ipaddress.IPv6Network("::/96")  # the deprecated IPv4-compatible addresses


def _rfc6052(ip: ipaddress.IPv6Address, prefix: int) -> ipaddress.IPv4Address:
    """The IPv4 address embedded after a `prefix`-bit NAT64 prefix (RFC 6052 §2.2: bits 64-71 are
    skipped)."""
    bits = int(ip)
    if prefix == 96:
        return ipaddress.IPv4Address(bits & 0xFFFFFFFF)
    # Bits 0..63 after the prefix, then 72.. until 32 bits are taken.
    head = 64 - prefix
    high = (bits >> 64) & ((1 << head) - 1)
    low = (bits >> (64 - 8 - (32 - head))) & ((1 << (32 - head)) - 1)
    return ipaddress.IPv4Address((high << (32 - head)) | low)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address a translator or tunnel may take `ip` to: its SIIT, IPv4-compatible,
    NAT64 (the well-known prefix; every prefix length the local-use one allows), 6to4 and Teredo
    (server and client) forms. Empty for an address of none of these forms."""
    found: list[ipaddress.IPv4Address] = []
    if ip in _SIIT or (ip in _COMPATIBLE and int(ip) > 1):  # :: and ::1 are themselves, not IPv4
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip in _NAT64_WELL_KNOWN:
        found.append(_rfc6052(ip, 96))
    if ip in _NAT64_LOCAL:
        found += [_rfc6052(ip, prefix) for prefix in (96, 64, 56, 48)]  # the usual one first
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found += list(ip.teredo)
    return found
