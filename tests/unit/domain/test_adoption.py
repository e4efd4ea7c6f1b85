"""Recovery's verdict on a running attempt's committed video, and the fold's rules for `recovered`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from h3core.domain.adoption import Adopt, Discard, Expected, FoundArtifact, adoption, expected, judge
from h3core.domain.capabilities import Capabilities
from h3core.domain.events import Admitted, AttemptFailed, Done, Event, Failed, Progress, Recovered, Running
from h3core.domain.state import IllegalEvent, JobState
from h3core.domain.state import extend as extend
from tests.factories import artifact, submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)
VIDEO = artifact("j/attempt-1.mp4")


def running(attempt: int = 1) -> JobState:
    bodies = [submitted(), Admitted()]
    for n in range(1, attempt + 1):
        bodies.append(Running(attempt=n, executor="fake"))
        if n < attempt:
            bodies.append(AttemptFailed(kind="interrupted", message="m", attempt=n))
    state, _ = extend(None, "j", bodies, T0)
    return state


def found(**kw) -> FoundArtifact:
    return FoundArtifact(**{"attempt": 1, "recorded": VIDEO, "size": VIDEO.bytes, "sha256": VIDEO.sha256, **kw})


def test_a_video_that_is_byte_for_byte_the_committed_one_is_adopted():
    assert judge(running(), found()) == Adopt(VIDEO)


@pytest.mark.parametrize(
    ("facts", "says"),
    [
        ({"size": None, "sha256": None}, "missing"),
        ({"size": VIDEO.bytes - 1}, f"{VIDEO.bytes - 1} bytes, {VIDEO.bytes} were recorded"),
        ({"sha256": "1" * 64}, "does not match the recorded sha256"),
        ({"attempt": 2}, "attempt 2's, not the running attempt 1's"),
        ({"sha256": None}, "not hashed"),
    ],
)
def test_a_video_that_does_not_check_is_discarded_saying_why(facts, says):
    verdict = judge(running(), found(**facts))
    assert isinstance(verdict, Discard) and says in verdict.reason


def test_nothing_committed_or_nothing_running_is_no_verdict():
    assert judge(running(), None) is None
    queued, _ = extend(None, "j", [submitted(), Admitted()], T0)
    assert judge(queued, found()) is None


def test_a_staged_video_is_expected_with_the_frames_the_executor_makes_of_the_request():
    """What recovery asks of a staged video no commit recorded: the exact frames where the
    executor makes them as asked, else the model's 17n + 5 count; the length at the request's rate."""
    state, _ = extend(None, "j", [submitted(frames=30), Admitted(), Running(attempt=1, executor="x")], T0)
    assert expected(state, Capabilities(executor="x", exact_frames=("t2va",))) == Expected(frames=30, fps=24)
    assert expected(state, Capabilities(executor="x")) == Expected(frames=39, fps=24)
    assert Expected(frames=39, fps=24).duration_s == 39 / 24


@pytest.mark.parametrize(
    ("frames", "seconds", "holds"),
    [(30, 1.25, True), (30, 1.25 + 0.02, True), (30, 1.25 + 0.03, False), (29, 29 / 24, False), (31, 1.25, False)],
)
def test_a_staged_video_holds_what_is_expected_only_with_its_frames_and_length(frames, seconds, holds):
    assert Expected(frames=30, fps=24).holds(frames, seconds) is holds


def test_the_adoption_events_fold_to_done_with_the_video_and_say_it_was_recovered():
    state = running()
    done, events = extend(state, "j", adoption(state, Adopt(VIDEO)), T0)
    assert [e.type for e in events] == ["recovered", "done"]
    assert (done.status, done.artifact, done.recovered, done.attempt) == ("done", VIDEO, VIDEO, 1)


@pytest.mark.parametrize(
    ("after", "code"),
    [
        (Done(artifact=artifact("j/attempt-1.webm")), "recovered_then_done"),
        (Failed(kind="interrupted", message="m"), "recovered_then_done"),
        (Progress(step=1, total=2), "recovered_then_done"),
        (Recovered(attempt=1, artifact=VIDEO), "recovered_then_done"),
    ],
)
def test_only_the_recovered_videos_done_may_follow_recovered(after, code):
    state, _ = extend(running(), "j", [Recovered(attempt=1, artifact=VIDEO)], T0)
    with pytest.raises(IllegalEvent) as exc:
        extend(state, "j", [after], T0)
    assert exc.value.code == code


def test_recovered_is_for_the_running_attempt_only():
    with pytest.raises(IllegalEvent) as exc:
        extend(running(attempt=2), "j", [Recovered(attempt=1, artifact=VIDEO)], T0)
    assert exc.value.code == "attempt_order"
    queued, _ = extend(None, "j", [submitted(), Admitted()], T0)
    with pytest.raises(IllegalEvent) as exc:
        extend(queued, "j", [Recovered(attempt=1, artifact=VIDEO)], T0)
    assert exc.value.code == "not_running"


def test_a_recovered_event_round_trips_through_json():
    e = Event(job_id="j", seq=5, at=T0, body=Recovered(attempt=1, artifact=VIDEO))
    assert Event.model_validate_json(e.model_dump_json()) == e
