"""A segmented job's log (issue 42): `planned` comes with `admitted`, once, for the frames asked;
each segment is done once and in order while running, its end starts the next one's steps and
checkpoints afresh, a retry keeps the segments done, and the job is `done` only once every segment
is."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from h3core.domain.events import (
    Admitted,
    Artifact,
    AttemptFailed,
    Checkpoint,
    Checkpointed,
    Done,
    Planned,
    Progress,
    Running,
    SegmentDone,
)
from h3core.domain.retry import RetryPolicy
from h3core.domain.segments import plan_segments
from h3core.domain.state import IllegalEvent, extend
from tests.factories import artifact, submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PLAN = plan_segments(100, 40)  # three segments


def segment(i: int) -> Artifact:
    return Artifact(path=f"j/segment-{i}.mp4", bytes=10, sha256=f"{i + 1:x}" * 64, frames=PLAN.segments[i].keep, duration_s=1.0)


def running(plan=PLAN):
    retry = RetryPolicy(max_attempts=3, retry_on=("executor_lost",))
    planned = [Planned(plan=plan)] if plan is not None else []
    bodies = [submitted(frames=100, retry=retry), Admitted(tokens=10), *planned, Running(attempt=1, executor="fake")]
    return extend(None, "j", bodies, T0)[0]


def test_segments_are_done_in_order_each_starting_its_steps_afresh_and_the_job_is_done_after_the_last():
    state = running()
    assert state.plan == PLAN and state.segment == 0 and state.segments == ()
    cp = Checkpoint(attempt=1, step=2, total=4, path="j/c.ckpt", bytes=1, sha256="e" * 64)
    state, _ = extend(state, "j", [Progress(step=2, total=4), Checkpointed(checkpoint=cp), Progress(step=4, total=4)], T0)
    state, _ = extend(state, "j", [SegmentDone(index=0, artifact=segment(0))], T0)
    assert (state.segment, state.step, state.total, state.checkpoints) == (1, None, None, ())  # the next one's own
    state, _ = extend(state, "j", [Progress(step=1, total=6)], T0)  # steps from 1 again, even another total
    state, _ = extend(state, "j", [SegmentDone(index=1, artifact=segment(1)), SegmentDone(index=2, artifact=segment(2))], T0)
    assert state.segments == (segment(0), segment(1), segment(2)) and state.segment is None
    state, _ = extend(state, "j", [Done(artifact=artifact())], T0)
    assert state.status == "done"


@pytest.mark.parametrize(
    ("bodies", "code"),
    [
        ([SegmentDone(index=1, artifact=segment(1))], "segment_order"),  # skipping one
        ([SegmentDone(index=0, artifact=segment(0)), SegmentDone(index=0, artifact=segment(0))], "segment_order"),  # twice
        ([SegmentDone(index=0, artifact=segment(0)), Done(artifact=artifact())], "segments_left"),  # done too soon
    ],
    ids=["skipped", "twice", "done-too-soon"],
)
def test_a_segment_out_of_order_or_a_done_with_segments_left_is_refused(bodies, code):
    with pytest.raises(IllegalEvent) as refused:
        extend(running(), "j", bodies, T0)
    assert refused.value.code == code


def test_a_segment_only_while_running_and_only_of_a_planned_job():
    queued = extend(None, "j", [submitted(frames=100), Admitted(), Planned(plan=PLAN)], T0)[0]
    with pytest.raises(IllegalEvent) as refused:
        extend(queued, "j", [SegmentDone(index=0, artifact=segment(0))], T0)
    assert refused.value.code == "not_running"
    with pytest.raises(IllegalEvent) as refused:
        extend(running(plan=None), "j", [SegmentDone(index=0, artifact=segment(0))], T0)
    assert refused.value.code == "not_segmented"


def test_a_retry_keeps_the_segments_done_and_goes_on_from_the_next():
    state, _ = extend(running(), "j", [SegmentDone(index=0, artifact=segment(0))], T0)
    state, _ = extend(state, "j", [AttemptFailed(attempt=1, kind="executor_lost", message="gone")], T0)
    state, _ = extend(state, "j", [Running(attempt=2, executor="fake")], T0)
    assert state.segments == (segment(0),) and state.segment == 1
    with pytest.raises(IllegalEvent):
        extend(state, "j", [SegmentDone(index=0, artifact=segment(0))], T0)  # not made again


@pytest.mark.parametrize(
    ("before", "plan", "code"),
    [
        ([], PLAN, "not_just_admitted"),
        ([Admitted(), Planned(plan=PLAN)], PLAN, "not_just_admitted"),
        ([Admitted(), Running(attempt=1, executor="fake")], PLAN, "not_just_admitted"),
        ([Admitted()], plan_segments(99, 40), "plan_frames"),
    ],
    ids=["before-admitted", "twice", "after-running", "other-frames"],
)
def test_a_plan_only_with_admission_once_and_for_the_frames_asked(before, plan, code):
    state = extend(None, "j", [submitted(frames=100), *before], T0)[0]
    with pytest.raises(IllegalEvent) as refused:
        extend(state, "j", [Planned(plan=plan)], T0)
    assert refused.value.code == code
