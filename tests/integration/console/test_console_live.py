"""The console's live pages as an operator uses them, in Chromium: keyboard focus and a text selection
survive live updates, an update reads only the rows that changed, a job page follows its job to the
end (its video too) without reloading and through an outage, a session that ends says so, and the
pages stay light (gzip, ETags, a 300-step job on one screen)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.console.conftest import console_server
from tests.integration.service.conftest import Server, Servers, cancel_quietly, long_job, poll, submit, wait_job

SIZE = {"width": 832, "height": 480}
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from console_server(tmp_path_factory, "console-live")


def _page(browser, base_url: str, **options):
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900}, **options)
    p = context.new_page()
    p.errors = []
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.on("dialog", lambda d: d.accept())
    return context, p


@pytest.fixture
def page(browser, server):
    context, p = _page(browser, server.url)
    yield p
    context.close()
    assert not p.errors, f"the page's script failed: {p.errors}"


@pytest.fixture
def running(api) -> Iterator[list[str]]:
    """Three jobs reporting a step every 0.2 s: what keeps a queue page updating."""
    ids = [long_job(api, steps=300, step=0.2, **SIZE)["id"] for _ in range(3)]
    for job_id in ids:
        wait_job(api, job_id, ("running",))
    yield ids
    cancel_quietly(api, *ids)


def _updates(page) -> int:
    return int(page.locator("#queue-body").get_attribute("data-updates") or 0)


def _wait_updates(page, n: int) -> None:
    first = _updates(page)
    poll(lambda: _updates(page) >= first + n, 30, f"{n} live updates of the queue")


def _tab_to_a_job_link(page, presses: int = 40) -> str:
    for _ in range(presses):
        page.keyboard.press("Tab")
        href = page.evaluate("document.activeElement.matches('a.id') ? document.activeElement.getAttribute('href') : null")
        if href:
            return href
        page.wait_for_timeout(50)  # live updates come meanwhile
    raise AssertionError(f"{presses} Tabs never reached a job link")


def test_focus_on_a_job_link_survives_ten_seconds_of_live_updates(page, running):
    page.goto("/console")
    page.locator(f"tr[data-job='{running[0]}'] progress").wait_for()
    href = _tab_to_a_job_link(page)
    first = _updates(page)
    page.wait_for_timeout(10_000)
    assert _updates(page) >= first + 5, "the page did not update meanwhile: the test proves nothing"
    assert page.evaluate("document.activeElement.getAttribute('href')") == href


def test_tab_reaches_a_job_link_on_a_filtered_page_while_others_update(page, api, running):
    done = wait_job(api, submit(api, prompt="a done fox [fake step=0]", **SIZE)["id"])
    page.goto("/console?status=done")
    page.locator(f"tr[data-job='{done['id']}']").wait_for()
    _wait_updates(page, 1)  # the counts follow the running jobs: this page updates too
    assert _tab_to_a_job_link(page).startswith("/console/jobs/")


def test_a_text_selection_survives_live_updates(page, api, running):
    done = wait_job(api, submit(api, prompt="a fox to copy [fake step=0]", **SIZE)["id"])
    page.goto("/console")
    link = page.locator(f"tr[data-job='{done['id']}'] a.id")
    link.wait_for()
    page.evaluate(
        "id => { const a = document.querySelector(`tr[data-job='${id}'] a.id`); const r = document.createRange();"
        " r.selectNodeContents(a); getSelection().removeAllRanges(); getSelection().addRange(r); }",
        done["id"],
    )
    _wait_updates(page, 5)
    assert page.evaluate("getSelection().toString()") == done["id"]


def test_an_update_reads_only_the_rows_that_changed(page, running):
    parts: list[str] = []
    page.on("request", lambda r: parts.append(r.url) if "/console/rows" in r.url or "fragment=1" in r.url else None)
    page.goto("/console")
    page.locator(f"tr[data-job='{running[0]}'] progress").wait_for()
    before = {i: int(page.locator(f"tr[data-job='{i}'] progress").get_attribute("value")) for i in running}
    _wait_updates(page, 8)
    rows, whole = [u for u in parts if "/console/rows" in u], [u for u in parts if "fragment=1" in u]
    assert len(rows) >= 4 and len(rows) > 3 * len(whole), (len(rows), len(whole))
    after = {i: int(page.locator(f"tr[data-job='{i}'] progress").get_attribute("value")) for i in running}
    assert all(after[i] > before[i] for i in running), (before, after)


def test_a_job_page_follows_its_job_to_its_video_without_reloading(page, api):
    job_id = submit(api, prompt="a fox seen to the end [fake step=0.1]", steps=30, **SIZE)["id"]
    page.goto(f"/console/jobs/{job_id}")
    page.evaluate("window.notReloaded = true")
    page.wait_for_selector("video#player", timeout=WAIT_MS)
    assert page.locator("#job-status").inner_text() == "done"
    assert page.evaluate("window.notReloaded === true"), "the page reloaded itself"


def test_a_job_page_rides_out_a_service_restart(browser, tmp_path):
    s = Servers(tmp_path)
    server = s.start({"H3_SLOTS": "2"})
    context, p = _page(browser, server.url)
    try:
        with server.client() as api:
            job_id = long_job(api, steps=60, step=0.1, **SIZE)["id"]
            wait_job(api, job_id, ("running",))
        p.goto(f"/console/jobs/{job_id}")
        p.evaluate("window.notReloaded = true")
        p.wait_for_selector("#live:has-text('live')")
        server.stop()
        p.wait_for_selector("#live:has-text('service unreachable')", timeout=WAIT_MS)
        assert p.locator("h1").inner_text().startswith("Job")  # the page as it was, not an error page
        server.start(same_port=True)
        # The job's next attempt (the stop interrupted the first), followed to its end on the same page.
        p.wait_for_selector("#job-status:has-text('done')", timeout=60_000)
        p.wait_for_selector("#live:has-text('live')", timeout=WAIT_MS)
        assert p.evaluate("window.notReloaded === true"), "the page reloaded itself"
        assert not p.errors, p.errors
    finally:
        context.close()
        s.kill_all()


def test_cancel_while_the_service_is_down_says_so(browser, tmp_path):
    s = Servers(tmp_path)
    server = s.start()
    context, p = _page(browser, server.url)
    try:
        with server.client() as api:
            job_id = long_job(api, steps=600, step=0.2, **SIZE)["id"]
            wait_job(api, job_id, ("running",))
        p.goto(f"/console/jobs/{job_id}")
        server.kill()
        p.get_by_role("button", name="Cancel").click()
        note = p.locator("#action-note")
        note.locator("text=did not answer").wait_for(timeout=WAIT_MS)
        assert "not cancelled" in note.inner_text()
        assert p.get_by_role("button", name="Cancel").is_enabled()  # to try again once it is back
    finally:
        context.close()
        s.kill_all()


def test_pages_are_compressed_and_files_revalidated(server, api):
    with httpx.Client(base_url=server.url) as raw:
        page = raw.get("/console", headers={"Accept-Encoding": "gzip"})
        assert page.headers["content-encoding"] == "gzip"
        part = raw.get("/console?fragment=1", headers={"Accept-Encoding": "gzip"})
        assert part.headers["content-encoding"] == "gzip" and b"<section" in part.content
        assert int(part.headers["content-length"]) < len(gzip.compress(part.content)) * 2
        script = raw.get("/console/static/console.js")
        again = raw.get("/console/static/console.js", headers={"If-None-Match": script.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        stale = raw.get("/console/static/console.js", headers={"If-None-Match": '"another-release"'})
        assert stale.status_code == 200 and stale.content == script.content


def test_a_300_step_job_page_is_one_screen_with_its_video_first(page, api):
    job = wait_job(api, submit(api, prompt="a fox of many steps [fake step=0]", steps=300, **SIZE)["id"])
    assert job["status"] == "done", job
    page.goto(f"/console/jobs/{job['id']}")
    assert page.evaluate("document.documentElement.scrollHeight") < 3000
    assert page.locator("video#player").bounding_box()["y"] < 900  # above the fold at 1280x900
    assert page.locator("table.events tr.ev").count() < 20


def test_the_queue_shows_priority_and_the_order_jobs_start_in(browser, tmp_path):
    s = Servers(tmp_path)
    server = s.start({"H3_SLOTS": "1"})
    context, p = _page(browser, server.url)
    try:
        with server.client() as api:
            first = long_job(api, steps=600, step=0.2, **SIZE)["id"]
            wait_job(api, first, ("running",))
            waiting = [long_job(api, steps=10, step=0.2, **SIZE)["id"] for _ in range(51)]
            urgent = long_job(api, steps=10, step=0.2, priority=10, **SIZE)["id"]
            p.goto("/console")
            queued = p.locator("#queued")
            # Listed last by submission, it starts first: the queue says so.
            head = queued.locator("tbody tr").first
            assert head.get_attribute("data-job") == urgent
            assert head.locator("td.prio").inner_text() == "10"
            assert "#1 to start" in head.inner_text()
            assert queued.locator("tbody tr").nth(1).get_attribute("data-job") == waiting[0]
            # 52 queued, 50 shown: the heading says so and links them all.
            assert "50 of 52" in queued.locator("h2").inner_text()
            queued.get_by_role("link", name="all 52 →").click()
            p.wait_for_url("**/console?status=queued")
            assert p.locator(f"tr[data-job='{urgent}']").inner_text().count("#1 to start") == 1
            api.post(f"/v1/jobs/{first}/cancel")
            for job_id in [*waiting, urgent]:
                api.post(f"/v1/jobs/{job_id}/cancel")
        assert not p.errors, p.errors
    finally:
        context.close()
        s.kill_all()


def test_the_box_page_follows_the_load_live(page, api):
    page.goto("/console/box")
    page.evaluate("window.notReloaded = true")
    before = page.locator("#box-running").inner_text()
    job_id = long_job(api, steps=300, step=0.2, **SIZE)["id"]
    try:
        wait_job(api, job_id, ("running",))
        poll(lambda: page.locator("#box-running").inner_text() != before, 30, "the box to show the job running", before)
        assert page.locator("#box-running").inner_text().startswith(f"{int(before.split()[0]) + 1} of 4 slot(s)")
        assert page.evaluate("window.notReloaded === true")
    finally:
        cancel_quietly(api, job_id)


def test_a_job_page_shows_the_images_it_was_given(page, api):
    from h3core.testing.factories import png

    upload = api.post("/v1/uploads", content=png(832, 480), headers={"Content-Type": "image/png"}).json()["id"]
    job = submit(api, prompt="a fox from a keyframe [fake step=0]", mode="fl2va", keyframes={"first": upload}, **SIZE)
    page.goto(f"/console/jobs/{job['id']}")
    image = page.get_by_role("img", name=f"first frame ({upload})")
    image.wait_for()
    poll(lambda: image.evaluate("i => i.complete && i.naturalWidth") == 832, 30, "the keyframe's preview to load")
    assert api.get(f"/console/uploads/{upload}").headers["content-type"] == "image/png"
    assert api.get("/console/uploads/u_00000000000000000000000000000000").status_code == 404


def test_a_queued_job_s_priority_is_set_from_its_page(page, api):
    busy = [long_job(api, steps=600, step=0.2, **SIZE)["id"] for _ in range(4)]  # the server's 4 slots
    queued = long_job(api, steps=10, step=0.2, **SIZE)["id"]
    try:
        assert wait_job(api, queued, ("queued",))["status"] == "queued"
        page.goto(f"/console/jobs/{queued}")
        page.get_by_label("Priority").fill("7")
        page.get_by_role("button", name="Set priority").click()
        note = page.locator("#action-note")
        poll(
            lambda: note.inner_text() == "priority set to 7",
            30,
            "the page to say the priority was set",
            lambda: f"the note: {note.inner_text()!r}; the job: {api.get(f'/v1/jobs/{queued}').json()['status']}; {page.url}",
        )
        assert api.get(f"/v1/jobs/{queued}").json()["priority"] == 7
        # The page follows its log: the change is on the timeline.
        page.locator(".timeline .mark:has-text('priority set to 7')").wait_for(timeout=WAIT_MS)
    finally:
        cancel_quietly(api, queued, *busy)


def test_a_filtered_page_reads_no_whole_part_for_jobs_it_cannot_list(page, api, running):
    done = wait_job(api, submit(api, prompt="a done fox [fake step=0]", **SIZE)["id"])
    parts: list[str] = []
    page.on("request", lambda r: parts.append(r.url) if "/console/rows" in r.url or "fragment=1" in r.url else None)
    page.goto("/console?status=done")
    page.locator(f"tr[data-job='{done['id']}']").wait_for()
    _wait_updates(page, 1)  # the first reads the whole part: what changed between the render and the stream
    parts.clear()
    _wait_updates(page, 5)  # the running jobs' steps: their counts, not this page's rows
    rows, whole = [u for u in parts if "/console/rows" in u], [u for u in parts if "fragment=1" in u]
    assert len(rows) >= 5 and whole == [], (len(rows), whole)
    # A job that ends done now belongs here: the page reads its whole part and lists it.
    cancel_quietly(api, running[0])
    ended = wait_job(api, submit(api, prompt="a fox that ends now [fake step=0]", **SIZE)["id"])
    page.locator(f"tr[data-job='{ended['id']}']").wait_for(timeout=WAIT_MS)
