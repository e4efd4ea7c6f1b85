"""Draining a runner node from the console's box page, in Chromium: two `h3core serve` nodes on one
PostgreSQL store. Drain asks first (a dismissed question changes nothing), says what it did, and
the row shows who drained the node and since when, with Clear drain; without JavaScript both are
plain form posts. The page with its nodes passes axe-core."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from h3core.adapters.store.postgres import PostgresEventStore
from tests.integration.console.conftest import axe_violations, signed_in
from tests.integration.service.conftest import Server, Servers

pytestmark = pytest.mark.timeout(300)

TOKEN = "console-nodes-token-0123456789"


@pytest.fixture
def nodes(tmp_path, pg_url) -> Iterator[dict[str, Server]]:
    servers = Servers(tmp_path)
    try:
        yield servers.nodes(pg_url, ("a", "b"), {"H3_LEASE": "2", "H3_POLL_INTERVAL": "0.05", "H3_API_TOKENS": f"alice:{TOKEN}"})
    finally:
        servers.kill_all()


def _signed_in(browser, server: Server, **options):
    return signed_in(browser, server, TOKEN, accept_dialogs=False, viewport={"width": 1280, "height": 900}, **options)


def _drain(store: PostgresEventStore, node: str):
    return next(n.drain for n in store.leases.nodes() if n.node_id == node)


def test_drain_asks_says_who_and_is_cleared_from_the_box_page(browser, nodes, pg_url, axe_source):
    store = PostgresEventStore(pg_url)
    asked: list[str] = []
    accept = False

    def answer(dialog) -> None:
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    context, page = _signed_in(browser, nodes["a"])
    try:
        page.goto("/console/box")
        page.on("dialog", answer)
        page.get_by_role("button", name="Drain node b").click()  # dismissed: nothing changes
        assert asked and "Drain node b?" in asked[0] and "takes no new jobs" in asked[0]
        assert _drain(store, "b") is None and "said=" not in page.url

        accept = True
        page.get_by_role("button", name="Drain node b").click()
        page.wait_for_url("**/console/box?said=drained")
        assert "Node marked draining" in page.locator("#node-note").inner_text()
        row = page.locator("tr[data-node='b']")
        assert "draining since" in row.inner_text() and "(by alice)" in row.inner_text()
        assert row.get_by_role("button", name="Clear drain of node b").is_visible()
        drain = _drain(store, "b")
        assert drain is not None and drain.by == "alice"
    finally:
        context.close()

    context, page = _signed_in(browser, nodes["b"], bypass_csp=True)  # axe's script needs the CSP bypassed
    try:
        for width in (1280, 390):  # a desktop's and a phone's
            page.set_viewport_size({"width": width, "height": 900})
            page.goto("/console/box")
            assert page.locator("tr[data-node='b'] .badge.queued").inner_text() == "draining"
            assert axe_violations(page, axe_source) == [], width
    finally:
        context.close()

    context, page = _signed_in(browser, nodes["a"], java_script_enabled=False)
    try:
        page.goto("/console/box")
        page.get_by_role("button", name="Clear drain of node b").click()  # a plain form post
        page.wait_for_url("**/console/box?said=undrained")
        assert "Drain cleared" in page.locator("#node-note").inner_text()
        assert _drain(store, "b") is None
        page.get_by_role("button", name="Drain node a").click()  # no script: no question, the post itself
        page.wait_for_url("**/console/box?said=drained")
        assert _drain(store, "a") is not None
        page.get_by_role("button", name="Clear drain of node a").click()
        page.wait_for_url("**/console/box?said=undrained")
        assert _drain(store, "a") is None
    finally:
        context.close()
        store.close()
