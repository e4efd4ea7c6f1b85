"""A long video's progress is the whole job's (issue 42): a job of 3 segments of 10 steps counts
1..30, never back to 1 as each segment's steps start again; a retry keeps what was made, and the
attempt's own steps (what its pace is measured over) leave out what earlier attempts made and the
checkpoint it continued from. A job made in one call counts as it always did."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from h3core.domain.events import (
    Admitted,
    AttemptFailed,
    Checkpoint,
    Checkpointed,
    Done,
    Event,
    Planned,
    Progress,
    Restored,
    Running,
    SegmentDone,
)
from h3core.domain.retry import RetryPolicy
from h3core.domain.segments import plan_segments, steps_done
from h3core.domain.state import JobState, extend, fold
from h3core.domain.story import progress, tries, why
from tests.factories import artifact, segment_file, submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PLAN = plan_segments(100, 40)  # three segments
RETRY = RetryPolicy(max_attempts=3, retry_on=("executor_lost",))


def queued(plan=PLAN) -> JobState:
    planned = [Planned(plan=plan)] if plan is not None else []
    return extend(None, "j", [submitted(frames=100, steps=10, retry=RETRY), Admitted(), *planned], T0)[0]


def then(state: JobState, *bodies) -> JobState:
    return extend(state, "j", bodies, T0)[0]


def made(index: int) -> SegmentDone:
    return SegmentDone(index=index, artifact=segment_file(PLAN, index))


def steps(first: int, last: int, total: int = 10) -> list[Progress]:
    return [Progress(step=i, total=total) for i in range(first, last + 1)]


def test_a_segmented_job_counts_the_steps_of_every_segment_through_a_retry_to_its_end():
    state = queued()
    assert (state.steps_done, state.steps_total, state.attempt_steps) == (None, 30, 0)
    state = then(state, Running(attempt=1, executor="fake"))
    assert (state.steps_done, state.steps_before_attempt, progress(state)) == (None, 0, None)  # before its first step
    state = then(state, *steps(1, 10))
    assert (state.steps_done, progress(state)) == (10, "segment 1 of 3, step 10/30")
    state = then(state, made(0))
    assert (state.step, state.steps_done, progress(state)) == (None, 10, "segment 2 of 3, step 10/30")  # not back to 0
    state = then(state, *steps(1, 4))
    assert (state.steps_done, state.attempt_steps, progress(state)) == (14, 14, "segment 2 of 3, step 14/30")
    state = then(state, AttemptFailed(attempt=1, kind="executor_lost", message="gone"))
    assert (state.steps_done, state.attempt_steps, state.steps_before_attempt) == (10, 0, 0)  # segment 1 is kept
    state = then(state, Running(attempt=2, executor="fake"))
    assert (state.steps_done, state.steps_before_attempt, state.attempt_steps) == (10, 10, 0)  # made by attempt 1
    state = then(state, *steps(1, 10), made(1), *steps(1, 3))
    assert (state.steps_done, state.attempt_steps, progress(state)) == (23, 13, "segment 3 of 3, step 23/30")
    state = then(state, *steps(4, 10), made(2))
    assert (state.steps_done, progress(state)) == (30, "all 3 segments made, step 30/30")  # joining them
    state = then(state, Done(artifact=artifact()))
    assert (state.steps_done, state.steps_total, state.attempt_steps, state.steps_before_attempt) == (30, 30, 0, 0)


def test_a_job_in_one_call_counts_its_step_and_total_as_reported():
    state = then(queued(plan=None), Running(attempt=1, executor="fake"))
    assert (state.steps_done, state.steps_total, progress(state)) == (None, 10, None)
    state = then(state, *steps(1, 4, total=12))  # the executor's total, where it reports one
    assert (state.steps_done, state.steps_total, state.attempt_steps, progress(state)) == (4, 12, 4, "step 4/12")
    state = then(state, *steps(5, 12, total=12), Done(artifact=artifact()))
    assert (state.steps_done, state.steps_total, state.attempt_steps) == (12, 12, 0)


@pytest.mark.parametrize("plan", [PLAN, None], ids=["segmented", "one-call"])
def test_an_attempt_that_continues_from_a_checkpoint_did_not_compute_its_steps(plan):
    first = [*steps(1, 10), made(0)] if plan is not None else []
    cp = Checkpoint(attempt=1, step=4, total=10, path="j/c.ckpt", bytes=1, sha256="e" * 64)
    state = then(queued(plan), Running(attempt=1, executor="fake"), *first, *steps(1, 5), Checkpointed(checkpoint=cp))
    state = then(state, AttemptFailed(attempt=1, kind="executor_lost", message="gone"), Running(attempt=2, executor="fake"))
    state = then(state, Restored(attempt=2, checkpoint=cp))
    before = 14 if plan is not None else 4
    assert (state.steps_done, state.steps_before_attempt, state.attempt_steps) == (before, before, 0)
    state = then(state, *steps(5, 6))
    assert (state.steps_done, state.attempt_steps) == (before + 2, 2)


def test_a_segment_counted_otherwise_by_its_executor_is_scaled_to_the_request_s_steps():
    assert steps_done(10, 1, 6, 12) == 15 and steps_done(10, 1, 12, 12) == 20  # never past a segment's share
    assert steps_done(10, 0, None, None) is None and steps_done(10, 2, None, None) == 20


def _log(bodies) -> list[Event]:
    return [Event(job_id="j", seq=i, at=T0 + timedelta(seconds=i), body=b) for i, b in enumerate(bodies, 1)]


def test_the_story_tells_each_attempt_s_progress_over_the_whole_job():
    events = _log(
        [
            submitted(frames=100, steps=10, retry=RETRY),
            Admitted(),
            Planned(plan=PLAN),
            Running(attempt=1, executor="fake"),
            *steps(1, 10),
            made(0),
            *steps(1, 4),
            AttemptFailed(attempt=1, kind="executor_lost", message="gone"),
            Running(attempt=2, executor="fake"),
            *steps(1, 2),
        ]
    )
    first, second = tries(events)
    assert first.where == "after step 14/30 (segment 2 of 3)"
    assert (second.steps_done, second.steps_total, second.where) == (12, 30, "after step 12/30 (segment 2 of 3)")
    state = fold(events)
    assert state is not None
    told = why(state, events, events[-1].at)
    assert "at segment 2 of 3, step 12/30" in told and "attempt 1 failed executor_lost after step 14/30 (segment 2 of 3)" in told
