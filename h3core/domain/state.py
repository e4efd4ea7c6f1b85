"""A job's state is a fold of its events; `apply` is the only way a state changes.

The rules that make a job impossible to lose or leave stuck live here, in one pure function:
one `Submitted`, first; `Running` only from queued; `Detached` and `Resumed` only for the running
attempt and the work its `Running` named; `Progress` only while running, monotone,
within its total; exactly one terminal event and nothing after it; a retry only where the job's
own retry policy allows it (an attempt that never started, or that h3core's own graceful stop
handed back with `Released`, does not count); a `Done` that says the cancel came too late only
after one was requested; after `Recovered`, only the `Done` of the video it names. A video longer
than the model's window is `Planned` as segments as it is admitted, once; its segments are done
(`SegmentDone`) while running, each once and in the plan's order, kept through retries, and it is
`Done` only once every one is; a segment's end starts the next one's steps and checkpoints afresh
(`JobState.steps_done` and `steps_total` count the whole job's).
A checkpoint only of a step the running attempt reached, past its previous one; an attempt continues
(`Restored`) only from a checkpoint the log holds, before its first step. Anything else raises
`IllegalEvent` and never reaches a store.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from h3core.domain.events import (
    Admitted,
    Artifact,
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
    Planned,
    Progress,
    Recovered,
    Released,
    Reprioritized,
    Restored,
    Resumed,
    Running,
    SegmentDone,
    Submitted,
)
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.domain.segments import SegmentPlan, steps_done
from h3core.domain.webhooks import WebhookTarget

Status = Literal["submitted", "queued", "running", "done", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"done", "failed", "cancelled"})
# The checkpoints a job keeps: the newest, and the one before it in case the newest is unusable.
CHECKPOINTS_KEPT = 2


class IllegalEvent(ValueError):
    """An event the job's rules forbid. `code` is stable, for callers and tests to match on."""

    def __init__(self, code: str, message: str, *, job_id: str, seq: int) -> None:
        super().__init__(f"job {job_id} event #{seq}: {message}")
        self.code = code
        self.job_id = job_id
        self.seq = seq


class Error(BaseModel):
    """A failure as the job's state keeps it: its kind, message and detail, and the job's attempt
    number when it came (None: before any attempt)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    message: str
    detail: str | None = None
    attempt: int | None = None


class JobState(BaseModel):
    """A job as its log folds to (`apply`): its request, status, attempts and outcome so far."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    status: Status
    last_seq: int
    request: GenerationRequest
    priority: int = 0
    retry: RetryPolicy = RetryPolicy()
    warnings: tuple[str, ...] = ()
    idempotency_key: str | None = None
    remixed_from: str | None = None
    retry_of: str | None = None  # the ended job this one runs again
    submitted_by: str | None = None  # the API token's name it came with
    webhook: WebhookTarget | None = None  # where its events are sent (POST /v1/jobs `webhook`)
    created_at: datetime
    updated_at: datetime
    admitted_at: datetime | None = None
    started_at: datetime | None = None  # first attempt's start
    attempt_started_at: datetime | None = None
    resumed_at: datetime | None = None  # the current attempt's last re-attach after a restart
    finished_at: datetime | None = None
    attempt: int = 0  # attempts started so far
    executor: str | None = None
    executor_ref: str | None = None
    info: dict[str, str] = {}
    step: int | None = None  # progress of the current attempt
    total: int | None = None
    cancel_requested: bool = False
    tokens: int | None = None
    error: Error | None = None  # the terminal failure
    attempt_errors: tuple[Error, ...] = ()  # failures that were retried
    artifact: Artifact | None = None
    recovered: Artifact | None = None  # the running attempt's video, found committed after a crash
    checkpoints: tuple[Checkpoint, ...] = ()  # the newest last, at most CHECKPOINTS_KEPT
    restored_from: int | None = None  # the step the current attempt continued from
    released: int = 0  # attempts h3core's own graceful stops handed back (not failures)
    plan: SegmentPlan | None = None  # the segments of a video longer than the model's window
    segments: tuple[Artifact, ...] = ()  # the plan's segments done so far, in order: kept through retries
    # While an attempt runs: the whole job's steps done before it computed any (the segments earlier
    # attempts made, the checkpoint it continued from), which its pace leaves out; 0 when none runs.
    steps_before_attempt: int = 0

    @property
    def terminal(self) -> bool:
        """Whether the job has ended (`done`, `failed` or `cancelled`)."""
        return self.status in TERMINAL

    @property
    def not_started(self) -> int:
        """Attempts whose work never started (`not_started`): they do not count against the policy."""
        return sum(e.kind == "not_started" for e in self.attempt_errors)

    @property
    def spent(self) -> int:
        """Attempts that count against the retry policy: those that started and did not end
        handed back by h3core's own graceful stop."""
        return self.attempt - self.not_started - self.released

    def allows_retry(self, kind: str) -> bool:
        """Whether the running attempt, failing with `kind`, earns another under the job's policy."""
        return self.retry.allows_retry(kind, self.attempt, not_started=self.not_started, released=self.released)

    @property
    def segment(self) -> int | None:
        """The plan's segment an attempt makes now or next (None: not segmented, or every one done)."""
        if self.plan is None or len(self.segments) >= len(self.plan.segments):
            return None
        return len(self.segments)

    @property
    def steps_done(self) -> int | None:
        """The whole job's denoising steps done so far (None: none yet). Not segmented: the running
        attempt's `step`; segmented: every segment made, `request.steps` each, and the steps of the
        one being made, so a job of 3 segments of 50 steps counts 1..150, never back to 1."""
        if self.plan is None:
            return self.step
        return steps_done(self.request.steps, len(self.segments), self.step, self.total)

    @property
    def steps_total(self) -> int:
        """The whole job's denoising steps: the attempt's reported `total` (else the request's
        `steps`), or for a segmented job `request.steps` times its segments."""
        if self.plan is None:
            return self.total or self.request.steps
        return len(self.plan.segments) * self.request.steps

    @property
    def attempt_steps(self) -> int:
        """The steps the running attempt computed itself (its pace is measured over these); 0 when
        none runs."""
        if self.status != "running":
            return 0
        return max((self.steps_done or 0) - self.steps_before_attempt, 0)

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint a next attempt would continue from (None: from step 0)."""
        return self.checkpoints[-1] if self.checkpoints else None


def _illegal(event: Event, code: str, message: str) -> IllegalEvent:
    return IllegalEvent(code, message, job_id=event.job_id, seq=event.seq)


def apply(state: JobState | None, event: Event) -> JobState:
    """The state after `event`, or `IllegalEvent` if the rules forbid it. Pure."""
    body = event.body
    if state is None:
        if event.seq != 1:
            raise _illegal(event, "seq_gap", f"a job's log starts at seq 1, not {event.seq}")
        if not isinstance(body, Submitted):
            raise _illegal(event, "not_submitted_first", f"a job's first event must be 'submitted', not '{body.type}'")
        return JobState(
            job_id=event.job_id,
            status="submitted",
            last_seq=1,
            request=body.request,
            priority=body.priority,
            retry=body.retry,
            warnings=body.warnings,
            idempotency_key=body.idempotency_key,
            remixed_from=body.remixed_from,
            retry_of=body.retry_of,
            submitted_by=body.by,
            webhook=body.webhook,
            created_at=event.at,
            updated_at=event.at,
        )

    if event.job_id != state.job_id:
        raise _illegal(event, "wrong_job", f"event belongs to job {event.job_id}, state to {state.job_id}")
    if event.seq != state.last_seq + 1:
        raise _illegal(event, "seq_gap", f"expected seq {state.last_seq + 1}, got {event.seq}")
    if state.terminal:
        raise _illegal(event, "after_terminal", f"job already ended '{state.status}'; '{body.type}' cannot follow")

    if state.recovered is not None and not (isinstance(body, Done) and body.artifact == state.recovered):
        raise _illegal(
            event, "recovered_then_done", f"only 'done' with the recovered video follows 'recovered', not '{body.type}'"
        )

    common = {"last_seq": event.seq, "updated_at": event.at}
    match body:
        case Submitted():
            raise _illegal(event, "duplicate_submitted", "a job is submitted once")
        case Admitted():
            if state.status != "submitted":
                raise _illegal(event, "not_submitted", f"'admitted' only follows 'submitted', job is '{state.status}'")
            return state.model_copy(update={**common, "status": "queued", "admitted_at": event.at, "tokens": body.tokens})
        case Planned():
            if state.status != "queued" or state.attempt or state.plan is not None:
                raise _illegal(event, "not_just_admitted", "'planned' only with 'admitted', before any attempt, once")
            if body.plan.frames != state.request.frames:
                asked = state.request.frames
                raise _illegal(event, "plan_frames", f"a plan of {body.plan.frames} frames for a request of {asked}")
            return state.model_copy(update={**common, "plan": body.plan})
        case Running():
            if state.status != "queued":
                raise _illegal(event, "not_queued", f"'running' only from queued, job is '{state.status}'")
            if body.attempt != state.attempt + 1:
                raise _illegal(event, "attempt_order", f"attempt {body.attempt} cannot follow attempt {state.attempt}")
            started = state.model_copy(
                update={
                    **common,
                    "status": "running",
                    "attempt": body.attempt,
                    "executor": body.executor,
                    "executor_ref": body.executor_ref,
                    "info": dict(body.info),
                    "started_at": state.started_at or event.at,
                    "attempt_started_at": event.at,
                    "resumed_at": None,
                    "step": None,
                    "total": None,
                    "restored_from": None,
                }
            )
            return started.model_copy(update={"steps_before_attempt": started.steps_done or 0})
        case Resumed() | Detached():
            if state.status != "running":
                raise _illegal(event, "not_running", f"'{body.type}' only while running, job is '{state.status}'")
            if body.attempt != state.attempt:
                raise _illegal(event, "attempt_order", f"attempt {body.attempt} is not the running one ({state.attempt})")
            if body.executor_ref != state.executor_ref:
                verb = "resumes" if isinstance(body, Resumed) else "detaches"
                raise _illegal(
                    event, "wrong_ref", f"{verb} {body.executor_ref!r}, but attempt {state.attempt} runs {state.executor_ref!r}"
                )
            if isinstance(body, Resumed):
                return state.model_copy(update={**common, "resumed_at": event.at})
            return state.model_copy(update=common)
        case Progress():
            if state.status != "running":
                raise _illegal(event, "not_running", f"'progress' only while running, job is '{state.status}'")
            if body.step > body.total:
                raise _illegal(event, "step_over_total", f"step {body.step} exceeds total {body.total}")
            if state.total is not None and body.total != state.total:
                raise _illegal(event, "total_changed", f"total changed from {state.total} to {body.total}")
            if state.step is not None and body.step <= state.step:
                raise _illegal(event, "step_not_monotone", f"step {body.step} does not advance past {state.step}")
            return state.model_copy(update={**common, "step": body.step, "total": body.total})
        case SegmentDone():
            if state.status != "running":
                raise _illegal(event, "not_running", f"'segment_done' only while running, job is '{state.status}'")
            if state.plan is None:
                raise _illegal(event, "not_segmented", "'segment_done' only for a job planned as segments")
            if body.index != state.segment:
                raise _illegal(event, "segment_order", f"segment {body.index} is not the next one ({state.segment})")
            return state.model_copy(
                update={
                    **common,
                    "segments": (*state.segments, body.artifact),
                    # The next segment's steps and checkpoints are its own.
                    "step": None,
                    "total": None,
                    "checkpoints": (),
                    "restored_from": None,
                }
            )
        case Done():
            if state.status != "running":
                raise _illegal(event, "not_running", f"'done' only while running, job is '{state.status}'")
            if state.plan is not None and state.segment is not None:
                left = len(state.plan.segments) - state.segment
                raise _illegal(event, "segments_left", f"'done' with {left} segment(s) of the plan not made")
            if body.cancel_too_late and not state.cancel_requested:
                raise _illegal(event, "cancel_not_requested", "'done' says a cancel came too late, but none was requested")
            return state.model_copy(
                update={
                    **common,
                    "status": "done",
                    "finished_at": event.at,
                    "artifact": body.artifact,
                    "steps_before_attempt": 0,
                    "tokens": body.tokens if body.tokens is not None else state.tokens,
                }
            )
        case AttemptFailed():
            if state.status != "running":
                raise _illegal(event, "not_running", f"'attempt_failed' only while running, job is '{state.status}'")
            if body.attempt != state.attempt:
                raise _illegal(event, "attempt_order", f"attempt {body.attempt} is not the running one ({state.attempt})")
            if state.cancel_requested:
                raise _illegal(event, "retry_after_cancel", "a job whose cancel was requested is not retried")
            if not state.allows_retry(body.kind):
                raise _illegal(
                    event,
                    "retry_not_allowed",
                    f"retry policy (max {state.retry.max_attempts} attempts, on {list(state.retry.retry_on)}) "
                    f"does not retry '{body.kind}' after attempt {body.attempt}",
                )
            err = Error(kind=body.kind, message=body.message, detail=body.detail, attempt=body.attempt)
            return state.model_copy(
                update={
                    **common,
                    "status": "queued",
                    "attempt_errors": (*state.attempt_errors, err),
                    "step": None,
                    "total": None,
                    "steps_before_attempt": 0,
                }
            )
        case Failed():
            err = Error(kind=body.kind, message=body.message, detail=body.detail, attempt=state.attempt or None)
            return state.model_copy(
                update={
                    **common,
                    "status": "failed",
                    "finished_at": event.at,
                    "error": err,
                    "steps_before_attempt": 0,
                    "tokens": body.tokens if body.tokens is not None else state.tokens,
                }
            )
        case Recovered():
            if state.status != "running":
                raise _illegal(event, "not_running", f"'recovered' only while running, job is '{state.status}'")
            if body.attempt != state.attempt:
                raise _illegal(event, "attempt_order", f"attempt {body.attempt} is not the running one ({state.attempt})")
            return state.model_copy(update={**common, "recovered": body.artifact})
        case Checkpointed() | Restored() | CheckpointRejected() | Released():
            return _attempt_event(state, event, common)
        case CancelRequested():
            if state.status != "running":
                raise _illegal(
                    event,
                    "not_running",
                    f"'cancel_requested' only while running (queued jobs cancel at once), job is '{state.status}'",
                )
            if state.cancel_requested:
                raise _illegal(event, "duplicate_cancel", "cancel already requested")
            return state.model_copy(update={**common, "cancel_requested": True})
        case Reprioritized():
            if state.status not in ("submitted", "queued"):
                raise _illegal(event, "not_queued", f"'reprioritized' only while queued, job is '{state.status}'")
            return state.model_copy(update={**common, "priority": body.priority})
        case Cancelled():
            if state.status == "running" and not state.cancel_requested:
                raise _illegal(event, "cancel_not_requested", "a running job is cancelled only after 'cancel_requested'")
            return state.model_copy(update={**common, "status": "cancelled", "finished_at": event.at, "steps_before_attempt": 0})
    raise _illegal(event, "unknown_event", f"unknown event type {body.type!r}")  # pragma: no cover


def _attempt_event(state: JobState, event: Event, common: dict) -> JobState:
    """The rules of the running attempt's checkpoints and of its release (the module docstring)."""
    body = event.body
    assert isinstance(body, Checkpointed | Restored | CheckpointRejected | Released)
    if state.status != "running":
        raise _illegal(event, "not_running", f"'{body.type}' only while running, job is '{state.status}'")
    attempt = body.checkpoint.attempt if isinstance(body, Checkpointed) else body.attempt
    if attempt != state.attempt:
        raise _illegal(event, "attempt_order", f"attempt {attempt} is not the running one ({state.attempt})")
    match body:
        case Checkpointed():
            cp = body.checkpoint
            if cp.step > cp.total or (state.total is not None and cp.total != state.total):
                raise _illegal(event, "checkpoint_step", f"checkpoint of step {cp.step}/{cp.total}, job at total {state.total}")
            if state.step is None or cp.step > state.step:
                raise _illegal(event, "checkpoint_ahead", f"checkpoint of step {cp.step}, but the attempt reached {state.step}")
            mine = [c.step for c in state.checkpoints if c.attempt == state.attempt]
            floor = max(mine, default=state.restored_from or 0)
            if cp.step <= floor:
                raise _illegal(event, "checkpoint_not_monotone", f"checkpoint of step {cp.step} is not past step {floor}")
            return state.model_copy(update={**common, "checkpoints": (*state.checkpoints, cp)[-CHECKPOINTS_KEPT:]})
        case Restored() | CheckpointRejected():
            if state.step is not None:
                raise _illegal(event, "after_first_step", f"'{body.type}' only before the attempt's first step")
            if body.checkpoint not in state.checkpoints:
                raise _illegal(event, "unknown_checkpoint", f"the log holds no checkpoint {body.checkpoint.path}")
            if isinstance(body, CheckpointRejected):
                kept = tuple(c for c in state.checkpoints if c != body.checkpoint)
                return state.model_copy(update={**common, "checkpoints": kept})
            cp = body.checkpoint
            restored = state.model_copy(update={**common, "step": cp.step, "total": cp.total, "restored_from": cp.step})
            return restored.model_copy(update={"steps_before_attempt": restored.steps_done or 0})
        case Released():
            if state.cancel_requested:
                raise _illegal(event, "release_after_cancel", "a job whose cancel was requested ends; it is not handed back")
            return state.model_copy(
                update={
                    **common,
                    "status": "queued",
                    "released": state.released + 1,
                    "step": None,
                    "total": None,
                    "restored_from": None,
                    "steps_before_attempt": 0,
                }
            )
    raise AssertionError(body)  # pragma: no cover


def fold(events: Iterable[Event], state: JobState | None = None) -> JobState | None:
    """Apply events in order; `None` for an empty log."""
    for event in events:
        state = apply(state, event)
    return state


def extend(state: JobState | None, job_id: str, bodies: Iterable[Body], at: datetime) -> tuple[JobState, tuple[Event, ...]]:
    """Number `bodies` after `state`, check each against the rules, return the new state and events.

    This is what every store does inside its write transaction, so an illegal event is refused
    before anything is written.
    """
    seq = state.last_seq if state is not None else 0
    events = []
    for body in bodies:
        seq += 1
        event = Event(job_id=job_id, seq=seq, at=at, body=body)
        state = apply(state, event)
        events.append(event)
    if state is None:
        raise ValueError("extend needs at least one event for a new job")
    return state, tuple(events)
