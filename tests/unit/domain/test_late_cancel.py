"""A cancel that comes too late: the job ends `done` with its video, and its `Done` says the cancel
came too late; only after a cancel was requested. Attempts that never started (`not_started`) are
retried without counting against the policy. Logs written before either read as they did."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from h3core.domain.events import (
    VERSIONS,
    Admitted,
    AttemptFailed,
    CancelRequested,
    Done,
    Failed,
    Running,
    body_from_json,
)
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import IllegalEvent
from h3core.domain.state import extend as extend
from tests.factories import artifact, submitted

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def running(**kw):
    state, _ = extend(None, "j", [submitted(**kw), Admitted(), Running(attempt=1, executor="comfyui", executor_ref="p1")], T0)
    return state


def test_a_cancel_requested_then_done_ends_done_and_says_the_cancel_came_too_late():
    state, events = extend(running(), "j", [CancelRequested(reason="r"), Done(artifact=artifact(), cancel_too_late=True)], T0)
    assert state.status == "done" and state.artifact == artifact() and state.cancel_requested
    assert events[-1].body.cancel_too_late


def test_a_done_cannot_claim_a_late_cancel_that_was_never_requested():
    with pytest.raises(IllegalEvent) as err:
        extend(running(), "j", [Done(artifact=artifact(), cancel_too_late=True)], T0)
    assert err.value.code == "cancel_not_requested"


def test_attempts_that_never_started_do_not_use_up_the_policy():
    state = running(retry=RetryPolicy(max_attempts=1, retry_on=("executor_lost",)))
    for attempt in (1, 2):
        state, _ = extend(
            state,
            "j",
            [
                AttemptFailed(kind="not_started", message="unreachable", attempt=attempt),
                Running(attempt=attempt + 1, executor="comfyui", executor_ref=f"p{attempt + 1}"),
            ],
            T0,
        )
    assert state.attempt == 3 and state.not_started == 2
    with pytest.raises(IllegalEvent) as err:  # attempt 3 is the first that ran, and the policy allows one
        extend(state, "j", [AttemptFailed(kind="executor_lost", message="m", attempt=3)], T0)
    assert err.value.code == "retry_not_allowed"
    state, _ = extend(state, "j", [Failed(kind="executor_lost", message="m")], T0)
    assert state.status == "failed"


def test_bodies_written_before_version_2_read_as_they_were():
    done = body_from_json(json.dumps({"type": "done", "artifact": artifact().model_dump(mode="json")}))
    assert isinstance(done, Done) and done.v == VERSIONS["done"] and not done.cancel_too_late and done.steps is None
    failed = body_from_json(json.dumps({"v": 1, "type": "failed", "kind": "oom", "message": "m"}))
    assert isinstance(failed, Failed) and failed.v == 2 and failed.kind == "oom"
    retried = body_from_json(json.dumps({"v": 1, "type": "attempt_failed", "kind": "oom", "message": "m", "attempt": 1}))
    assert isinstance(retried, AttemptFailed) and retried.v == 2
