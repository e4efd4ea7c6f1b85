"""The console behind API tokens, in Chromium: sign in with a token (an HttpOnly, SameSite=Strict
cookie the page's /v1 calls ride on), and a form posted from another site's page refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.console.conftest import console_server, signed_in
from tests.integration.service.conftest import Server, cancel_quietly, long_job, submit, wait_job

TOKEN = "console-token-0123456789"
OTHER = "another-token-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    # A named token: what its holder does is logged under "alice".
    yield from console_server(tmp_path_factory, "console-tokens", {"H3_API_TOKENS": f"alice:{TOKEN},{OTHER}"})


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


def _signed_in(browser, server, **options):
    return signed_in(browser, server, TOKEN, **options)


def test_actions_are_logged_with_who_did_them_and_a_retry_keeps_its_priority(browser, server):
    context, page = _signed_in(browser, server)
    try:
        with server.client(OTHER) as api:
            job_id = long_job(api, steps=300, step=0.2, priority=7)["id"]
            wait_job(api, job_id, ("running",))
            page.goto(f"/console/jobs/{job_id}")
            page.get_by_role("button", name="Cancel").click()
            page.wait_for_selector("#job-status:has-text('cancelled')", timeout=30_000)
            (asked,) = [e["body"] for e in api.get(f"/v1/jobs/{job_id}/events").json() if e["body"]["type"] == "cancel_requested"]
            assert asked["by"] == "alice"
            assert api.get(f"/v1/jobs/{job_id}").json()["submitted_by"] == "token-2"  # the second, unnamed token
            page.get_by_role("button", name="Retry").click()
            page.wait_for_url(lambda url: job_id not in url)
            again = api.get(f"/v1/jobs/{page.url.rsplit('/', 1)[1]}").json()
            assert (again["retry_of"], again["priority"], again["submitted_by"]) == (job_id, 7, "alice")
            assert page.get_by_role("link", name=job_id).count() == 1  # the new job's page links the one it retries
            api.post(f"/v1/jobs/{again['id']}/cancel")
    finally:
        context.close()


def test_an_ended_session_is_said_and_the_sign_in_page_never_lands_in_the_queue(browser, server):
    context, page = _signed_in(browser, server)
    try:
        with server.client(TOKEN) as api:
            job_id = long_job(api, steps=300, step=0.2)["id"]
            wait_job(api, job_id, ("running",))
            page.goto("/console")
            page.wait_for_selector("#live:has-text('live')")
            context.clear_cookies()  # the session ends (expired, or signed out elsewhere)
            page.wait_for_selector("#live:has-text('signed out')", timeout=30_000)
            assert page.locator("#queue-body input[name=token]").count() == 0
            assert page.locator(f"#queue-body tr[data-job='{job_id}']").count() == 1  # the page as it was
            href = page.get_by_role("link", name="sign in again").get_attribute("href")
            assert href.startswith("/console/signin?next=")
            api.post(f"/v1/jobs/{job_id}/cancel")
    finally:
        context.close()


def test_without_javascript_cancel_and_retry_are_plain_form_posts(browser, server):
    context, page = _signed_in(browser, server, java_script_enabled=False)
    try:
        with server.client(TOKEN) as api:
            job_id = long_job(api, steps=300, step=0.2)["id"]
            page.goto(f"/console/jobs/{job_id}")
            page.get_by_role("button", name="Cancel").click()
            page.wait_for_url(f"**/console/jobs/{job_id}?said=*")
            assert page.locator("#action-note").inner_text() in ("Cancelled.", "Cancel asked: the job stops at its next step.")
            assert wait_job(api, job_id)["status"] == "cancelled"
            page.goto(f"/console/jobs/{job_id}")
            page.get_by_role("button", name="Retry").click()
            page.wait_for_url(lambda url: job_id not in url)
            assert api.get(f"/v1/jobs/{page.url.rsplit('/', 1)[1]}").json()["retry_of"] == job_id
            # The submit form posts its prompt in the body (never in a URL), from options the page
            # itself lists; a refusal comes back on the form with each field's message.
            page.goto("/console/submit")
            page.get_by_label("Prompt", exact=True).fill("a fox without a script [fake step=0]")
            page.get_by_label("Steps").fill("2")
            with page.expect_request("**/console/submit") as sent:
                page.get_by_role("button", name="Submit").click()
            assert sent.value.method == "POST" and "fox" not in sent.value.url
            page.wait_for_url("**/console/jobs/*", timeout=10_000)
            job = wait_job(api, page.url.rsplit("/", 1)[1])
            assert (job["status"], job["request"]["prompt"], job["submitted_by"]) == (
                "done",
                "a fox without a script [fake step=0]",
                "alice",
            )
            page.goto("/console/submit")
            page.get_by_label("Prompt", exact=True).fill("a fox of no steps")
            page.get_by_label("Steps").fill("0")
            page.get_by_role("button", name="Submit").click()
            assert "steps: Input should be greater than or equal to 1" in page.locator("#submit-result").inner_text()
    finally:
        context.close()


def test_without_javascript_cancel_selected_and_retry_selected_are_plain_form_posts(browser, server):
    context, page = _signed_in(browser, server, java_script_enabled=False)
    try:
        with server.client(TOKEN) as api:
            slow = [long_job(api, steps=300, step=0.2)["id"] for _ in range(2)]
            done = submit(api, prompt="a quick fox [fake step=0]", steps=1)["id"]
            wait_job(api, done)
            page.goto("/console")
            for job_id in [*slow, done]:
                page.get_by_label(f"select {job_id}").check()
            page.get_by_role("button", name="Cancel selected").click()
            page.wait_for_url("**/console?said=bulk-cancel*")
            assert page.locator("#bulk-note").inner_text() == "Cancel asked for 2 job(s); 1 skipped (already ended)."
            assert [wait_job(api, j)["status"] for j in slow] == ["cancelled", "cancelled"]
            for j in slow:
                asked = [e["body"] for e in api.get(f"/v1/jobs/{j}/events").json() if e["body"]["type"] == "cancel_requested"]
                assert [a["by"] for a in asked] == ["alice"], asked

            page.goto("/console?status=cancelled")
            for job_id in slow:
                page.get_by_label(f"select {job_id}").check()
            page.get_by_role("button", name="Retry selected").click()
            page.wait_for_url("**/console?said=bulk-retry*")
            assert page.locator("#bulk-note").inner_text() == "Retried 2 job(s)."
            retried = [j for j in api.get("/v1/jobs", params={"limit": 100}).json()["items"] if j["retry_of"] in slow]
            assert sorted(j["retry_of"] for j in retried) == sorted(slow) and {j["submitted_by"] for j in retried} == {"alice"}
            cancel_quietly(api, *(j["id"] for j in retried))
    finally:
        context.close()
