"""Properties of the job-state fold, in both directions: `apply` accepts exactly the events an
independent reference model of the rules calls legal, and refuses the others."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from h3core.domain.events import (
    Admitted,
    AttemptFailed,
    Body,
    Cancelled,
    CancelRequested,
    Checkpoint,
    Checkpointed,
    CheckpointRejected,
    Detached,
    Done,
    Event,
    Failed,
    Progress,
    Recovered,
    Released,
    Restored,
    Resumed,
    Running,
    Submitted,
)
from h3core.domain.retry import MAX_NOT_STARTED
from h3core.domain.state import IllegalEvent, apply, fold
from tests.factories import artifact
from tests.profiles import examples
from tests.strategies import bodies_for, kinds, submissions

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Ref:
    """The reference model: the rules restated over a few plain fields, not over `JobState`."""

    submitted: Submitted
    status: str = "submitted"
    attempt: int = 0
    step: int | None = None
    total: int | None = None
    cancel_requested: bool = False
    executor_ref: str | None = None
    recovered: object = None
    not_started: int = 0  # attempts that failed `not_started`: they do not count against the policy
    released: int = 0  # attempts h3core's graceful stops handed back: they do not count either
    checkpoints: tuple[Checkpoint, ...] = ()  # the two newest
    restored_from: int | None = None

    def legal(self, b: Body) -> bool:
        if self.status in ("done", "failed", "cancelled"):
            return False
        if self.recovered is not None:
            return isinstance(b, Done) and b.artifact == self.recovered and (self.cancel_requested or not b.cancel_too_late)
        running = self.status == "running"
        policy = self.submitted.retry
        match b:
            case Admitted():
                return self.status == "submitted"
            case Running():
                return self.status == "queued" and b.attempt == self.attempt + 1
            case Resumed() | Detached():
                return running and b.attempt == self.attempt and b.executor_ref == self.executor_ref
            case Progress():
                return (
                    running
                    and b.step <= b.total
                    and (self.total is None or b.total == self.total)
                    and (self.step is None or b.step > self.step)
                )
            case AttemptFailed():
                if not (running and b.attempt == self.attempt and not self.cancel_requested):
                    return False
                if b.kind == "not_started":  # nothing ran: retried whatever the policy, up to a bound
                    return self.not_started < MAX_NOT_STARTED
                return b.kind in policy.retry_on and b.attempt - self.not_started - self.released < policy.max_attempts
            case Checkpointed():
                c = b.checkpoint
                own = [x.step for x in self.checkpoints if x.attempt == self.attempt]
                floor = max(own) if own else (self.restored_from or 0)
                return (
                    running
                    and c.attempt == self.attempt
                    and c.step <= c.total
                    and (self.total is None or c.total == self.total)
                    and self.step is not None
                    and floor < c.step <= self.step
                )
            case Restored() | CheckpointRejected():
                return running and b.attempt == self.attempt and self.step is None and b.checkpoint in self.checkpoints
            case Released():
                return running and b.attempt == self.attempt and not self.cancel_requested
            case Recovered():
                return running and b.attempt == self.attempt
            case CancelRequested():
                return running and not self.cancel_requested
            case Cancelled():
                return not running or self.cancel_requested
            case Done():
                return running and (self.cancel_requested or not b.cancel_too_late)
            case Failed():
                return True
        return False  # a second Submitted

    def after(self, b: Body) -> Ref:
        """The model once the legal event `b` is applied."""
        match b:
            case Admitted():
                return replace(self, status="queued")
            case Running():
                return replace(
                    self,
                    status="running",
                    attempt=b.attempt,
                    executor_ref=b.executor_ref,
                    step=None,
                    total=None,
                    restored_from=None,
                )
            case Checkpointed():
                return replace(self, checkpoints=(*self.checkpoints, b.checkpoint)[-2:])
            case CheckpointRejected():
                return replace(self, checkpoints=tuple(c for c in self.checkpoints if c != b.checkpoint))
            case Restored():
                c = b.checkpoint
                return replace(self, step=c.step, total=c.total, restored_from=c.step)
            case Released():
                return replace(self, status="queued", step=None, total=None, restored_from=None, released=self.released + 1)
            case Progress():
                return replace(self, step=b.step, total=b.total)
            case AttemptFailed():
                return replace(
                    self, status="queued", step=None, total=None, not_started=self.not_started + (b.kind == "not_started")
                )
            case Recovered():
                return replace(self, recovered=b.artifact)
            case CancelRequested():
                return replace(self, cancel_requested=True)
            case Done() | Failed() | Cancelled():
                return replace(self, status=b.type)
        return self  # Resumed and Detached change nothing the rules look at


def check_log(log: list[Event]) -> None:
    """A whole accepted log, checked against the reference model event by event."""
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert isinstance(log[0].body, Submitted)
    ref = Ref(log[0].body)
    for e in log[1:]:
        assert ref.legal(e.body), f"accepted, but the rules forbid #{e.seq} {e.body.type} in {ref}"
        ref = ref.after(e.body)
    assert sum(e.terminal for e in log) <= 1 and (not any(e.terminal for e in log) or log[-1].terminal)


def legal_bodies(ref: Ref) -> st.SearchStrategy[Body]:
    """Events built from the reference model's state to be legal there (weighted towards the
    ones that move the job along), filtered by the model as a safety net: a rule `apply`
    enforces that the model does not shows up as a refusal."""
    ending = [st.builds(Failed, kind=kinds, message=st.just("m")), st.builds(Cancelled)]
    if ref.status == "submitted":
        likely = [st.builds(Admitted)] * 6 + ending
    elif ref.status == "queued":
        runs = st.builds(
            Running, attempt=st.just(ref.attempt + 1), executor=st.just("x"), executor_ref=st.sampled_from([None, "r"])
        )
        likely = [runs] * 6 + ending
    elif ref.recovered is not None:
        likely = [st.just(Done(artifact=ref.recovered))]
    else:
        step = 0 if ref.step is None else ref.step + 1
        total = ref.total if ref.total is not None else step + 4
        likely = [
            st.builds(Done, artifact=st.just(artifact()), cancel_too_late=st.just(ref.cancel_requested)),
            ending[0],
            st.builds(Recovered, attempt=st.just(ref.attempt), artifact=st.just(artifact())),
        ]
        if step <= total:
            likely += [st.builds(Progress, step=st.integers(step, total), total=st.just(total))] * 6
        if ref.executor_ref is not None:
            likely.append(st.just(Resumed(attempt=ref.attempt, executor_ref=ref.executor_ref, after_s=1.0)))
            likely.append(st.just(Detached(attempt=ref.attempt, executor_ref=ref.executor_ref)))
        policy = ref.submitted.retry
        if not ref.cancel_requested and policy.retry_on and ref.attempt - ref.not_started - ref.released < policy.max_attempts:
            failing = st.builds(
                AttemptFailed, kind=st.sampled_from(policy.retry_on), message=st.just("m"), attempt=st.just(ref.attempt)
            )
            likely += [failing] * 2
        if ref.step is not None:
            own = [x.step for x in ref.checkpoints if x.attempt == ref.attempt]
            floor = max(own) if own else (ref.restored_from or 0)
            if floor < ref.step:
                likely += [
                    st.builds(
                        Checkpointed,
                        checkpoint=st.builds(
                            Checkpoint,
                            attempt=st.just(ref.attempt),
                            step=st.integers(floor + 1, ref.step),
                            total=st.just(total),
                            path=st.just(f"c/{ref.attempt}"),
                            bytes=st.just(1),
                            sha256=st.just("a" * 64),
                        ),
                    )
                ] * 2
        elif ref.checkpoints:
            known = st.sampled_from(ref.checkpoints)
            likely.append(st.builds(Restored, attempt=st.just(ref.attempt), checkpoint=known))
            likely.append(st.builds(CheckpointRejected, attempt=st.just(ref.attempt), checkpoint=known, reason=st.just("r")))
        if not ref.cancel_requested:
            likely.append(st.builds(Released, attempt=st.just(ref.attempt), reason=st.just("shutdown")))
        if not ref.cancel_requested and ref.not_started < MAX_NOT_STARTED:
            likely.append(st.just(AttemptFailed(kind="not_started", message="m", attempt=ref.attempt)))
        likely.append(st.builds(Cancelled) if ref.cancel_requested else st.builds(CancelRequested))
    return st.sampled_from(likely).flatmap(lambda s: s).filter(ref.legal)


@settings(max_examples=examples(60))
@given(st.data())
def test_apply_accepts_exactly_what_the_reference_model_calls_legal(data):
    """Whatever is offered (mostly the likely next events, often illegal ones): `apply` accepts
    it if and only if the reference model says the rules allow it."""
    first = data.draw(submissions)
    state = apply(None, Event(job_id="j", seq=1, at=T0, body=first))
    ref, log = Ref(first), [Event(job_id="j", seq=1, at=T0, body=first)]
    for i in range(data.draw(st.integers(10, 40))):
        body = data.draw(bodies_for(state))
        event = Event(job_id="j", seq=state.last_seq + 1, at=T0 + timedelta(seconds=i), body=body)
        try:
            new = apply(state, event)
        except IllegalEvent as exc:
            assert not ref.legal(body), f"refused ({exc.code}) a legal {body.type} in {ref}"
            assert exc.code and exc.seq == event.seq
            continue  # rejected: the state is untouched
        assert ref.legal(body), f"accepted an illegal {body.type} in {ref}"
        state, ref = new, ref.after(body)
        log.append(event)
    check_log(log)
    assert fold(log) == state
    assert state.last_seq == len(log)
    assert state.terminal == log[-1].terminal


@settings(max_examples=examples(60))
@given(st.data())
def test_every_legal_event_is_accepted(data):
    """Events generated only from what the model allows, until the job ends: none is refused."""
    first = data.draw(submissions)
    ref, state = Ref(first), apply(None, Event(job_id="j", seq=1, at=T0, body=first))
    for _ in range(60):
        if state.terminal:
            break
        body = data.draw(legal_bodies(ref))
        try:
            state = apply(state, Event(job_id="j", seq=state.last_seq + 1, at=T0, body=body))
        except IllegalEvent as exc:
            raise AssertionError(f"refused a legal {body.type} in {ref}: {exc}") from exc
        ref = ref.after(body)
        assert state.status == ref.status and state.attempt == ref.attempt and state.cancel_requested == ref.cancel_requested


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
