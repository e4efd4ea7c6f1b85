"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import functools

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
    Failed,
    Progress,
    Recovered,
    Released,
    Restored,
    Resumed,
    Running,
    Submitted,
)
from h3core.domain.failures import FAILURE_KINDS
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import JobState
from tests.factories import artifact

kinds = st.sampled_from(FAILURE_KINDS)

requests = st.builds(
    GenerationRequest,
    prompt=st.text(min_size=1, max_size=40),
    width=st.integers(1, 64).map(lambda n: n * 32),
    height=st.integers(1, 64).map(lambda n: n * 32),
    frames=st.integers(1, 2000),
    steps=st.integers(1, 60),
    seed=st.integers(0, 2**63 - 1),
)

policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 4),
    retry_on=st.lists(kinds, max_size=4, unique=True).map(tuple),
)


submissions = st.builds(Submitted, request=requests, retry=policies)

# Bodies that do not depend on the state, built once: strategies made per draw cost more than the draw.
_admitted = st.builds(Admitted)
_failed = st.builds(Failed, kind=kinds, message=st.just("m"))
_done = st.builds(
    Done,
    artifact=st.sampled_from([artifact(), artifact("j/attempt-2.mp4")]),
    cancel_too_late=st.sampled_from([False, False, True]),
)
_cancel_requested = st.builds(CancelRequested)
_cancelled = st.builds(Cancelled)


@functools.lru_cache(maxsize=4096)
def _checkpoint_bodies(attempt: int, step: int, total: int, kept: tuple[Checkpoint, ...]) -> tuple[st.SearchStrategy[Body], ...]:
    """Checkpoint and release bodies near a state (legal ones often), made once per such state:
    strategies built on every draw cost more than the draws."""
    near = st.sampled_from([max(attempt, 1), max(attempt, 1), attempt + 1])
    fresh = st.builds(
        Checkpoint,
        attempt=near,
        step=st.sampled_from([max(step, 1), max(step, 1), max(step - 1, 1), step + 1]),
        total=st.sampled_from([total, total, total + 1]),
        path=st.sampled_from(["c/a", "c/b"]),
        bytes=st.just(1),
        sha256=st.sampled_from(["0" * 64, "1" * 64]),
    )
    known = st.sampled_from(kept) if kept else fresh
    return (
        st.builds(Checkpointed, checkpoint=fresh),
        st.builds(Restored, attempt=near, checkpoint=st.one_of(known, known, fresh)),
        st.builds(CheckpointRejected, attempt=near, checkpoint=st.one_of(known, fresh), reason=st.just("r")),
        st.builds(Released, attempt=near, reason=st.just("shutdown"), step=st.sampled_from([None, step])),
    )


def bodies_for(state: JobState | None) -> st.SearchStrategy[Body]:
    """Any body at all, weighted towards the ones that move `state` along, so that long logs
    with retries and progress are common and illegal offers still come often."""
    attempt = state.attempt if state else 0
    step = state.step if state and state.step is not None else 0
    total = state.total if state and state.total is not None else 5
    running = st.builds(
        Running,
        attempt=st.sampled_from([attempt + 1, attempt + 1, max(attempt, 1), attempt + 2]),
        executor=st.just("x"),
        executor_ref=st.sampled_from([None, f"ref-{attempt + 1}"]),
    )
    ref = state.executor_ref if state and state.executor_ref else "ref-0"
    resumed = st.builds(
        Resumed,
        attempt=st.sampled_from([max(attempt, 1), max(attempt, 1), attempt + 1]),
        executor_ref=st.sampled_from([ref, ref, "another"]),
        after_s=st.floats(0, 1e6),
    )
    detached = st.builds(
        Detached,
        attempt=st.sampled_from([max(attempt, 1), max(attempt, 1), attempt + 1]),
        executor_ref=st.sampled_from([ref, "another"]),
    )
    progress = st.builds(
        Progress, step=st.sampled_from([step + 1, step + 1, step, step + 3]), total=st.sampled_from([total, total, total + 1])
    )
    retry_kinds = st.sampled_from(state.retry.retry_on) if state and state.retry.retry_on else kinds
    attempt_failed = st.builds(
        AttemptFailed,
        kind=st.one_of(retry_kinds, kinds),
        message=st.just("m"),
        attempt=st.sampled_from([max(attempt, 1), attempt + 1]),
    )
    recovered = st.builds(Recovered, attempt=st.sampled_from([max(attempt, 1), attempt + 1]), artifact=st.just(artifact()))
    checkpointed, restored, rejected, released = _checkpoint_bodies(attempt, step, total, state.checkpoints if state else ())
    anything = st.one_of(
        submissions,
        _admitted,
        running,
        resumed,
        detached,
        progress,
        _done,
        attempt_failed,
        _failed,
        _cancel_requested,
        _cancelled,
        recovered,
        checkpointed,
        restored,
        rejected,
        released,
    )
    if state is None:
        likely = [submissions] * 8
    elif state.status == "submitted":
        likely = [_admitted] * 8
    elif state.status == "queued":
        likely = [running] * 7 + [_cancelled]
    else:  # running, or already ended (where everything is illegal anyway)
        likely = [progress] * 6 + [
            resumed,
            detached,
            _done,
            attempt_failed,
            attempt_failed,
            _failed,
            _cancel_requested,
            recovered,
            checkpointed,
            checkpointed,
            restored,
            rejected,
            released,
        ]
        if state.cancel_requested:
            likely.append(_cancelled)
    # sampled_from, not one_of: one_of collapses repeated strategies and would lose the weights.
    return st.sampled_from([*likely, anything, anything]).flatmap(lambda s: s)
