"""Properties of the job-state fold: whatever is thrown at it, what it accepts is a valid log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from h3core.domain.events import Event
from h3core.domain.state import IllegalEvent, JobState, apply, fold
from tests.strategies import bodies_for, submissions

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def check_log(log: list[Event]) -> None:
    """An independent statement of the rules, written over a whole log rather than per event."""
    types = [e.type for e in log]
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert types[0] == "submitted" and types.count("submitted") == 1
    terminal = [i for i, t in enumerate(types) if t in ("done", "failed", "cancelled")]
    assert len(terminal) <= 1
    if terminal:
        assert terminal[0] == len(log) - 1, "nothing follows the terminal event"
    if "running" in types:
        assert types.index("admitted") < types.index("running")
    assert types.count("admitted") <= 1
    policy = log[0].body.retry
    attempt, last_step, total, cancel_requested, status, ref = 0, None, None, False, "submitted", None
    recovered = None
    for e in log[1:]:
        b = e.body
        if recovered is not None:
            assert b.type == "done" and b.artifact == recovered, "only the recovered video's done follows 'recovered'"
        if b.type == "admitted":
            status = "queued"
        elif b.type == "running":
            assert status == "queued"
            assert b.attempt == attempt + 1
            attempt, last_step, total, status, ref = b.attempt, None, None, "running", b.executor_ref
        elif b.type == "resumed":
            assert status == "running" and b.attempt == attempt and b.executor_ref == ref
        elif b.type == "progress":
            assert status == "running"
            assert b.step <= b.total
            assert last_step is None or b.step > last_step
            assert total is None or b.total == total
            last_step, total = b.step, b.total
        elif b.type == "attempt_failed":
            assert status == "running" and b.attempt == attempt and not cancel_requested
            assert b.kind in policy.retry_on and b.attempt < policy.max_attempts
            status = "queued"
        elif b.type == "cancel_requested":
            assert status == "running" and not cancel_requested
            cancel_requested = True
        elif b.type == "cancelled":
            assert status != "running" or cancel_requested
        elif b.type == "recovered":
            assert status == "running" and b.attempt == attempt and recovered is None
            recovered = b.artifact
        elif b.type == "done":
            assert status == "running"


@settings(max_examples=200, deadline=None)  # no timed assertion: it flaked on a shared 2-core box
@given(st.data())
def test_whatever_is_offered_the_accepted_log_is_valid(data):
    state: JobState | None = None
    log: list[Event] = []
    for i in range(data.draw(st.integers(10, 40))):
        body = data.draw(bodies_for(state))
        seq = (state.last_seq if state else 0) + 1
        event = Event(job_id="j", seq=seq, at=T0 + timedelta(seconds=i), body=body)
        try:
            new = apply(state, event)
        except IllegalEvent as exc:
            assert exc.code and exc.seq == seq
            continue  # rejected: the state is untouched
        state = new
        log.append(event)
    if log:
        check_log(log)
        assert fold(log) == state
        assert state.last_seq == len(log)
        assert state.terminal == log[-1].terminal


@given(st.data())
def test_nothing_is_accepted_after_a_terminal_event(data):
    state, log = None, []
    for _i in range(60):
        body = data.draw(bodies_for(state))
        event = Event(job_id="j", seq=len(log) + 1, at=T0, body=body)
        try:
            state = apply(state, event)
            log.append(event)
        except IllegalEvent:
            pass
        if state is not None and state.terminal:
            break
    if state is not None and state.terminal:
        for _ in range(5):
            body = data.draw(bodies_for(state))
            try:
                apply(state, Event(job_id="j", seq=state.last_seq + 1, at=T0, body=body))
            except IllegalEvent as exc:
                assert exc.code == "after_terminal"
            else:
                raise AssertionError("an event was accepted after the terminal one")


@given(st.data(), st.integers(min_value=-3, max_value=3).filter(lambda d: d != 1))
def test_seq_must_follow_on(data, delta):
    state = apply(None, Event(job_id="j", seq=1, at=T0, body=data.draw(submissions)))
    body = data.draw(bodies_for(state))
    try:
        apply(state, Event(job_id="j", seq=max(1, state.last_seq + delta), at=T0, body=body))
    except IllegalEvent as exc:
        assert exc.code in ("seq_gap", "duplicate_submitted")
    else:
        raise AssertionError("an event out of sequence was accepted")
