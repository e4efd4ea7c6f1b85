"""The runner's way to its store: reads retried off the event loop, every append through the
single group-committing writer and logged as it is written.

The first `StoreUnavailable` (a read or the writer giving up) is kept as `lost`: from then on the
runner admits nothing and stops its attempts, since no end it decides can be written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from h3core.adapters.store.base import EventStore
from h3core.domain.events import (
    Admitted,
    AttemptFailed,
    Body,
    Cancelled,
    CancelRequested,
    CheckpointRejected,
    Detached,
    Done,
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
)
from h3core.domain.state import JobState
from h3core.runtime._writer import GroupWriter
from h3core.runtime.bus import EventBus
from h3core.runtime.store_retry import StoreUnavailable, retrying

T = TypeVar("T")

log = logging.getLogger("h3core.runner")


class Journal:
    def __init__(self, store: EventStore, bus: EventBus, *, retry_s: float) -> None:
        self.store = store
        self.retry_s = retry_s
        self.writer = GroupWriter(store, bus, retry_s=retry_s)
        self.lost: StoreUnavailable | None = None

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A store read, off the event loop (reads never wait behind writes), retried while the
        store fails transiently."""
        try:
            return await retrying(lambda: fn(*args, **kwargs), limit_s=self.retry_s, what="read")
        except StoreUnavailable as exc:
            self.lose(exc)
            raise

    async def append(self, job_id: str, bodies: Sequence[Body], expected_seq: int | None = None) -> JobState:
        state = await self.writer.append(job_id, bodies, expected_seq)
        log_written(state, bodies)
        return state

    def lose(self, exc: StoreUnavailable) -> None:
        if self.lost is None:
            self.lost = exc

    async def raise_when_lost(self) -> None:
        """Wait for the writer to give up, then raise its `StoreUnavailable`."""
        await self.writer.failed.wait()
        assert self.writer.failure is not None
        self.lose(self.writer.failure)
        raise self.writer.failure


# The event types logged above DEBUG (the cases of `log_written` before its last two).
_ABOVE_DEBUG = frozenset(
    {
        "admitted",
        "running",
        "resumed",
        "detached",
        "done",
        "recovered",
        "attempt_failed",
        "failed",
        "cancel_requested",
        "cancelled",
        "reprioritized",
        "planned",
        "segment_done",
        "restored",
        "checkpoint_rejected",
        "released",
    }
)


def log_written(state: JobState, bodies: Sequence[Body]) -> None:
    """One record per event the runner wrote, with the job and attempt as fields: a job's life
    at INFO (its steps at DEBUG), its failures at WARNING."""
    for body in bodies:
        if body.type not in _ABOVE_DEBUG and not log.isEnabledFor(logging.DEBUG):
            # Most events (each step's progress, each submit's `submitted`) log at DEBUG: when that
            # is off, no fields and no match, whose class patterns cost a call each for a model.
            continue
        extra: dict[str, Any] = {"job_id": state.job_id, "attempt": state.attempt, "event": body.type}
        match body:
            case Admitted():
                extra |= {"tokens": body.tokens, "priority": state.priority, "mode": state.request.mode}
                log.info("job %s admitted (%s tokens)", state.job_id, body.tokens, extra=extra)
            case Running():
                extra |= {"executor": body.executor, "executor_ref": body.executor_ref}
                log.info("job %s started: attempt %d on %s", state.job_id, body.attempt, body.executor, extra=extra)
            case Done():
                extra |= {"path": body.artifact.path, "bytes": body.artifact.bytes}
                if body.cancel_too_late:
                    extra["cancel_too_late"] = True
                    log.info("job %s done: its cancel came too late, the work had finished", state.job_id, extra=extra)
                else:
                    log.info("job %s done", state.job_id, extra=extra)
            case Resumed():
                extra |= {"executor": state.executor, "executor_ref": body.executor_ref}
                log.info(
                    "job %s resumed: attempt %d, %gs after h3core stopped", state.job_id, body.attempt, body.after_s, extra=extra
                )
            case Detached():
                extra |= {"executor": state.executor, "executor_ref": body.executor_ref}
                log.info(
                    "job %s detached: h3core stops, attempt %d runs on as %s",
                    state.job_id,
                    body.attempt,
                    body.executor_ref,
                    extra=extra,
                )
            case Progress():
                extra |= {"step": body.step, "total": body.total}
                log.debug("job %s step %d/%d", state.job_id, body.step, body.total, extra=extra)
            case Recovered():
                extra |= {"path": body.artifact.path}
                log.info("job %s recovered: attempt %d had committed its video", state.job_id, body.attempt, extra=extra)
            case AttemptFailed():
                extra |= {"attempt": body.attempt, "kind": body.kind, "executor": state.executor}
                log.warning(
                    "job %s attempt %d failed (%s), queued again: %s",
                    state.job_id,
                    body.attempt,
                    body.kind,
                    body.message,
                    extra=extra,
                )
            case Failed():
                extra |= {"kind": body.kind, "executor": state.executor}
                log.warning("job %s failed (%s): %s", state.job_id, body.kind, body.message, extra=extra)
            case CancelRequested():
                log.info("job %s: cancel requested (%s)", state.job_id, body.reason, extra=extra | {"by": body.by})
            case Reprioritized():
                extra |= {"priority": body.priority, "by": body.by}
                log.info("job %s: priority set to %d", state.job_id, body.priority, extra=extra)
            case Planned():
                extra |= {"segments": len(body.plan.segments)}
                log.info("job %s planned as %s", state.job_id, body.plan.describe(), extra=extra)
            case SegmentDone():
                extra |= {"segment": body.index, "path": body.artifact.path, "frames": body.artifact.frames}
                of = len(state.plan.segments) if state.plan is not None else "?"
                log.info("job %s: segment %d of %s done", state.job_id, body.index + 1, of, extra=extra)
            case Restored():
                extra |= {"step": body.checkpoint.step, "path": body.checkpoint.path}
                log.info(
                    "job %s: attempt %d continues after step %d (a checkpoint)",
                    state.job_id,
                    body.attempt,
                    body.checkpoint.step,
                    extra=extra,
                )
            case CheckpointRejected():
                extra |= {"step": body.checkpoint.step, "path": body.checkpoint.path}
                log.warning(
                    "job %s: checkpoint of step %d unusable: %s", state.job_id, body.checkpoint.step, body.reason, extra=extra
                )
            case Released():
                extra |= {"step": body.step, "reason": body.reason}
                log.info("job %s: attempt %d handed back to the queue (%s)", state.job_id, body.attempt, body.reason, extra=extra)
            case Cancelled():
                log.info("job %s cancelled: %s", state.job_id, body.reason, extra=extra)
            case _:  # submitted: its admission (or refusal) follows in the same append
                log.debug("job %s %s", state.job_id, body.type, extra=extra)
