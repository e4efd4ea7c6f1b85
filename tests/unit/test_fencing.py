"""Fencing in the runner: once the job no longer runs this runner's attempt (another writer, a node
that took the attempt over, re-queued it, started a later attempt or ended it), the attempt is lost
here: its executor is stopped and nothing more is written for it, not even its finished video or
the checkpoint it stored at a stop. What only the attempt's process writes (progress, checkpoints
logged, restored or rejected) is refused alike wherever it is written, at the attempt's start too.
A cancel request stored meanwhile on the attempt, still ours, is decided on as before.

The other writer is the test itself, appending to the runner's store as a taking-over node would
(tests/unit/test_nodes.py does it with real leases on PostgreSQL)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
import pytest

from h3core import FakePlan, LocalArtifactStore, RunnerConfig
from h3core.adapters.store.memory import MemoryEventStore
from h3core.adapters.store.nodes import LeaseLost
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.domain.checkpoints import CheckpointPolicy
from h3core.domain.events import (
    Admitted,
    AttemptFailed,
    Body,
    CancelRequested,
    Checkpoint,
    Checkpointed,
    Done,
    Failed,
    Planned,
    Progress,
    Restored,
    Running,
    SegmentDone,
)
from h3core.domain.segments import plan_segments
from h3core.domain.state import IllegalEvent
from h3core.runtime._supervisor import Supervisor, _lost_by
from tests.factories import artifact, request, submitted
from tests.unit.conftest import wait_until

pytestmark = pytest.mark.anyio

TAKEN = AttemptFailed(kind="interrupted", message="node b took attempt 1 over", attempt=1)


def lost_records(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is lost to this node" in r.getMessage()]


def append(store, job_id, *bodies) -> int:
    """Append as another writer would; the seq of the last event appended."""
    state, _ = store.append(job_id, list(bodies))
    return state.last_seq


def taken(attempt: int) -> AttemptFailed:
    return AttemptFailed(kind="interrupted", message=f"node b took attempt {attempt} over", attempt=attempt)


class MovedOnBefore(SQLiteEventStore):
    """A store on which another writer moves the job on from its running attempt (by default
    re-queues it, as a node taking it over would) just before the first write `when` picks (once
    set): where the runner's write meets a job that moved on. `moved_at`: the seq of the other
    writer's last event."""

    when: Callable[[Sequence[Body], int | None], bool] | None = None
    moved: Callable[[int], list[Body]] = staticmethod(lambda attempt: [taken(attempt)])
    moved_at = 0

    def append_batch(self, items):
        for job_id, bodies, expected_seq in items:
            if self.when is not None and self.when(bodies, expected_seq):
                self.when = None
                self.moved_at = append(self, job_id, *self.moved(self.get(job_id).attempt))
        return super().append_batch(items)


def attempt_of(body: Body) -> int | None:
    return body.checkpoint.attempt if isinstance(body, Checkpointed) else getattr(body, "attempt", None)


async def test_progress_refused_because_the_job_was_requeued_elsewhere_loses_the_attempt_and_the_retry_ends_it(
    make_runner, caplog
):
    caplog.set_level(logging.WARNING, "h3core.runner")
    async with make_runner(plan=FakePlan(step_seconds=0.05), checkpoints=CheckpointPolicy(every_steps=2)) as runner:
        job = (await runner.submit(request(steps=40))).job_id
        await wait_until(lambda: runner.store.get(job).checkpoints)  # attempt 1 logged a checkpoint
        taken_at = append(runner.store, job, TAKEN)  # re-queued by another node: attempt 1 is not ours now
        await wait_until(lambda: runner.store.get(job).terminal, timeout=30)
    state, events = runner.store.get(job), runner.store.events(job)
    assert state.status == "done" and state.attempt == 2
    # Nothing of attempt 1 after it was taken (no progress, no checkpoint): the retry's own events
    # only (this runner claimed it again), continued from attempt 1's newest checkpoint logged before.
    after = [e for e in events if e.seq > taken_at]
    assert {attempt_of(e.body) for e in after} <= {2, None}
    assert [e.type for e in after[:2]] == ["running", "restored"] and after[1].body.checkpoint.attempt == 1
    first = after[1].body.checkpoint.step + 1
    assert [e.body.step for e in after if e.type == "progress"] == list(range(first, 41))
    assert after[-1].type == "done" and "checkpointed" in {e.type for e in after}
    (lost,) = lost_records(caplog)
    assert f"job {job}: attempt 1 is lost" in lost and "'progress' only while running, job is 'queued'" in lost
    assert not [r for r in caplog.records if "failed job" in r.getMessage()], "the executor was not blamed"
    assert runner.executor.runs == runner.executor.cleanups == 2  # attempt 1's work was stopped


@pytest.mark.parametrize(
    ("moved", "holder"),
    [
        ((TAKEN,), None),
        ((TAKEN, Running(attempt=2, executor="fake", info={"node": "b"})), "b"),
        ((Failed(kind="interrupted", message="ended by node b"),), None),
    ],
    ids=["requeued", "running-elsewhere", "ended-elsewhere"],
)
async def test_an_end_written_after_the_job_moved_on_is_not_written_and_its_video_not_recorded(
    make_runner, caplog, moved, holder
):
    caplog.set_level(logging.WARNING, "h3core.runner")
    async with make_runner(plan=FakePlan(step_seconds=0.01, encode_seconds=0.5)) as runner:
        job = (await runner.submit(request(steps=3))).job_id
        # Its video is being made, its last step written: `done` comes next.
        await wait_until(lambda: job in runner.executor.finishing and runner.store.get(job).step == 3)
        moved_at = append(runner.store, job, *moved)
        await wait_until(lambda: bool(lost_records(caplog)), timeout=30)
        if moved[-1].type == "attempt_failed":  # queued again: this runner runs the retry, and writes its end
            await wait_until(lambda: runner.store.get(job).terminal, timeout=30)
        else:
            await wait_until(lambda: job not in runner._supervisor.busy)
    events = runner.store.events(job)
    after = [e for e in events if e.seq > moved_at]
    if moved[-1].type == "attempt_failed":
        assert [e.type for e in after] == ["running", "progress", "progress", "progress", "done"]
        assert runner.store.get(job).artifact.path.endswith("attempt-2.mp4")  # not attempt 1's video
    else:
        assert after == [], "nothing written for attempt 1 once the job had moved on"
    (lost,) = lost_records(caplog)
    assert f"job {job}: attempt 1 is lost" in lost
    assert holder is None or f"on node {holder}" in lost
    assert any("attempt-1.mp4 after the attempt was lost to this node: not recorded" in r.getMessage() for r in caplog.records)


async def test_a_step_written_onto_a_later_attempt_by_a_store_that_does_not_fence_loses_the_attempt(
    make_runner, tmp_path, caplog
):
    """SQLite fences nothing: the attempt's last step lands on the attempt another writer started
    just before it. The state it comes back with says the job moved on: the attempt is lost, and
    its `done` (whose expected seq that state would have made pass) is not written."""
    caplog.set_level(logging.WARNING, "h3core.runner")
    store = MovedOnBefore(tmp_path / "h3.db", durable=False)
    store.when = lambda bodies, _: any(isinstance(b, Progress) and b.step == 3 for b in bodies)
    store.moved = lambda attempt: [taken(attempt), Running(attempt=attempt + 1, executor="fake", info={"node": "b"})]
    async with make_runner(plan=FakePlan(step_seconds=0.01, encode_seconds=0.2), store=store) as runner:
        job = (await runner.submit(request(steps=3))).job_id
        await wait_until(lambda: bool(lost_records(caplog)), timeout=30)
        await wait_until(lambda: job not in runner._supervisor.busy)
    assert [e.type for e in store.events(job) if e.seq > store.moved_at] == ["progress"]  # unfenced: it landed
    state = store.get(job)
    assert state.status == "running" and state.attempt == 2
    (lost,) = lost_records(caplog)
    assert f"job {job}: attempt 1 is lost" in lost and "it is running, at attempt 2 on node b" in lost


async def test_a_cancel_request_stored_while_the_attempt_ends_is_still_decided_on(make_runner, caplog):
    """The other direction: the conflict is a cancel request on the attempt, still ours: its end is
    written (`done`, the cancel too late), and nothing is said lost."""
    caplog.set_level(logging.WARNING, "h3core.runner")
    # A grace far past the encode: a stop noticed during it waits for the video, however loaded the machine.
    async with make_runner(plan=FakePlan(step_seconds=0.01, encode_seconds=0.5), cancel_grace_s=60.0) as runner:
        job = (await runner.submit(request(steps=3))).job_id
        await wait_until(lambda: job in runner.executor.finishing)
        append(runner.store, job, CancelRequested(reason="from an API node"))
        await wait_until(lambda: runner.store.get(job).terminal)
    state = runner.store.get(job)
    assert state.status == "done" and runner.store.events(job)[-1].body.cancel_too_late
    assert lost_records(caplog) == []


async def test_a_live_attempt_writes_its_end_though_others_write_onto_the_job(make_runner, caplog):
    """A cancel request from another process lands among the attempt's progress events: the attempt
    is still this runner's, stopped as asked and ended `cancelled`."""
    caplog.set_level(logging.WARNING, "h3core.runner")
    async with make_runner(plan=FakePlan(step_seconds=0.05)) as runner:
        job = (await runner.submit(request(steps=200))).job_id
        await wait_until(lambda: (runner.store.get(job).step or 0) >= 2)
        await anyio.to_thread.run_sync(append, runner.store, job, CancelRequested(reason="from an API node"))
        await wait_until(lambda: runner.store.get(job).terminal)
    assert runner.store.get(job).status == "cancelled" and lost_records(caplog) == []


async def test_a_restore_refused_because_the_job_moved_on_loses_the_attempt_before_its_work_starts(make_runner, tmp_path, caplog):
    """Attempt 2 starts from the checkpoint a graceful stop left, and the job is taken from it just
    before its `restored` is written: refused, the attempt is lost (its executor never runs), and
    attempt 3 continues from the checkpoint to the video an uninterrupted run makes."""
    caplog.set_level(logging.WARNING, "h3core.runner")
    store = MovedOnBefore(tmp_path / "h3.db", durable=False)
    async with make_runner(plan=FakePlan(hang_at=7), store=store, checkpoints=CheckpointPolicy(every_steps=2)) as runner:
        job = (await runner.submit(request(steps=8))).job_id
        await wait_until(lambda: getattr(store.get(job).checkpoint, "step", 0) == 6)
    assert store.get(job).status == "queued"  # released by the stop
    store.when = lambda bodies, _: any(isinstance(b, Restored) for b in bodies)
    async with make_runner(plan=FakePlan(), store=store) as runner:
        await wait_until(lambda: store.get(job).terminal, timeout=30)
        assert runner.executor.runs == 1, "attempt 2's work never started"
    after = [e for e in store.events(job) if e.seq > store.moved_at]
    assert [e.type for e in after[:2]] == ["running", "restored"] and after[0].body.attempt == 3
    assert [e.body.step for e in after if e.type == "progress"] == [7, 8] and after[-1].type == "done"
    (lost,) = lost_records(caplog)
    assert f"job {job}: attempt 2 is lost" in lost and "refused its restored" in lost
    assert not [r for r in caplog.records if "failed job" in r.getMessage()], "the executor was not blamed"
    async with make_runner(plan=FakePlan(), store=store) as runner:
        again = (await runner.submit(request(steps=8))).job_id
        await wait_until(lambda: store.get(again).terminal)
    assert store.get(job).artifact.sha256 == store.get(again).artifact.sha256


async def test_a_lost_attempt_writes_neither_its_end_nor_the_checkpoint_it_stored_at_a_graceful_stop(
    make_runner, tmp_path, caplog
):
    """h3core stops while the attempt runs: the executor checkpoints where it stops, and the job is
    taken just before that checkpoint is logged. Neither it nor the attempt's `released` is written."""
    caplog.set_level(logging.WARNING, "h3core.runner")
    store = MovedOnBefore(tmp_path / "h3.db", durable=False)
    at_stop = lambda bodies, expected_seq: expected_seq is not None and any(isinstance(b, Checkpointed) for b in bodies)  # noqa: E731
    policy = CheckpointPolicy(every_steps=1000)  # none while it runs: only the one at the stop
    async with make_runner(plan=FakePlan(step_seconds=0.05), store=store, checkpoints=policy) as runner:
        job = (await runner.submit(request(steps=200))).job_id
        await wait_until(lambda: (store.get(job).step or 0) >= 2)
        store.when = at_stop
    assert store.moved_at, "the checkpoint at the stop was not written"
    assert [e.type for e in store.events(job) if e.seq > store.moved_at] == []
    state = store.get(job)
    assert state.status == "queued" and state.checkpoints == () and state.released == 0
    (lost,) = lost_records(caplog)
    assert f"job {job}: attempt 1 is lost" in lost and "it is queued" in lost
    assert any("at its stop after the attempt was lost to this node: not logged" in r.getMessage() for r in caplog.records)


def test_a_refused_report_loses_the_attempt_only_where_the_job_moved_on():
    cp = Checkpoint(attempt=2, step=4, total=8, path="j/checkpoint-2-4.ckpt", bytes=10, sha256="a" * 64)
    refused = lambda code: IllegalEvent(code, "refused", job_id="j", seq=9)  # noqa: E731
    assert _lost_by(LeaseLost("leased to node b", "b"), [Progress(step=5, total=8)], 2) == ("leased to node b", "b")
    for code in ("not_running", "after_terminal", "recovered_then_done"):
        assert _lost_by(refused(code), [Checkpointed(checkpoint=cp)], 2) is not None
    # The job runs another attempt: lost where what was refused names this one ...
    assert _lost_by(refused("attempt_order"), [Restored(attempt=2, checkpoint=cp)], 2) is not None
    assert _lost_by(refused("attempt_order"), [Checkpointed(checkpoint=cp)], 2) is not None
    # ... and the executor's fault where its checkpoint names another.
    assert _lost_by(refused("attempt_order"), [Checkpointed(checkpoint=cp)], 3) is None
    for code in ("step_not_monotone", "checkpoint_not_monotone", "checkpoint_ahead"):
        assert _lost_by(refused(code), [Progress(step=5, total=8), Checkpointed(checkpoint=cp)], 2) is None


async def test_an_attempt_removes_no_checkpoint_file_of_a_later_attempt(tmp_path):
    """Its state may be behind the job's (it was lost, or the job was claimed elsewhere once it was
    queued again): a later attempt's checkpoints, written or being written, are not its to remove."""
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    store = MemoryEventStore()

    def stored(attempt: int, step: int) -> Checkpoint:
        path, size, sha = artifacts.put_checkpoint("j", attempt, step, b"state")
        return Checkpoint(attempt=attempt, step=step, total=8, path=path, bytes=size, sha256=sha)

    store.append("j", [submitted(steps=8), Admitted(), Running(attempt=1, executor="fake")])
    store.append("j", [Progress(step=i, total=8) for i in (1, 2, 3)] + [Checkpointed(checkpoint=stored(1, 3))])
    state, _ = store.append("j", [taken(1)])  # the attempt's end, queued again: as it prunes
    superseded, later = stored(1, 2), stored(2, 5)
    supervisor = Supervisor(None, None, RunnerConfig(), on_end=lambda: None, artifacts=artifacts)  # it prunes only
    await supervisor._prune(state)
    left = {f.path for f in artifacts.checkpoint_files("j")}
    assert left == {state.checkpoint.path, later.path} and superseded.path not in left
    ended, _ = store.append("j", [Running(attempt=2, executor="fake"), Done(artifact=artifact("j/attempt-2.mp4"))])
    await supervisor._prune(ended)
    assert artifacts.checkpoint_files("j") == []  # the job ended: every one goes


async def test_an_attempts_end_removes_the_segment_files_no_join_will_read_and_none_of_a_later_attempt(tmp_path):
    """Once an attempt ended, its segments the log does not record go (a later attempt makes them
    again), those it records stay for the join; a later attempt's are not its to judge; once the
    job ended (its video joined), every one goes."""
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    store = MemoryEventStore()
    plan = plan_segments(100, 40)

    def put(attempt: int, index: int):
        staged = artifacts.staging("j", attempt)
        staged.write_bytes(b"segment")
        return artifacts.put_segment(staged, job_id="j", attempt=attempt, index=index, frames=24, duration_s=1.0)

    store.append("j", [submitted(frames=100), Admitted(), Planned(plan=plan), Running(attempt=1, executor="fake")])
    logged = put(1, 0)
    store.append("j", [SegmentDone(index=0, artifact=logged)])
    unlogged, later = put(1, 1), put(2, 1)  # attempt 1's event never written; attempt 2 elsewhere
    state, _ = store.append("j", [taken(1)])
    supervisor = Supervisor(None, None, RunnerConfig(), on_end=lambda: None, artifacts=artifacts)  # it prunes only
    await supervisor._prune(state)
    assert {f.path for f in artifacts.segment_files("j")} == {logged.path, later.path}, unlogged.path
    running, _ = store.append("j", [Running(attempt=2, executor="fake"), SegmentDone(index=1, artifact=later)])
    writing = put(2, 2)
    await supervisor._prune(running)
    assert {f.path for f in artifacts.segment_files("j")} == {logged.path, later.path, writing.path}
    ended, _ = store.append("j", [SegmentDone(index=2, artifact=writing), Done(artifact=artifact("j/attempt-2.mp4"))])
    await supervisor._prune(ended)
    assert artifacts.segment_files("j") == []
