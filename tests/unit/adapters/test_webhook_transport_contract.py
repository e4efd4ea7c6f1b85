"""The webhook-transport contract (`h3core.testing.webhooks`) run against every implementation:
`HttpPostClient` against real receivers on loopback, and the `MemoryTransport` fake against
receivers it simulates. What the sender does above a transport is in tests/unit/test_webhooks.py."""

from __future__ import annotations

import pytest

from h3core.adapters.webhooks import HttpPostClient, MemoryTransport, Outgoing, PostFailed
from h3core.testing.webhooks import FIRST, SECOND, Received, ScriptedAnswers, WebhookTransportContract


class TestHttpPostClient(WebhookTransportContract):
    @pytest.fixture
    def transport(self, receivers):
        return HttpPostClient(connect_timeout_s=5, read_timeout_s=5, ssl_context=receivers.client_tls)


class SimulatedReceivers(ScriptedAnswers):
    """The contract's receivers as `MemoryTransport` reaches them: its handler, which answers a
    post to `FIRST` or `SECOND` on `port` from the script, and any other with no answer."""

    port, closed_port, tls_port, client_tls = 8080, 8081, None, None

    def handle(self, request: Outgoing) -> int:
        if request.port != self.port or request.address not in (FIRST, SECOND):
            raise PostFailed(f"nothing listens at {request.address}:{request.port}")
        status = self.take(request.address, Received(request.target, [(k.lower(), v) for k, v in request.headers], request.body))
        if status is None:
            raise PostFailed("the connection closed before an answer")
        return status


class TestMemoryTransport(WebhookTransportContract):
    @pytest.fixture
    def receivers(self):
        return SimulatedReceivers()

    @pytest.fixture
    def transport(self, receivers):
        return MemoryTransport(handler=receivers.handle)


@pytest.mark.anyio
async def test_the_fake_answers_its_script_first_then_its_handler_and_records_every_post():
    transport = MemoryTransport(500, PostFailed("down"), handler=lambda request: 202)
    url = "https://hooks.example/in?x=1"
    assert await transport.post(url, [("webhook-id", "a")], b"1", address="203.0.113.7") == 500
    with pytest.raises(PostFailed, match="down"):
        await transport.post(url, [("webhook-id", "b")], b"2", address="203.0.113.7")
    transport.answer(404)
    assert [await transport.post(url, [], b"", address="203.0.113.7") for _ in range(2)] == [404, 202]
    assert [(r.scheme, r.host, r.address, r.port, r.target) for r in transport.requests] == [
        ("https", "hooks.example", "203.0.113.7", 443, "/in?x=1")
    ] * 4
    assert transport.requests[0].headers == (("host", "hooks.example"), ("webhook-id", "a"), ("content-length", "1"))
    await transport.aclose()
    assert transport.closed == 1
