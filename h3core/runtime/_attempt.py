"""One running attempt as its driver and watcher share it, and the pure decision of how it ends.

Which event ends an attempt depends only on what happened to it (a result, an error, a cancel, a
stall, a deadline, a stop of h3core, a grace that ran out) and on the job's retry policy, so it
is decided here without I/O; the supervisor writes what this returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio

from h3core.domain.admission import CONTINUED_FRAME, AdmissionRules
from h3core.domain.events import AttemptFailed, Body, Cancelled, Detached, Done, Failed, Released
from h3core.domain.failures import FailureKind
from h3core.domain.state import JobState
from h3core.executors.base import CheckpointSaved, JobSpec, Result
from h3core.runtime._writer import Queued
from h3core.runtime.config import RunnerConfig


@dataclass
class Attempt:
    """One running attempt, shared by its driver and watcher tasks."""

    state: JobState
    last_touch: float
    call_began: float = field(default_factory=anyio.current_time)  # the executor call now running (a segment's)
    signal: anyio.Event = field(default_factory=anyio.Event)
    cancel: bool = False
    stop_reason: FailureKind | None = None  # stalled / deadline, when the watcher stopped it
    stop_wait_s: float = 0.0  # what the executor may take to stop beyond the grace (`Capabilities.stop_wait_s`)
    result: Result | None = None
    error: tuple[FailureKind, str, str | None] | None = None
    driver_done: bool = False
    ended: bool = False  # the terminal (or retry) event is written
    resume: bool = False  # re-attached after a restart: follow, do not start
    stopping: bool = False  # h3core is stopping while the attempt runs
    detached: bool = False  # ...and the executor leaves its work running for the next start
    at_stop: CheckpointSaved | None = None  # the checkpoint the executor stored where h3core's stop stopped it
    reported: list[Queued] = field(default_factory=list)  # progress handed to the writer, oldest first
    # When it began here (time.monotonic, the heartbeat thread's clock): its lease was taken before.
    began: float = field(default_factory=time.monotonic)
    lost: str | None = None  # why it is no longer this node's: stopped, and nothing more is written for it

    def wake(self) -> None:
        self.signal.set()
        self.signal = anyio.Event()


def spec_of(state: JobState, *, attempt: int | None = None, continued_from: str | None = None) -> JobSpec:
    """What the executor is handed for the job's attempt (`attempt`: another than the state's, as a
    claim's next one): for a long video, its next segment's call (fl2va from `continued_from`, the
    upload holding the frame the segment before kept last; a placeholder where none is made yet,
    enough to judge the call), else the request as asked."""
    request, segment = state.request, None
    if state.plan is not None and state.segment is not None:
        segment = state.plan.segments[state.segment]
        part = AdmissionRules.segment_request
        request = part(request, state.plan, segment, continued_from=continued_from or CONTINUED_FRAME)
    if attempt is not None:
        return JobSpec(state.job_id, attempt, request, state.tokens, segment=segment)
    return JobSpec(state.job_id, state.attempt, request, state.tokens, last_step=state.step or 0, segment=segment)


def failure_event(state: JobState, kind: FailureKind, message: str, detail: str | None) -> Body:
    """A retry where the job's own policy allows one, else the terminal failure."""
    if not state.cancel_requested and state.allows_retry(kind):
        return AttemptFailed(kind=kind, message=message, detail=detail, attempt=state.attempt, tokens=state.tokens)
    return Failed(kind=kind, message=message, detail=detail, tokens=state.tokens)


def end_event(a: Attempt, config: RunnerConfig, *, interrupted: bool, grace_expired: bool) -> Body:
    """The event that ends the attempt: its result (`done`, with a cancel requested meanwhile
    recorded as too late: the work had finished), a retry or a terminal failure; `detached` for
    one whose work runs on after a stop (resumed at the next start); `released` for one h3core's
    own graceful stop ended (not a failure: the next attempt does not count against the policy)."""
    state = a.state
    if a.result is not None and not grace_expired:
        return Done(artifact=a.result.artifact, tokens=state.tokens, cancel_too_late=state.cancel_requested, steps=a.result.steps)
    if a.detached:
        # A cancel requested meanwhile is in the log: the resumed attempt honours it.
        assert state.executor_ref is not None
        return Detached(attempt=state.attempt, executor_ref=state.executor_ref)
    why = None  # why the runner stopped the attempt, if it did
    if a.cancel:
        why = "cancelled by request"
    elif a.stop_reason == "stalled":
        why = f"no progress for {config.stall_timeout_s:g}s (last step {state.step}/{state.total})"
    elif a.stop_reason == "deadline":
        why = f"attempt {state.attempt} ran past its {config.attempt_deadline_s:g}s deadline"
    elif interrupted or a.stopping:
        why = "h3core was stopped while the job ran"
    if why is not None and grace_expired:
        # Ended without the executor's word that its work stopped: never `cancelled` then.
        msg = f"{why}, but the executor did not stop within {config.cancel_grace_s + a.stop_wait_s:g}s: its work may still run"
        return failure_event(state, "stop_unconfirmed", msg, None)
    if why is not None and a.error is not None and a.error[0] == "stop_unconfirmed":
        kind, message, detail = a.error
        return failure_event(state, kind, f"{why}, but {message}", detail)
    if a.cancel:
        return Cancelled(reason=why or "")
    if a.stop_reason is not None:
        return failure_event(state, a.stop_reason, why or "", None)
    if why is not None:
        return Released(attempt=state.attempt, reason="h3core was stopped gracefully while the job ran", step=state.step)
    if a.error is not None:
        return failure_event(state, *a.error)
    return failure_event(state, "executor_error", "executor finished without a result", None)
