"""Every view of a long video made as segments (issue 42) shows the whole job's progress and which
segment it makes: /v1/jobs, OpenAI's video object, the console's rows, ETA, job page and timeline.
States are folded from logs written here (the runner that makes segments is not needed)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from h3core.domain.events import Admitted, AttemptFailed, Done, Event, Planned, Progress, Running, SegmentDone
from h3core.domain.retry import RetryPolicy
from h3core.domain.segments import plan_segments
from h3core.domain.state import JobState, fold
from h3core.domain.story import why
from h3core.service.console.pages import _templates
from h3core.service.console.queue import eta_seconds, expected_starts, row
from h3core.service.console.timeline import event_rows, timeline
from h3core.service.openai_videos import poll_after_ms, progress
from h3core.service.views import job_view
from tests.factories import artifact, segment_file, submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PLAN = plan_segments(100, 40)  # three segments; 10 steps each below: 30 in all


def made(index: int) -> SegmentDone:
    return SegmentDone(index=index, artifact=segment_file(PLAN, index))


def steps(first: int, last: int) -> list[Progress]:
    return [Progress(step=i, total=10) for i in range(first, last + 1)]


# One step a second: attempt 1 makes segment 1 and 4 steps of segment 2, and is lost; attempt 2
# starts 4 s later and makes 2 steps, 2 s each.
RETRIED = [
    (0, submitted(frames=100, steps=10, retry=RetryPolicy(max_attempts=3, retry_on=("executor_lost",)))),
    (0, Admitted()),
    (0, Planned(plan=PLAN)),
    (0, Running(attempt=1, executor="fake")),
    *((1, p) for p in steps(1, 10)),
    (1, made(0)),
    *((1, p) for p in steps(1, 4)),
    (1, AttemptFailed(attempt=1, kind="executor_lost", message="gone")),
    (4, Running(attempt=2, executor="fake")),
    *((2, p) for p in steps(1, 2)),
]


def log(timed) -> list[Event]:
    out, at = [], T0
    for seq, (gap, body) in enumerate(timed, 1):
        at += timedelta(seconds=gap)
        out.append(Event(job_id="j", seq=seq, at=at, body=body))
    return out


def state_of(events: list[Event]) -> JobState:
    state = fold(events)
    assert state is not None
    return state


def test_v1_jobs_shows_the_whole_job_s_steps_and_its_segments():
    events = log(RETRIED)
    view = job_view(state_of(events), now=events[-1].at, queue_position=None)
    assert (view.step, view.total_steps) == (12, 30)  # segment 1 (10) and 2 of segment 2
    assert view.segments is not None
    assert view.segments.model_dump() == {"count": 3, "done": 1, "current": 1, "plan": PLAN.describe()}
    first = job_view(state_of(events[:14]), now=T0, queue_position=None)  # attempt 1, 10 steps of segment 1
    assert (first.step, first.total_steps, first.segments and first.segments.current) == (10, 30, 0)
    rest = [*steps(3, 10), made(1), *steps(1, 10), made(2)]
    done = job_view(state_of(log([*RETRIED, *((1, b) for b in [*rest, Done(artifact=artifact())])])), now=T0, queue_position=None)
    assert (done.status, done.step, done.total_steps) == ("done", 30, 30)
    assert done.segments is not None and (done.segments.done, done.segments.current) == (3, None)
    one_call = state_of(
        log([(0, submitted(steps=10)), (0, Admitted()), (0, Running(attempt=1, executor="fake")), (1, steps(3, 3)[0])])
    )
    plain = job_view(one_call, now=T0, queue_position=None)
    assert (plain.step, plain.total_steps, plain.segments) == (3, 10, None)


def test_openai_s_progress_and_poll_hint_follow_the_whole_job():
    events = log(RETRIED)
    state = state_of(events)
    assert progress(state) == 40  # 12 of 30 steps, not 2 of 10
    # Attempt 2's pace: 4 s for its 2 steps (attempt 1's 14 are not its own).
    assert poll_after_ms(state, events[-1].at) == 2000


def test_the_eta_counts_the_steps_left_in_every_segment_at_this_attempt_s_pace():
    events = log(RETRIED)
    state = state_of(events)
    assert eta_seconds(state) == pytest.approx(2.0 * 18)  # 2 s a step, 18 steps left of 30
    lost = state_of(events[:19])  # attempt 1 at 14 steps over 15 s, before it was lost
    assert eta_seconds(lost) == pytest.approx(15 / 14 * 16)
    just_started = state_of(events[:21])  # attempt 2, no step of its own yet
    assert (just_started.steps_done, eta_seconds(just_started)) == (10, None)
    queued = state_of(events[:20])  # after attempt 1: 20 steps left to start, at the running jobs' pace
    assert expected_starts([queued], [state], slots=2) == [0.0]
    assert expected_starts([queued, queued], [state], slots=1) == [pytest.approx(36), pytest.approx(36 + 2.0 * 20)]


def test_a_row_shows_the_whole_job_s_progress_and_which_segment():
    events = log(RETRIED)
    running = row(state_of(events), events[-1].at)
    assert (running.step, running.total, running.percent, running.segments) == (12, 30, 40, "segment 2 of 3")
    assert (running.eta or "").startswith("36")
    queued = row(state_of(events[:20]), events[19].at)
    assert (queued.status, queued.step, queued.segments) == ("queued", 10, "segment 2 of 3")
    fresh = row(state_of(events[:3]), T0)
    assert (fresh.step, fresh.total, fresh.segments) == (None, 30, "3 segments")
    html = _templates().from_string('{% from "_row.html" import row %}{{ row(j) }}').render(j=running)
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert 'max="30" value="12"' in html and "12/30 segment 2 of 3 ETA 36" in text


def test_the_job_page_says_the_segment_and_marks_each_one_made():
    events = log(RETRIED)
    state = state_of(events)
    line = timeline(events, events[-1].at)
    attempts = [b for b in line.bars if b.kind == "attempt"]
    assert [(b.percent, b.label.split(" after ")[1].split(" ", 1)[1]) for b in attempts] == [
        (46, "step 14/30 (segment 2 of 3)"),
        (40, "step 12/30 (segment 2 of 3)"),
    ]
    assert [m.label for m in line.marks] == [
        f"planned as {PLAN.describe()}",
        f"segment 1 of 3 made ({PLAN.segments[0].keep} frames)",
    ]
    now = events[-1].at
    page = (
        _templates()
        .get_template("job_body.html")
        .render(
            job=state,
            row=row(state, now),
            params={},
            why=why(state, events, now),
            timeline=line,
            events=event_rows(events),
            video=False,
            deleted_at=None,
            said=None,
            deliveries=[],
            inputs=[],
        )
    )
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "step 12/30 · segment 2 of 3 ·" in text and f"A long video, made as {PLAN.describe()}." in text
    assert "at segment 2 of 3, step 12/30" in text
