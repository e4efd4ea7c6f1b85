"""`Resumed`: an attempt followed again after h3core restarted. Accepted only for the running
attempt and the work its `Running` event named; shown in the replay."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from h3core.domain.events import Admitted, Done, Event, Progress, Resumed, Running, body_from_json
from h3core.domain.state import IllegalEvent, JobState
from h3core.domain.state import extend as extend
from h3core.domain.story import fields
from h3core.domain.story import why as _why
from tests.factories import artifact, submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def running(ref: str | None = "prompt-1"):
    state, _ = extend(None, "j", [submitted(), Admitted(), Running(attempt=1, executor="comfyui", executor_ref=ref)], T0)
    return state


def test_the_running_attempt_is_resumed_on_its_own_work():
    state, _ = extend(
        running(),
        "j",
        [Progress(step=3, total=10), Resumed(attempt=1, executor_ref="prompt-1", after_s=42.5)],
        T0 + timedelta(seconds=60),
    )
    assert state.status == "running" and state.resumed_at == T0 + timedelta(seconds=60) and state.step == 3
    state, _ = extend(state, "j", [Progress(step=4, total=10), Done(artifact=artifact())], T0 + timedelta(seconds=70))
    assert state.status == "done"


@pytest.mark.parametrize(
    ("state", "body", "code"),
    [
        (running(), Resumed(attempt=1, executor_ref="prompt-2", after_s=1), "wrong_ref"),
        (running(ref=None), Resumed(attempt=1, executor_ref="prompt-1", after_s=1), "wrong_ref"),
        (running(), Resumed(attempt=2, executor_ref="prompt-1", after_s=1), "attempt_order"),
        (
            extend(None, "j", [submitted(), Admitted()], T0)[0],
            Resumed(attempt=1, executor_ref="prompt-1", after_s=1),
            "not_running",
        ),
    ],
)
def test_a_resume_of_anything_else_is_refused(state, body, code):
    with pytest.raises(IllegalEvent) as err:
        extend(state, "j", [body], T0)
    assert err.value.code == code


def test_a_job_state_stored_before_resumes_reads_without_one():
    old = running().model_dump(mode="json")
    del old["resumed_at"]
    assert JobState.model_validate_json(json.dumps(old)).resumed_at is None


def test_the_replay_shows_which_work_was_resumed_and_after_how_long():
    body = Resumed(attempt=1, executor_ref="prompt-1", after_s=75.0)
    assert body_from_json(body.model_dump_json()) == body
    assert fields(Event(job_id="j", seq=5, at=T0, body=body)) == "attempt=1  ref=prompt-1  after=1m15s"
    state, events = extend(
        None, "j", [submitted(), Admitted(), Running(attempt=1, executor="comfyui", executor_ref="prompt-1"), body], T0
    )
    why = _why(state, list(events), T0 + timedelta(seconds=5))
    assert "re-attached to prompt-1" in why and "resumed after 1 restart of h3core, unfollowed 1m15s" in why


def test_a_detached_attempt_stays_running_and_is_resumed_from_there():
    from h3core.domain.events import Detached

    state, _ = extend(running(), "j", [Progress(step=2, total=10), Detached(attempt=1, executor_ref="prompt-1")], T0)
    assert state.status == "running" and state.step == 2
    state, _ = extend(state, "j", [Resumed(attempt=1, executor_ref="prompt-1", after_s=3.0), Progress(step=3, total=10)], T0)
    assert state.status == "running" and state.step == 3
    for body, code in (
        (Detached(attempt=1, executor_ref="prompt-2"), "wrong_ref"),
        (Detached(attempt=2, executor_ref="prompt-1"), "attempt_order"),
    ):
        with pytest.raises(IllegalEvent) as err:
            extend(state, "j", [body], T0)
        assert err.value.code == code
    assert fields(Event(job_id="j", seq=9, at=T0, body=Detached(attempt=1, executor_ref="prompt-1"))).startswith(
        "attempt=1  ref=prompt-1"
    )
