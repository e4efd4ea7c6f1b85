"""The console's pure parts (queue pages and filters, ETAs, the timeline, the debounced change
feed, session cookies) and its pages in process: sign-in, the cookie on /v1, cross-site refusals."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from h3core.domain.events import Admitted, AttemptFailed, Event, Failed, Progress, Resumed, Running
from h3core.domain.state import extend
from h3core.domain.story import fields
from h3core.runtime.bus import EventBus
from h3core.service.auth import SESSION_COOKIE, session_matches, session_value
from h3core.service.console.live import changes
from h3core.service.console.pages import MAX_BULK, bulk_said, num
from h3core.service.console.queue import Filter, UnknownChoice, eta_seconds, expected_starts, page
from h3core.service.console.timeline import event_rows, timeline
from tests.factories import done_log, submitted
from tests.unit.service.conftest import QUICK
from tests.waiting import poll

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TOKEN = "token-number-one-0123"


def _fill(store, n: int, prompt=lambda i: f"fox {i}") -> list[str]:
    ids = []
    for i in range(n):
        job_id = f"job{i:04d}"
        store.append(job_id, [submitted(prompt=prompt(i)), Admitted()])
        ids.append(job_id)
    return ids


def _walk(store, wanted: Filter, *, limit: int, budget: int = 5000) -> list[str]:
    """Every job the pages show, following `older` from the first page."""
    seen, before = [], None
    for _ in range(100):
        p = page(store, wanted, datetime.now(UTC), limit=limit, before=before, budget=budget)
        seen += [s.job_id for s in p.jobs]
        if p.older is None:
            return seen
        before = p.older
    raise AssertionError("the pages never ended")


def test_the_pages_show_every_job_once_newest_first(store):
    ids = _fill(store, 23)
    assert _walk(store, Filter(), limit=5) == ids[::-1]


def test_newer_goes_back_to_the_page_before(store):
    _fill(store, 12)
    now = datetime.now(UTC)
    first = page(store, Filter(), now, limit=5)
    second = page(store, Filter(), now, limit=5, before=first.older)
    assert first.newer is None and second.newer is not None
    back = page(store, Filter(), now, limit=5, after=second.newer)
    assert [s.job_id for s in back.jobs] == [s.job_id for s in first.jobs]
    assert back.newer is None


def test_a_narrow_filter_stops_at_its_budget_and_goes_on_from_there(store):
    ids = _fill(store, 60, prompt=lambda i: "a rare owl" if i % 20 == 0 else f"fox {i}")
    first = page(store, Filter(text="owl"), datetime.now(UTC), limit=5, budget=10)
    assert first.cut_short and first.older is not None
    assert _walk(store, Filter(text="OWL"), limit=5, budget=10) == [ids[40], ids[20], ids[0]]


def test_filters_by_status_mode_and_any_part_of_the_id(store):
    _fill(store, 3)
    store.append("job0001", [Running(attempt=1, executor="fake")])
    now = datetime.now(UTC)
    assert [s.job_id for s in page(store, Filter(status="running"), now).jobs] == ["job0001"]
    assert [s.job_id for s in page(store, Filter(status="queued"), now).jobs] == ["job0002", "job0000"]
    assert page(store, Filter(mode="fl2va"), now).jobs == []
    assert [s.job_id for s in page(store, Filter(text="job0002"), now).jobs] == ["job0002"]
    assert [s.job_id for s in page(store, Filter(text="B0002"), now).jobs] == ["job0002"]  # not only a prefix
    assert Filter.of("", "", None, "") == Filter()
    for args, name in (
        (("bogus", None, None, None), "status"),
        ((None, "x", None, None), "mode"),
        ((None, None, None, "2y"), "since"),
    ):
        with pytest.raises(UnknownChoice) as refused:
            Filter.of(*args)
        assert refused.value.name == name and "is not one of" in str(refused.value)


def _running(job_id: str, steps: int, done: int, spent_s: float):
    bodies = [submitted(steps=steps), Admitted(), Running(attempt=1, executor="fake")]
    state, _ = extend(None, job_id, bodies, T0)
    state, _ = extend(state, job_id, [Progress(step=done, total=steps)], T0 + timedelta(seconds=spent_s))
    return state


def test_queued_jobs_expect_to_start_as_slots_free_at_the_measured_pace():
    # Two slots, running jobs at 1 s a step: one 10 s from its end, one 30 s.
    running = [_running("a", 20, 10, 10.0), _running("b", 40, 10, 10.0)]
    queued = [extend(None, f"q{i}", [submitted(steps=5), Admitted()], T0)[0] for i in range(3)]
    assert expected_starts(queued, running, slots=2) == [pytest.approx(10), pytest.approx(15), pytest.approx(20)]
    # A free slot: the first starts now; no pace measured: no estimate at all, rather than a guess.
    assert expected_starts(queued[:1], running[:1], slots=2) == [0.0]
    waiting = extend(None, "w", [submitted(steps=20), Admitted(), Running(attempt=1, executor="fake")], T0)[0]
    assert expected_starts(queued, [waiting], slots=1) == [None, None, None]


def test_a_figure_is_shown_rounded():
    assert (num(2.3333333333333335), num(5.0), num(0.125), num(7)) == ("2.33", "5", "0.12", "7")


def test_the_eta_is_the_measured_pace_times_the_steps_left():
    state, _ = extend(None, "j", [submitted(steps=10), Admitted(), Running(attempt=1, executor="fake")], T0)
    assert eta_seconds(state) is None  # no step yet: no pace to tell
    state, _ = extend(state, "j", [Progress(step=2, total=10)], T0 + timedelta(seconds=4))
    assert eta_seconds(state) == pytest.approx(16.0)


def _log(bodies, gaps) -> list[Event]:
    out, at = [], T0
    for seq, (body, gap) in enumerate(zip(bodies, gaps, strict=True), 1):
        at += timedelta(seconds=gap)
        out.append(Event(job_id="j", seq=seq, at=at, body=body))
    return out


def test_the_timeline_draws_the_waits_each_attempt_and_its_failure():
    events = _log(
        [
            submitted(),
            Admitted(),
            Running(attempt=1, executor="fake", info={"kernel": "sage-fp16", "groups": "2+2"}),
            Progress(step=1, total=4),
            AttemptFailed(attempt=1, kind="executor_lost", message="the worker went away"),
            Running(attempt=2, executor="fake", executor_ref="p-2"),
            Resumed(attempt=2, executor_ref="p-2", after_s=3.0),
            Progress(step=2, total=4),
            Failed(kind="oom", message="out of memory at step 3"),
        ],
        [0, 0, 2, 1, 1, 4, 1, 1, 1],
    )
    line = timeline(events, T0 + timedelta(days=1))
    assert [(b.kind, b.outcome) for b in line.bars] == [
        ("queue", "waited"),
        ("attempt", "retried"),
        ("queue", "waited"),
        ("attempt", "failed"),
    ]
    first, last = line.bars[1], line.bars[3]
    assert (first.kernel, first.group, first.detail) == ("sage-fp16", "2+2", "executor_lost: the worker went away")
    assert last.detail == "oom: out of memory at step 3" and last.percent == 50
    assert last.left + last.width == pytest.approx(100, abs=0.01)  # the axis ends where the log does
    assert [m.label for m in line.marks] == ["resumed"]


def test_a_job_failed_while_queued_shows_its_reason_on_the_wait():
    events = _log([submitted(), Admitted(), Failed(kind="not_started", message="no slot")], [0, 0, 5])
    (bar,) = timeline(events, T0).bars
    assert (bar.kind, bar.outcome, bar.detail) == ("queue", "failed", "not_started: no slot")


def test_the_event_table_says_what_replay_prints():
    events = _log(done_log(), [0, 1, 1, 1, 1, 1, 1])
    rows = event_rows(events)
    plain = [r.fields for r in rows if not r.type.startswith("progress")]
    assert plain == [fields(e) for e in events if e.type != "progress"]
    assert rows[1].delta == "+1.00s" and rows[0].delta == ""


@pytest.mark.anyio
async def test_changes_come_at_most_once_per_interval_however_many_events():
    bus, seen, times, readings = EventBus(buffer=100_000), [], [], []

    def clock() -> float:  # what `changes` reads last before it yields is when it sent the update
        readings.append(anyio.current_time())
        return readings[-1]

    async def publish() -> None:
        for i in range(40):
            bus.publish([Event(job_id=f"j{n}", seq=i + 1, at=T0, body=Progress(step=i, total=40)) for n in range(200)])
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:

        async def read() -> None:
            async for ids in changes(bus, interval_s=0.1, keepalive_s=5, clock=clock):
                assert ids is not None
                times.append(readings[-1])  # not the reader's clock: a loaded loop hands it over late
                seen.extend(ids)
                if len(times) >= 3:
                    tg.cancel_scope.cancel()

        tg.start_soon(read)
        await anyio.sleep(0)
        tg.start_soon(publish)
    assert all(b - a >= 0.1 for a, b in zip(times, times[1:], strict=False)), times
    assert {f"j{n}" for n in range(200)} <= set(seen)


def test_a_session_cookie_holds_no_token_and_expires():
    value = session_value("s3cret", now=1000)
    assert "s3cret" not in value
    assert session_matches(value, ["other", "s3cret"], now=1001)
    assert not session_matches(value, ["other"], now=1001)
    assert not session_matches(value, ["s3cret"], now=1000 + 13 * 3600)
    assert not session_matches("123.abc", ["s3cret"], now=0) and not session_matches("", ["s3cret"], now=0)


# -- the pages, in process ---------------------------------------------------------------------


def test_without_tokens_every_page_answers(make_client):
    with make_client() as client:
        job = client.post("/v1/jobs", json=QUICK).json()["id"]
        for path in ("/console", "/console/submit", "/console/box", f"/console/jobs/{job}", "/console?status=ended&q=fox"):
            r = client.get(path)
            assert r.status_code == 200, (path, r.text)
            assert "default-src 'self'" in r.headers["content-security-policy"]
        missing = client.get("/console/jobs/nope")
        assert missing.status_code == 404 and "text/html" in missing.headers["content-type"] and "No such job" in missing.text
        bogus = client.get("/console?status=bogus")
        assert bogus.status_code == 400 and "status 'bogus' is not one of: queued, running" in html.unescape(bogus.text)
        assert client.get("/console/static/console.js").headers["content-type"].startswith("text/javascript")
        assert client.get("/console/static/../app.py").status_code == 404


def test_signing_in_sets_a_strict_cookie_that_the_api_accepts(make_client):
    with make_client(api_tokens=[TOKEN]) as client:
        r = client.get("/console/box", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/console/signin?next=%2Fconsole%2Fbox"
        assert client.get("/v1/jobs").status_code == 401
        bad = client.post("/console/signin", data={"token": "nope", "next": "/console/box"}, follow_redirects=False)
        assert bad.status_code == 401 and SESSION_COOKIE not in bad.cookies
        ok = client.post("/console/signin", data={"token": TOKEN, "next": "https://evil.example/"}, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/console"  # never off this site
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and TOKEN not in cookie
        assert client.get("/console/box").status_code == 200
        assert client.get("/v1/jobs").status_code == 200
        client.post("/console/signout")
        assert client.get("/v1/jobs").status_code == 401


def test_a_form_from_another_site_is_refused(make_client):
    with make_client(api_tokens=[TOKEN]) as client:
        client.post("/console/signin", data={"token": TOKEN})
        other = {"Origin": "https://evil.example"}
        assert client.post("/console/signin", data={"token": TOKEN}, headers=other).status_code == 403
        assert client.post("/v1/jobs", data={"prompt": "x"}, headers=other).status_code == 403
        # Same site, but a form: the API takes JSON only (a cookie does not make a form a request).
        assert client.post("/v1/jobs", data={"prompt": "x"}).status_code == 415
        assert client.get("/v1/jobs").json()["items"] == []


def test_a_run_of_progress_events_is_one_row_of_the_table():
    steps = [Progress(step=i, total=300) for i in range(1, 301)]
    events = _log(
        [submitted(), Admitted(), Running(attempt=1, executor="fake"), *steps, Failed(kind="oom", message="x")], [0] + [1] * 303
    )
    rows = event_rows(events)
    assert [r.type for r in rows] == ["submitted", "admitted", "running", "progress ×300", "failed"]
    run = rows[3]
    assert run.seq == 4 and "1/300" in run.fields and "300/300" in run.fields and run.fields.endswith("(over 4m59s)")
    assert rows[4].seq == 304 and rows[4].delta == "+1.00s"  # after the last step, not the run's first
    # A single progress event stays a row of its own, as replay prints it.
    one = _log(
        [submitted(), Admitted(), Running(attempt=1, executor="fake"), steps[0], Failed(kind="oom", message="x")], [0, 1, 1, 1, 1]
    )
    assert [r.fields for r in event_rows(one)] == [fields(e) for e in one]


def test_a_request_is_known_by_its_token_s_name_bearer_or_session():
    from h3core.service.auth import who

    tokens = [f"alice:{TOKEN}", "unnamed-token-0123456789", "has space:in-its-token-0123"]
    assert who(f"Bearer {TOKEN}", None, tokens) == "alice"
    assert who("Bearer unnamed-token-0123456789", None, tokens) == "token-2"
    assert who(None, session_value("unnamed-token-0123456789"), tokens) == "token-2"
    assert who(None, session_value(TOKEN), tokens) == "alice"
    # "has space:…" has no valid name before its first colon: the whole entry is the token.
    assert who("Bearer has space:in-its-token-0123", None, tokens) == "token-3"
    assert who(f"Bearer alice:{TOKEN}", None, tokens) is None  # the name is not part of the token
    assert who("Bearer someone-else-0123456789", session_value("someone-else-0123456789"), tokens) is None
    assert who(f"Bearer {TOKEN}", None, []) is None  # no tokens: no one in particular


def test_the_form_offers_whole_seconds_between_a_ceiling_s_least_and_most():
    from h3core.service.console.pages import frame_choices

    assert frame_choices(1, 100) == [1, 24, 48, 72, 96, 100]
    assert frame_choices(30, 48) == [30, 48]  # 24 is under the least
    assert frame_choices(5, 5) == [5]


def test_a_page_of_jobs_sorts_by_a_column_and_keeps_the_filter(make_client):
    with make_client() as client:
        ids = [client.post("/v1/jobs", json={**QUICK, "priority": p}).json()["id"] for p in (1, 9, 5)]
        poll(lambda: all(client.get(f"/v1/jobs/{i}").json()["status"] == "done" for i in ids), 30, "the jobs to end")
        listed = client.get("/console?status=done&sort=priority").text
        assert [listed.index(f'data-job="{i}"') for i in (ids[1], ids[2], ids[0])] == sorted(
            listed.index(f'data-job="{i}"') for i in ids
        )
        assert 'aria-sort="descending"><a href="?status=done&amp;sort=priority">Priority</a>' in listed
        assert 'href="?status=done&amp;sort=submitted">Submitted' in listed
        assert client.get("/console?sort=size").status_code == 400


def test_the_box_says_its_load_and_reads_it_again(make_client):
    with make_client() as client:
        box = client.get("/console/box")
        part = client.get("/console/box?fragment=1")
    assert 'id="box-body" data-fragment="/console/box"' in box.text
    load = re.search(r'<dd id="box-running">[^<]*</dd>', part.text)
    assert load is not None and load.group(0) == '<dd id="box-running">0 of 1 slot(s)</dd>', load or part.text[:2000]
    assert 'id="box-queued"' in part.text and "<html" not in part.text
    assert "Not known: the executor (fake) reports no device memory here" in part.text  # the fake has no device


def test_a_bulk_post_is_bounded_and_says_what_it_did_in_fixed_words(make_client):
    assert bulk_said("bulk-cancel", 2, 1, 0) == "Cancel asked for 2 job(s); 1 skipped (already ended)."
    assert bulk_said("bulk-retry", 0, 2, 1) == "Retried 0 job(s); 2 skipped (not ended yet); 1 refused or not found."
    assert bulk_said("<script>", 1, 0, 0) is None and bulk_said(None, 1, 0, 0) is None
    with make_client() as client:
        job = client.post("/v1/jobs", json=QUICK).json()["id"]
        poll(lambda: client.get(f"/v1/jobs/{job}").json()["status"] == "done", 30, "the job to end")
        bogus = client.post("/console/bulk", data={"action": "delete", "job": job})
        assert bogus.status_code == 400 and "No such action" in bogus.text
        many = client.post("/console/bulk", data={"action": "cancel", "job": [f"j{i}" for i in range(MAX_BULK + 1)]})
        assert many.status_code == 400 and f"At most {MAX_BULK} jobs at once; {MAX_BULK + 1} were picked" in many.text
        r = client.post("/console/bulk", data={"action": "retry", "job": [job, job, "nope"]}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/console?said=bulk-retry&n=1&skipped=0&failed=1"
        said = client.get(r.headers["location"]).text
        assert '<span id="bulk-note" role="status" aria-live="polite">Retried 1 job(s); 1 refused or not found.</span>' in said
        assert len([j for j in client.get("/v1/jobs").json()["items"] if j["retry_of"] == job]) == 1  # once, not twice
