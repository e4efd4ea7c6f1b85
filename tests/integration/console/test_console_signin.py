"""The console behind API tokens, in Chromium: sign in with a token (an HttpOnly, SameSite=Strict
cookie the page's /v1 calls ride on), and a form posted from another site's page refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.console.conftest import console_server
from tests.integration.service.conftest import Server

TOKEN = "console-token-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from console_server(tmp_path_factory, "console-tokens", {"H3_API_TOKENS": TOKEN})


def test_sign_in_with_a_token(browser, server, screens):
    context = browser.new_context(base_url=server.url)
    page = context.new_page()
    try:
        page.goto("/console/submit")
        assert "/console/signin" in page.url
        screens.take(page, "signin")
        page.get_by_label("API token").fill("not-the-token-at-all")
        page.get_by_role("button", name="Sign in").click()
        assert page.get_by_role("alert").inner_text().startswith("That token is not")
        page.get_by_label("API token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/console/submit")
        # The form's options come from /v1/ceilings: the page's own call, on the cookie alone.
        page.wait_for_selector("#frames option", state="attached")
        (cookie,) = context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
        assert page.evaluate("document.cookie") == ""  # out of the script's reach
    finally:
        context.close()


CROSS_SITE_PAGE = """<!doctype html><form id=f method=post action="{action}">
<input name=prompt value="a fox from another site"><input name=token value="{token}"></form>
<script>document.getElementById('f').submit()</script>"""


@pytest.mark.parametrize("target", ["/v1/jobs", "/console/signin"])
def test_a_form_posted_from_another_site_is_refused(browser, server, target):
    context = browser.new_context()
    page = context.new_page()
    try:
        # A page of another origin (served by the browser's own interception: no other server).
        html = CROSS_SITE_PAGE.format(action=f"{server.url}{target}", token=TOKEN)
        page.route("http://elsewhere.test/**", lambda route: route.fulfill(status=200, content_type="text/html", body=html))
        with page.expect_response(lambda r: r.url == f"{server.url}{target}") as answer:
            page.goto("http://elsewhere.test/")
        assert answer.value.status == 403, answer.value.text()
        assert context.cookies(server.url) == []  # no session was made
    finally:
        context.close()
    with server.client(TOKEN) as api:
        assert api.get("/v1/jobs").json()["items"] == []
