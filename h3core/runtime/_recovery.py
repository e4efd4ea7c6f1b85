"""Recovery at start: end what a dead or stopped process left running, adopt a video it committed
before it died, re-attach to work that outlived it, admit logs imported without admission, and
clear what this node staged on its own disk for attempts it no longer runs."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.base import Conflict, EventStore
from h3core.adapters.store.nodes import node_leases
from h3core.domain.admission import AdmissionPolicy, Refuse, admission_events
from h3core.domain.adoption import Adopt, Discard, adoption, expected, judge
from h3core.domain.events import (
    AttemptFailed,
    Body,
    Cancelled,
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
)
from h3core.domain.retention import StoredFile
from h3core.domain.state import JobState
from h3core.executors.base import Executor, Resumable
from h3core.runtime._attempt import failure_event
from h3core.runtime._journal import Journal

log = logging.getLogger("h3core.runner")


def can_resume(executor: Executor, state: JobState) -> bool:
    """The attempt's work runs outside h3core, on this executor, which can re-attach to it."""
    return isinstance(executor, Resumable) and state.executor == executor.name and state.executor_ref is not None


async def recover(
    journal: Journal,
    executor: Executor,
    admission: AdmissionPolicy,
    artifacts: ArtifactStore | None,
    last_beat: datetime | None = None,
) -> list[JobState]:
    """End what a dead or stopped process left running, or return it, marked `Resumed`, where
    the executor re-attaches to its work. `last_beat`: on a store shared by runner nodes, this
    node's last heartbeat before it joined again (its row, read before the join), if it had one."""
    # On a store shared by runner nodes, another node's running attempts are its own (or, once
    # its lease expires, whichever node takes the lease over: h3core.runtime._nodes). Read before
    # the jobs: one claimed in between is refused to us at the write (`end_dead_attempt`).
    leases = node_leases(journal.store)
    others = {}
    if leases is not None:
        others = {j: n for j, n in (await journal.read(leases.lease_holders)).items() if n != leases.node_id}
    # Load fully, then write (docs/design.md §2.3): the list is materialised before any append.
    unfinished = await journal.read(journal.store.unfinished)
    # When the previous process was last seen alive. Alone on its store, any runner write is its own
    # (read before this process writes anything); among nodes, others write on, so its own beat counts.
    last_write = last_beat if leases is not None else await journal.read(_runner_last_write, journal.store)
    resumable = []
    now = datetime.now(UTC)
    for state in unfinished:
        if state.status == "running" and state.job_id in others:
            continue
        if state.status == "running" and can_resume(executor, state):
            # Re-attach to the work, unless it committed its video before the crash (adopted below).
            if not isinstance(await _verdict(journal, artifacts, state, executor), Adopt):
                assert state.executor_ref is not None
                events = await journal.read(journal.store.events, state.job_id)
                away = max(0.0, (now - unfollowed_since(events, state.attempt, last_write)).total_seconds())
                resumed = Resumed(attempt=state.attempt, executor_ref=state.executor_ref, after_s=round(away, 3))
                resumable.append(await journal.append(state.job_id, [resumed], expected_seq=state.last_seq))
                continue
        if state.status == "running":
            message = f"h3core stopped while attempt {state.attempt} was running"
            await end_dead_attempt(journal, artifacts, state, message, executor)
        elif state.status == "submitted":  # a log imported without its admission
            decision = admission.decide(state.request)
            if isinstance(decision, Refuse):
                bodies: list[Body] = [Failed(kind="invalid", message=f"refused at recovery: {decision.detail}")]
            else:
                bodies = admission_events(decision)
            await journal.append(state.job_id, bodies, expected_seq=state.last_seq)
    if artifacts is not None:
        await clear_staged(journal, artifacts)
    return resumable


async def clear_staged(journal: Journal, artifacts: ArtifactStore) -> list[StoredFile]:
    """Remove what this node staged for attempts it no longer runs (what it removed). Its own dead
    attempts were ended above, which took their files; what is left was staged for attempts another
    node took over while this one was down, or ended since: that node could neither adopt nor
    discard a file on this node's disk, and no gc sees it. An attempt running here (resumed) keeps its file."""
    staged = await journal.read(artifacts.staged_here)
    if not staged:
        return []
    leases = node_leases(journal.store)
    holders = await journal.read(leases.lease_holders) if leases is not None else {}
    removed = []
    for f in staged:
        state = await journal.read(journal.store.get, f.job_id)
        running = state is not None and state.status == "running" and state.attempt == f.attempt
        if running and holders.get(f.job_id) in (None, leases.node_id if leases is not None else None):
            continue
        log.info("removed %s (%d bytes), staged here for an attempt this node no longer runs", f.path, f.bytes)
        await journal.read(artifacts.remove, f.path)
        removed.append(f)
    return removed


async def _verdict(
    journal: Journal, artifacts: ArtifactStore | None, state: JobState, executor: Executor | None
) -> Adopt | Discard | None:
    """What the artifact store holds of the running attempt: a video to adopt, one to discard, or
    nothing. With the executor known, a whole staged video its commit did not record is committed
    first (the frames that executor makes of the request say what whole is): a finished encode is
    adopted, never redone."""
    if artifacts is None:
        return None
    expect = expected(state, executor.capabilities()) if executor is not None else None
    found = await journal.read(artifacts.committed, state.job_id, state.attempt, expect=expect)
    return judge(state, found)


async def end_dead_attempt(
    journal: Journal, artifacts: ArtifactStore | None, state: JobState, message: str, executor: Executor | None = None
) -> JobState | None:
    """End a running attempt no process follows any more (its process died or stopped, or its
    node lost its lease): adopt the video it committed (or, `executor` given, a whole staged one a
    crash left before its commit's record), else end it cancelled (a cancel was asked) or
    interrupted (the retry policy decides whether it runs again), clearing what it left.

    Another write may come first (a cancel request from an API node, another node's claim after
    the job ended): then the job is read again and ended only if the same attempt still runs and
    no other node holds it. Returns the ended state, or None when it was not this one's to end."""
    attempt = state.attempt
    while True:
        try:
            return await _end_dead_attempt(journal, artifacts, state, message, executor)
        except Conflict:  # LeaseLost included
            current = await journal.read(journal.store.get, state.job_id)
            if current is None or not await _still_dead(journal, current, attempt):
                return None
            state = current


async def _still_dead(journal: Journal, state: JobState, attempt: int) -> bool:
    """Is `attempt` still running, unfollowed, with no other node holding it?"""
    if state.status != "running" or state.attempt != attempt:
        return False
    leases = node_leases(journal.store)
    if leases is not None:
        return (await journal.read(leases.lease_holders)).get(state.job_id) in (None, leases.node_id)
    return True


async def _end_dead_attempt(
    journal: Journal, artifacts: ArtifactStore | None, state: JobState, message: str, executor: Executor | None
) -> JobState:
    verdict = await _verdict(journal, artifacts, state, executor)
    if isinstance(verdict, Adopt):  # finished before the crash: its Done, not a rerun
        return await journal.append(state.job_id, adoption(state, verdict), expected_seq=state.last_seq)
    if isinstance(verdict, Discard):
        message += f"; {verdict.reason}"
    # What the dead attempt left (partial or unverified) goes, once the log says what it was.
    left = await journal.read(artifacts.attempt_files, state.job_id, state.attempt) if artifacts is not None else []
    if state.cancel_requested:
        reason = "cancel was requested; h3core stopped before the executor confirmed"
        body: Body = Cancelled(reason="; ".join(filter(None, (reason, _discarded(left)))))
    else:
        body = failure_event(state, "interrupted", message, _discarded(left))
    ended = await journal.append(state.job_id, [body], expected_seq=state.last_seq)
    if artifacts is not None:
        await journal.read(artifacts.discard, state.job_id, state.attempt)
    return ended


# What only a runner writes (an API process on the same store writes submits and cancels): the
# newest of these is when the previous runner process was last seen.
RUNNER_WRITES = (
    Running,
    Resumed,
    Detached,
    Progress,
    Done,
    AttemptFailed,
    Failed,
    Recovered,
    Checkpointed,
    Restored,
    CheckpointRejected,
    Released,
)
RECENT = 1000  # how far back the store is read for it


def _runner_last_write(store: EventStore) -> datetime | None:
    """When a runner last wrote to the store, among its newest `RECENT` events (None: not there)."""
    newest = store.events_after(max(0, store.cursor() - RECENT), RECENT)
    return max((e.at for _, e in newest if isinstance(e.body, RUNNER_WRITES)), default=None)


def unfollowed_since(events: Sequence[Event], attempt: int, last_write: datetime | None) -> datetime:
    """Since when no h3core process has followed the running `attempt`: its `detached` event when
    the previous process stopped gracefully; after a crash, the last time that process was seen
    writing (`last_write`, or this attempt's own last event written by a runner). Pure."""
    since = None
    for e in _current_run(events, attempt):
        if isinstance(e.body, Detached):
            return e.at
        if since is None and isinstance(e.body, RUNNER_WRITES):
            since = e.at
    assert since is not None, "a running attempt's log has its `running` event"
    return max(since, last_write) if last_write is not None else since


def _current_run(events: Sequence[Event], attempt: int) -> Iterable[Event]:
    """The events of `attempt` since it was last started or resumed, newest first."""
    for e in reversed(events):
        yield e
        if isinstance(e.body, Running | Resumed) and e.body.attempt == attempt:
            return


def _discarded(files: list[StoredFile]) -> str | None:
    """The files recovery removed, each with its size and sha256 (the failure's detail)."""
    if not files:
        return None
    return "discarded: " + "; ".join(f"{f.path} ({f.bytes} bytes, sha256 {f.sha256})" for f in files)
