"""Webhooks as data: which events a target wants, the stable id, and which addresses are refused."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from h3core.domain.events import Admitted, Cancelled, Progress, Running, event_at
from h3core.domain.webhooks import (
    Allow,
    Endpoint,
    WebhookTarget,
    address_refusal,
    parse_endpoint,
    payload,
    superseded_by_later,
    url_refusal,
    webhook_id,
)
from h3core.testing.factories import artifact, submitted

AT = datetime(2026, 12, 1, tzinfo=UTC)


def test_the_default_filter_is_start_and_completed_and_progress_only_when_asked():
    events = [
        event_at("j", i, AT, b)
        for i, b in enumerate(
            [submitted(), Admitted(), Running(attempt=1, executor="x"), Progress(step=1, total=2), Cancelled()], start=1
        )
    ]
    assert [e.type for e in events if Endpoint.of(WebhookTarget(url="https://h/x")).wants(e)] == ["running", "cancelled"]
    every = Endpoint.of(WebhookTarget(url="https://h/x", events=("start", "progress", "completed")))
    assert [e.type for e in events if every.wants(e)] == ["running", "progress", "cancelled"]
    assert [e.type for e in events if parse_endpoint("openai=https://h/x").wants(e)] == ["cancelled"]


def test_the_id_is_the_event_s_place_and_the_payload_its_envelope():
    from h3core.domain.events import Done

    e = event_at("j1", 6, AT, Done(artifact=artifact()))
    assert webhook_id(e) == webhook_id(e.model_copy()) == "msg_j1_6"
    body = payload(e)
    assert body["type"] == "job.done" and body["timestamp"] == AT.isoformat()
    assert body["data"]["job_id"] == "j1" and body["data"]["seq"] == 6 and body["data"]["event"]["type"] == "done"


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("10.2.3.4", "private"),
        ("172.16.0.9", "private"),
        ("192.168.0.1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("100.64.0.1", "not globally routable"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("fd00::1", "private"),
    ],
)
def test_addresses_a_delivery_may_not_reach_are_named(address, why):
    assert why in (address_refusal(address, Allow()) or "")


def test_a_public_address_passes_and_an_allowed_range_lets_a_private_one_through():
    assert address_refusal("93.184.215.14", Allow()) is None
    assert address_refusal("2606:2800:21f:cb07:6820:80da:af6b:8b2c", Allow()) is None
    assert address_refusal("10.2.3.4", Allow(["10.0.0.0/8"])) is None
    assert address_refusal("10.2.3.4", Allow(["10.2.3.5", "hooks.lan"])) is not None
    assert Allow(["Hooks.LAN."]).host("hooks.lan")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.com/x", "scheme must be http or https"),
        ("example.com/x", "scheme must be http or https"),
        ("http:///x", "names no host"),
        ("http://user:pw@example.com/x", "credentials"),
        ("http://example.com:99999/x", "not a URL"),
        ("https://example.com/" + "a" * 2100, "longer than 2048"),
    ],
)
def test_urls_that_cannot_be_targets_are_named(url, why):
    assert why in (url_refusal(url) or "")
    assert url_refusal("https://hooks.example.com:8443/h3?x=1") is None


def test_deployment_endpoints_parse_with_their_shape_and_filter_or_say_why_not():
    assert parse_endpoint("openai=https://a.example/h") == Endpoint(
        url="https://a.example/h", shape="openai", events=("completed",)
    )
    assert parse_endpoint(" jobs=https://b.example/h ").events == ("start", "completed")
    assert parse_endpoint("jobs:progress+completed=https://b.example/h").events == ("progress", "completed")
    assert parse_endpoint("openai@H3_OPENAI_HOOK=https://a.example/h").secret_env == "H3_OPENAI_HOOK"  # its own secret
    assert parse_endpoint("jobs:completed@S=https://a.example/h?k=v").model_dump(include={"events", "secret_env", "url"}) == {
        "events": ("completed",),
        "secret_env": "S",
        "url": "https://a.example/h?k=v",
    }
    for entry, why in [
        ("https://a.example/h", "is not jobs=URL"),
        ("slack=https://a.example/h", "is not jobs=URL"),
        ("jobs:output=https://a.example/h", "unknown event"),
        ("openai:start=https://a.example/h", "no filter"),
        ("openai=ftp://a.example/h", "scheme"),
        ("openai@=https://a.example/h", "the name of the environment variable"),
        ("openai@H3-X=https://a.example/h", "the name of the environment variable"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_endpoint(entry)


def test_the_openai_shape_names_the_video_and_says_completed_or_failed():
    from h3core.domain.events import Done, Failed

    done = payload_of("openai", event_at("v1", 9, AT, Done(artifact=artifact())))
    failed = payload_of("openai", event_at("v2", 5, AT, Failed(kind="oom", message="m")))
    cancelled = payload_of("openai", event_at("v3", 3, AT, Cancelled()))
    assert done == {
        "id": "evt_v1_9",
        "object": "event",
        "created_at": int(AT.timestamp()),
        "type": "video.completed",
        "data": {"id": "v1"},
    }
    assert failed["type"] == cancelled["type"] == "video.failed" and cancelled["data"] == {"id": "v3"}


def payload_of(shape: str, event) -> dict:
    return Endpoint(url="https://h/x", shape=shape, events=("completed",)).body(event)


# Each form an IPv6 address can carry an IPv4 one in, with the IPv4 host it reaches through a
# translator or tunnel (the attacks of issue 38: all were accepted, Python calls them global).
EMBEDDING = [
    ("64:ff9b::a9fe:a9fe", "169.254.169.254"),  # NAT64, the well-known prefix
    ("64:ff9b::10.0.0.1", "10.0.0.1"),
    ("64:ff9b:1::a9fe:a9fe", "169.254.169.254"),  # NAT64, the local-use prefix (RFC 8215)
    ("64:ff9b:1:a9fe:a9:fe00::", "169.254.169.254"),  # the same, at a /48 prefix (RFC 6052 §2.2)
    ("2002:a9fe:a9fe::1", "169.254.169.254"),  # 6to4
    ("::169.254.169.254", "169.254.169.254"),  # IPv4-compatible
    ("::127.0.0.1", "127.0.0.1"),
    ("::ffff:0:7f00:1", "127.0.0.1"),  # SIIT
    ("::ffff:10.0.0.1", "10.0.0.1"),  # IPv4-mapped
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1"),  # Teredo: the client, bits inverted
]


# Refused whatever IPv4 host they carry: the local-use NAT64 prefix (any of its prefix lengths may
# be the operator's, so every reading is judged; Python counts the prefix private too) and Teredo.
ALWAYS_REFUSED = ("64:ff9b:1:", "2001:0:")


@pytest.mark.parametrize(("address", "inner"), EMBEDDING)
def test_an_ipv6_address_that_reaches_a_private_ipv4_one_is_refused_naming_it(address, inner):
    why = address_refusal(address, Allow())
    assert why is not None
    if address.startswith(ALWAYS_REFUSED):
        return
    assert inner in why or (address.startswith("::ffff:") and "private" in why), why
    network = "169.254.0.0/16" if inner.startswith("169.254") else f"{inner}/32"
    assert address_refusal(address, Allow([network])) is None, "allowing the IPv4 host lets its forms through"


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::5db8:d70e",  # NAT64 to 93.184.215.14
        "2002:5db8:d70e::1",  # 6to4 of 93.184.215.14
        "2606:4700:4700::1111",  # a native public IPv6 address: no IPv4 in it
    ],
)
def test_the_same_forms_of_a_public_ipv4_host_pass(address):
    assert address_refusal(address, Allow()) is None


def test_a_long_video_s_plan_and_each_segment_made_go_with_progress():
    from h3core.domain.events import Planned, SegmentDone
    from h3core.domain.segments import plan_segments

    plan = plan_segments(60, 24)
    bodies = [submitted(frames=60), Admitted(), Planned(plan=plan), Running(attempt=1, executor="x"), Progress(step=1, total=2)]
    bodies.append(SegmentDone(index=0, artifact=artifact("j/segment-1-0.mp4")))
    events = [event_at("j", i, AT, b) for i, b in enumerate(bodies, start=1)]
    progress = Endpoint.of(WebhookTarget(url="https://h/x", events=("progress",)))
    assert [e.type for e in events if progress.wants(e)] == ["planned", "progress", "segment_done"]
    default = Endpoint.of(WebhookTarget(url="https://h/x"))
    assert [e.type for e in events if default.wants(e)] == ["running"], "without the filter, none of them"
    # Throttled, a step gives way to a later one; the plan and a segment made are always sent.
    assert [e.type for e in events if superseded_by_later(e)] == ["progress"]
