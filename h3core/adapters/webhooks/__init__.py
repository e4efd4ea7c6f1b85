"""Webhooks out: the sender that checks targets and signs (`sender`), over a transport whose
contract is `base`: the real one (`http_post`, h11) and a fake that records and answers from a
script (`memory`), for tests. Needs the `service` extra (h11, standardwebhooks)."""

from h3core.adapters.webhooks.base import Outgoing, PostFailed, WebhookTransport, outgoing
from h3core.adapters.webhooks.http_post import HttpPostClient
from h3core.adapters.webhooks.memory import MemoryTransport
from h3core.adapters.webhooks.sender import (
    DeliveryFailed,
    Resolve,
    Vetted,
    WebhookSender,
    check_secret,
    system_resolve,
    target_refusal,
    vet,
)

__all__ = [
    "DeliveryFailed",
    "HttpPostClient",
    "MemoryTransport",
    "Outgoing",
    "PostFailed",
    "Resolve",
    "Vetted",
    "WebhookSender",
    "WebhookTransport",
    "check_secret",
    "outgoing",
    "system_resolve",
    "target_refusal",
    "vet",
]
