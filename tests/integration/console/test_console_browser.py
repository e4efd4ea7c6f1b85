"""The console in Chromium: submit through the form and watch the job end live, the video plays,
cancel from the queue, a failed job's reason and timeline, the form within the ceilings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.console.conftest import console_server
from tests.integration.service.conftest import Server, cancel_quietly, long_job, poll, submit, wait_job

SIZE = {"width": 832, "height": 480}  # a size the profile's ceilings list
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from console_server(tmp_path_factory, "console")


@pytest.fixture
def page(browser, server):
    context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 900})
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    # What a destructive action asks first, accepted (the dialogs' texts are kept for the tests).
    p.dialogs = []
    p.on("dialog", lambda d: (p.dialogs.append(d.message), d.accept()))
    yield p
    context.close()
    assert not errors, f"the page's script failed: {errors}"


def test_submit_through_the_form_and_watch_the_job_reach_done_live(page, api, screens):
    page.goto("/console/submit")
    page.wait_for_selector("#frames option", state="attached")
    screens.take(page, "submit")
    page.get_by_label("Prompt", exact=True).fill("a fox through the form [fake step=0.25]")
    page.get_by_label("Resolution").select_option("832x480")
    page.get_by_label("Length").select_option("24")
    page.get_by_label("Steps").fill("8")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/console/jobs/*")
    job_id = page.url.rsplit("/", 1)[1]
    # The page follows the job's stream: the status changes without the test reloading anything.
    page.wait_for_selector("#job-status:has-text('running')", timeout=WAIT_MS)
    page.wait_for_selector("#job-status:has-text('done')", timeout=WAIT_MS)
    page.wait_for_selector("video#player", timeout=WAIT_MS)
    job = api.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "done" and job["request"]["prompt"].startswith("a fox through the form")
    assert job["request"]["frames"] == 24 and (job["request"]["width"], job["request"]["height"]) == (832, 480)


def test_the_video_plays_for_as_long_as_the_job_made_it(page, api, screens):
    job = wait_job(api, submit(api, prompt="a fox on video [fake step=0]", frames=48, **SIZE)["id"])
    assert job["status"] == "done", job
    page.goto(f"/console/jobs/{job['id']}")
    page.evaluate("document.querySelector('#player').muted = true; document.querySelector('#player').play()")
    # Polled from here: the page's CSP forbids the eval that wait_for_function would use.
    poll(
        lambda: page.evaluate("(v => v.readyState >= 2 && v.currentTime > 0)(document.querySelector('#player'))"),
        30,
        "the video to play",
        lambda: str(
            page.evaluate("(v => [v.readyState, v.currentTime, v.error && v.error.message])(document.querySelector('#player'))")
        ),
    )
    duration = page.evaluate("document.querySelector('#player').duration")
    assert duration == pytest.approx(job["artifact"]["duration_seconds"], abs=0.1)
    assert page.evaluate("document.querySelector('img.thumb').naturalWidth") > 0
    screens.take(page, "job")


def test_cancel_a_running_job_from_the_queue(page, api, screens):
    job_id = long_job(api, steps=200, step=0.2, **SIZE)["id"]
    try:
        wait_job(api, job_id, ("running",))
        page.goto("/console")
        row = page.locator(f"tr[data-job='{job_id}']")
        row.locator("progress").wait_for(timeout=WAIT_MS)
        # Live: the bar moves on its own (the page follows /console/stream; the test reloads nothing).
        first = int(row.locator("progress").get_attribute("value"))
        poll(lambda: int(row.locator("progress").get_attribute("value")) > first, 30, "the progress bar to move on")
        assert page.locator("#live").inner_text() == "live"
        screens.take(page, "queue")
        row.get_by_role("button", name="Cancel").click()
        assert page.dialogs == [f"Cancel job {job_id}? The work done so far is lost."]
        # Live: the row moves to the ended list as cancelled, the page not reloaded by the test.
        page.wait_for_selector(f"tr[data-job='{job_id}'][data-status='cancelled']", timeout=WAIT_MS)
        assert api.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    finally:
        cancel_quietly(api, job_id)


def test_a_selection_is_cancelled_and_retried_together(page, api):
    ids = [long_job(api, steps=200, step=0.2, **SIZE)["id"] for _ in range(2)]
    try:
        page.goto("/console")
        for job_id in ids:
            page.locator(f"input.pick[value='{job_id}']").check()
        page.get_by_role("button", name="Cancel selected").click()
        for job_id in ids:
            page.wait_for_selector(f"tr[data-job='{job_id}'][data-status='cancelled']", state="attached", timeout=WAIT_MS)
            wait_job(api, job_id, ("cancelled",))
    finally:
        cancel_quietly(api, *ids)
    before = {j["id"] for j in api.get("/v1/jobs", params={"limit": 500}).json()["items"]}
    page.goto("/console?status=cancelled")
    for job_id in ids:
        page.locator(f"input.pick[value='{job_id}']").check()
    page.get_by_role("button", name="Retry selected").click()
    page.wait_for_selector("#bulk-note:has-text('retried 2')", timeout=WAIT_MS)
    new = [j for j in api.get("/v1/jobs", params={"limit": 500}).json()["items"] if j["id"] not in before]
    assert len(new) == 2 and {j["request"]["prompt"] for j in new} == {"a slow fox [fake step=0.2]"}
    cancel_quietly(api, *(j["id"] for j in new))


def test_a_failed_job_shows_its_reason_first_and_its_kind_on_the_timeline(page, api, screens):
    job = submit(api, prompt="a fox that runs out of memory [fake step=0 fail_at=2 kind=oom]", **SIZE)
    assert wait_job(api, job["id"])["status"] == "failed"
    page.goto(f"/console/jobs/{job['id']}")
    reason = page.locator("#reason")
    assert reason.locator(".kind").inner_text() == "oom"
    # The reason comes before the timeline on the page.
    assert page.evaluate("document.querySelector('#reason').compareDocumentPosition(document.querySelector('.timeline')) & 4")
    failed_bar = page.locator(".timeline ol.bars li.attempt.failed")
    assert "oom" in failed_bar.locator(".failure").inner_text()
    assert page.locator("table.events tr.ev.failed").count() == 1
    screens.take(page, "job-failed")


def test_the_form_never_offers_more_frames_than_the_ceiling(page, api):
    ceilings = api.get("/v1/ceilings").json()["ceilings"]
    page.goto("/console/submit")
    page.wait_for_selector("#frames option", state="attached")
    checked = 0
    for mode in page.eval_on_selector_all("#mode option", "os => os.map(o => o.value)"):
        page.get_by_label("Mode").select_option(mode)
        for size in page.eval_on_selector_all("#size option", "os => os.map(o => o.value)"):
            page.get_by_label("Resolution").select_option(size)
            offered = [int(v) for v in page.eval_on_selector_all("#frames option", "os => os.map(o => o.value)")]
            rows = [c for c in ceilings if c["mode"] == mode and f"{c['width']}x{c['height']}" == size]
            assert rows, f"{mode} {size} offered but not in /v1/ceilings"
            ceiling = min(c["max_frames"] for c in rows)  # no keyframe or reference chosen: the strictest row
            assert max(offered) == ceiling and min(offered) >= min(c["min_frames"] for c in rows), (mode, size, offered)
            checked += 1
    assert checked == len({(c["mode"], c["width"], c["height"]) for c in ceilings})


def test_a_refusal_is_shown_with_its_ceiling(page, api):
    page.goto("/console/submit")
    # Once the script has read /v1/ceilings (it says the ceiling): before that, the options it
    # fills replace a value forced in, and the form would post without it (a loaded run did).
    page.locator("#ceiling-note", has_text="At most").wait_for(timeout=WAIT_MS)
    page.get_by_label("Prompt", exact=True).fill("too long a fox")
    page.get_by_label("Resolution").select_option("832x480")
    # What the form never offers, forced into it: admission's refusal is what the page shows.
    page.evaluate("const s = document.querySelector('#frames'); s.add(new Option('too many', '1199')); s.value = '1199'")
    page.get_by_role("button", name="Submit").click()
    result = page.locator("#submit-result")
    result.locator("text=ceiling").wait_for(timeout=WAIT_MS)
    assert "1127" in result.inner_text()


def test_the_box_and_a_phone_in_the_dark(browser, server, screens):
    context = browser.new_context(base_url=server.url, viewport={"width": 390, "height": 844}, color_scheme="dark")
    p = context.new_page()
    try:
        p.goto("/console/box")
        assert p.locator("table.ceilings tbody tr").count() == 16
        assert "4x2080ti-sage-fp16" in p.locator("#ceilings-h + dl").inner_text()
        screens.take(p, "box-phone-dark")
        p.goto("/console")
        # Readable at phone width: nothing wider than the screen but the tables' own scrollers.
        wide = p.evaluate(
            "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391"
            " && !e.closest('.scroll')).map(e => `${e.tagName}.${e.className} ${e.getBoundingClientRect().right}`)"
        )
        assert p.evaluate("document.documentElement.scrollWidth") <= 390, wide
        screens.take(p, "queue-phone-dark")
    finally:
        context.close()


def test_what_a_cancel_said_stays_through_the_live_update_it_causes(page, api):
    # A 4 s cleanup after the cancel: the page's update for `cancel_requested` (which replaces the
    # part the note sits in) comes well before the job ends.
    job_id = submit(api, prompt="a slow fox [fake step=0.2 cleanup=4]", steps=200, **SIZE)["id"]
    try:
        wait_job(api, job_id, ("running",))
        page.goto(f"/console/jobs/{job_id}")
        page.get_by_role("button", name="Cancel").click()
        page.wait_for_selector(".timeline .mark:has-text('cancel asked')", timeout=WAIT_MS)
        # The cancel's answer waits for the executor's cleanup; what the page said meanwhile stays.
        assert page.locator("#action-note").inner_text() == "cancelling…"
        assert api.get(f"/v1/jobs/{job_id}").json()["status"] == "running"  # the update came before the end
    finally:
        cancel_quietly(api, job_id)


def test_a_mode_chosen_before_the_form_reads_the_ceilings_stays_chosen(page):
    """The page comes with its options; the script reads /v1/ceilings and fills them again. A choice
    made meanwhile (a loaded machine answers slowly) stayed in the form only by luck before."""
    held = []
    page.route("**/v1/ceilings", lambda route: held.append(route))  # held until the choice is made
    page.goto("/console/submit")
    page.get_by_label("Mode").select_option("ref2va")
    poll(lambda: held, 30, "the page to ask for /v1/ceilings")
    held[0].continue_()
    page.wait_for_selector("#ceiling-note:has-text('At most')")  # the script has filled the form
    assert page.get_by_label("Mode").input_value() == "ref2va"
    assert "for ref2va" in page.locator("#ceiling-note").inner_text()


@pytest.mark.parametrize("mode, field", [("fl2va", "#first"), ("ref2va", "#ref-images")])
def test_a_job_with_uploaded_images_is_submitted_through_the_form(page, api, tmp_path, mode, field):
    from PIL import Image

    image = tmp_path / "frame.png"
    Image.new("RGB", (832, 480), (200, 60, 20)).save(image)
    page.goto("/console/submit")
    page.wait_for_selector("#frames option", state="attached")
    page.get_by_label("Mode").select_option(mode)
    page.set_input_files(field, str(image))
    page.get_by_label("Prompt", exact=True).fill(f"a fox from an image ({mode}) [fake step=0]")
    page.get_by_label("Steps").fill("2")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/console/jobs/*", timeout=WAIT_MS)
    job = wait_job(api, page.url.rsplit("/", 1)[1])
    assert job["status"] == "done", job
    request = job["request"]
    assert request["mode"] == mode
    uploads = [request["keyframes"]["first"]] if mode == "fl2va" else list(request["references"]["images"])
    assert len(uploads) == 1 and all(u.startswith("u_") for u in uploads), request
