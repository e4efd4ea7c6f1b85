"""The runner's terminal guarantee, case by case (the stateful property test mixes them)."""

from __future__ import annotations

import hashlib
import threading

import anyio
import av
import pytest

from h3core import (
    Admitted,
    Artifact,
    FakePlan,
    GenerationRequest,
    IdempotencyMismatch,
    LocalArtifactStore,
    NotCancellable,
    Progress,
    Refuse,
    Refused,
    RetryPolicy,
    RunnerConfig,
    Running,
    SQLiteEventStore,
    Submissions,
)
from h3core.adapters.artifacts import sha256_file
from h3core.domain.checkpoints import CheckpointPolicy
from h3core.executors.base import FinishedBeforeStop, Result
from h3core.executors.fake import _render_mp4
from h3core.runtime._supervisor import PROGRESS_IN_FLIGHT
from tests.factories import request, submitted
from tests.unit.conftest import wait_until

pytestmark = pytest.mark.anyio


def types(runner, job_id):
    return [e.type for e in runner.store.events(job_id)]


def ended(runner, *job_ids):
    return lambda: all(runner.store.get(j).terminal for j in job_ids)


async def test_a_job_runs_to_done_with_one_progress_event_per_step_and_a_real_video(make_runner):
    async with make_runner() as runner:
        job = await runner.submit(request(steps=4, frames=30, width=96, height=64))
        await wait_until(ended(runner, job.job_id))
    assert types(runner, job.job_id) == ["submitted", "admitted", "running"] + ["progress"] * 4 + ["done"]
    state = runner.store.get(job.job_id)
    path = runner.executor.artifacts.resolve(state.artifact.path)
    assert state.artifact.bytes == path.stat().st_size
    assert state.artifact.sha256 == sha256_file(path)
    with av.open(str(path)) as container:
        assert container.streams.audio, "the video carries an audio stream"
        assert sum(1 for _ in container.decode(video=0)) == 30


@pytest.mark.parametrize(
    ("plan", "kind", "text"),
    [
        ("fail_at=2 kind=oom", "oom", "out of memory"),
        ("fail_at=1", "executor_error", "RuntimeError: fake executor failed at step 1"),
        ("fail_at=3 kind=invalid", "invalid", "'invalid' at step 3"),
        ("no_result", "executor_error", "without a result"),
        ("hang_at=2", "stalled", "no progress for 0.3s (last step 1/4)"),
    ],
)
async def test_every_way_an_executor_fails_ends_the_job_once(make_runner, plan, kind, text):
    async with make_runner(stall_timeout_s=0.3) as runner:
        job = await runner.submit(request(steps=4, prompt=f"x [fake {plan}]"))
        await wait_until(ended(runner, job.job_id))
    state = runner.store.get(job.job_id)
    assert state.status == "failed" and state.error.kind == kind and text in state.error.message
    assert types(runner, job.job_id)[-1] == "failed"
    assert runner.executor.cleanups == runner.executor.runs


async def test_an_attempt_past_its_deadline_fails_as_deadline(make_runner):
    async with make_runner(attempt_deadline_s=0.3) as runner:
        job = await runner.submit(request(steps=100, prompt="x [fake step=0.05]"))
        await wait_until(ended(runner, job.job_id))
    assert runner.store.get(job.job_id).error.kind == "deadline"


async def test_a_retryable_failure_runs_a_new_attempt(make_runner):
    async with make_runner() as runner:
        job = await runner.submit(request(steps=3, prompt="x [fake fail_at=2 kind=executor_lost fail_attempts=1]"))
        await wait_until(ended(runner, job.job_id))
    events = runner.store.events(job.job_id)
    assert [e.type for e in events] == [
        "submitted",
        "admitted",
        "running",
        "progress",
        "attempt_failed",
        "running",
        "progress",
        "progress",
        "progress",
        "done",
    ]
    assert [e.body.attempt for e in events if e.type == "running"] == [1, 2]
    assert runner.store.get(job.job_id).attempt_errors[0].kind == "executor_lost"


async def test_retries_stop_at_the_policy_limit(make_runner):
    async with make_runner() as runner:
        job = await runner.submit(request(steps=3, prompt="x [fake fail_at=1 kind=executor_lost]"))
        await wait_until(ended(runner, job.job_id))
    state = runner.store.get(job.job_id)
    assert state.status == "failed" and state.attempt == 2 and state.error.kind == "executor_lost"


async def test_cancelling_a_queued_job_ends_it_at_once(make_runner):
    async with make_runner(plan=FakePlan(step_seconds=0.05)) as runner:
        first = await runner.submit(request(steps=50))
        queued = await runner.submit(request(steps=50))
        await wait_until(lambda: runner.store.get(first.job_id).status == "running")
        state = await runner.cancel(queued.job_id)
        assert state.status == "cancelled"
        await runner.cancel(first.job_id)
        await wait_until(ended(runner, first.job_id))
    assert types(runner, queued.job_id) == ["submitted", "admitted", "cancelled"]


async def test_cancelling_a_running_job_stops_the_executor_within_a_step(make_runner):
    async with make_runner(plan=FakePlan(step_seconds=0.05)) as runner:
        job = await runner.submit(request(steps=200))
        await wait_until(lambda: (runner.store.get(job.job_id).step or 0) >= 3)
        state = await runner.cancel(job.job_id)
        assert state.cancel_requested and state.status == "running"
        await wait_until(ended(runner, job.job_id))
        with pytest.raises(NotCancellable):
            await runner.cancel(job.job_id)
    events = runner.store.events(job.job_id)
    assert [e.type for e in events][-1] == "cancelled"
    at_request = next(e for e in events if e.type == "cancel_requested")
    after = [e for e in events if e.seq > at_request.seq and e.type == "progress"]
    assert len(after) <= 1, "the executor stops within one step"
    assert runner.executor.cleanups == 1


async def test_a_cancel_during_the_final_encode_comes_too_late_the_job_ends_done_with_its_video(make_runner):
    async with make_runner(plan=FakePlan(step_seconds=0.01, encode_seconds=0.5)) as runner:
        job = await runner.submit(request(steps=3))
        await wait_until(lambda: job.job_id in runner.executor.finishing)
        state = await runner.cancel(job.job_id, wait_s=10)  # answered once the job has ended
    assert state.status == "done" and state.cancel_requested and state.artifact is not None
    assert state == runner.store.get(job.job_id)
    assert runner.executor.artifacts.resolve(state.artifact.path).stat().st_size == state.artifact.bytes
    events = runner.store.events(job.job_id)
    assert [e.type for e in events][-2:] == ["cancel_requested", "done"] and events[-1].body.cancel_too_late


async def test_an_executor_whose_work_finished_as_it_was_being_stopped_ends_done_not_cancelled(make_runner):
    """An executor's cleanup raises `FinishedBeforeStop` where the stop found its work finished
    (a ComfyUI prompt that succeeded meanwhile): the runner keeps that result."""
    finished = Artifact(path="x.mp4", bytes=0, sha256="0" * 64, frames=1, duration_s=0.04)

    async def finishes_anyway(job):
        try:
            yield Progress(step=1, total=2)
            await anyio.sleep_forever()
        finally:
            raise FinishedBeforeStop(Result(finished))

    async with make_runner() as runner:
        runner.executor.run = finishes_anyway
        job = await runner.submit(request(steps=2))
        await wait_until(lambda: runner.store.get(job.job_id).step == 1)
        state = await runner.cancel(job.job_id, wait_s=10)
    assert state.status == "done" and state.artifact == finished
    assert runner.store.events(job.job_id)[-1].body.cancel_too_late


async def test_a_cancel_that_takes_effect_is_answered_with_the_cancelled_job_when_asked_to_wait(make_runner):
    async with make_runner(plan=FakePlan(step_seconds=0.05)) as runner:
        job = await runner.submit(request(steps=1000))
        await wait_until(lambda: runner.store.get(job.job_id).step)
        state = await runner.cancel(job.job_id, wait_s=10)
    assert state.status == "cancelled" and state == runner.store.get(job.job_id)


async def test_an_executor_that_will_not_stop_still_ends_after_the_grace_period_failed_not_cancelled(make_runner):
    async with make_runner(plan=FakePlan(step_seconds=0.05, cleanup_seconds=4.0), cancel_grace_s=0.2) as runner:
        job = await runner.submit(request(steps=200))
        await wait_until(lambda: runner.store.get(job.job_id).status == "running")
        await runner.cancel(job.job_id)
        await wait_until(ended(runner, job.job_id))  # before its cleanup ends: `cleanups == 0` below
        state = runner.store.get(job.job_id)
        # Not `cancelled`: nothing confirmed that its work stopped.
        assert state.status == "failed" and state.error.kind == "stop_unconfirmed"
        assert state.error.message == "cancelled by request, but the executor did not stop within 0.2s: its work may still run"
        assert runner.executor.cleanups == 0
        # Its slot stays taken until the cleanup really finishes; then the next job runs.
        nxt = await runner.submit(request(steps=2))
        await wait_until(ended(runner, nxt.job_id), timeout=15)
        assert runner.executor.cleanups >= 1


@pytest.mark.parametrize("outcome", ["finished", "stopped", "never"])
async def test_an_executor_that_follows_its_work_after_a_stop_keeps_the_job_and_its_slot_until_that_work_ends(
    make_runner, outcome
):
    """An executor that states how long it may follow its work after a stop (`stop_wait_s`: a
    ComfyUI prompt runs on until an interrupt lands) is waited for past the cancel grace: the job
    ends as that work did, and the next job starts only once it no longer runs. Past that bound
    the job fails `stop_unconfirmed`, its slot still held until the cleanup ends."""
    finished = Artifact(path="x.mp4", bytes=0, sha256="0" * 64, frames=1, duration_s=0.04)
    released, following, started_while_following = anyio.Event(), set(), []

    async def follows(job):
        if job.request.steps != 2:  # the next job: runs at once
            started_while_following.append(bool(following))
            yield Result(finished)
            return
        try:
            yield Progress(step=1, total=2)
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):  # following the work until the test says it ended
                following.add(job.job_id)
                await released.wait()
                following.discard(job.job_id)
            if outcome == "finished":
                raise FinishedBeforeStop(Result(finished))

    stop_wait_s = 0.2 if outcome == "never" else 60.0
    async with make_runner(cancel_grace_s=0) as runner:
        try:
            caps = runner.executor.capabilities
            runner.executor.capabilities = lambda: caps().model_copy(update={"stop_wait_s": stop_wait_s})
            runner.executor.run = follows
            job = await runner.submit(request(steps=2))
            await wait_until(lambda: runner.store.get(job.job_id).step == 1)
            nxt = await runner.submit(request(steps=3))
            await runner.cancel(job.job_id)
            await wait_until(lambda: following)
            if outcome == "never":
                await wait_until(ended(runner, job.job_id))
                state = runner.store.get(job.job_id)
                assert state.status == "failed" and state.error.kind == "stop_unconfirmed"
                assert state.error.message.endswith("did not stop within 0.2s: its work may still run")
            else:
                await anyio.sleep(0.3)  # well past the grace (0 s): a job ended at the grace would be by now
                assert runner.store.get(job.job_id).status == "running", "its work runs on: not ended at the grace"
            assert runner.store.get(nxt.job_id).status == "queued", "its slot is held while the work may run"
            released.set()  # the work ends
            await wait_until(ended(runner, job.job_id, nxt.job_id))
            state = runner.store.get(job.job_id)
            assert runner.store.get(nxt.job_id).status == "done"
        finally:
            released.set()  # also when an assertion fails: the runner waits for the cleanup to end
    assert started_while_following == [False], "the next job started once the work no longer ran"
    if outcome == "finished":
        assert state.status == "done" and state.artifact == finished
        assert runner.store.events(job.job_id)[-1].body.cancel_too_late
    elif outcome == "stopped":
        assert state.status == "cancelled"


async def test_a_retried_job_whose_executor_is_still_stopping_is_not_started_twice(make_runner):
    # Past its deadline the attempt is ended (a retry: queued again) while the executor's
    # cleanup still runs; a free slot must not start the same job beside it.
    plan = FakePlan(step_seconds=0.05, cleanup_seconds=1.0)
    # Ending without the executor's stop confirmed is `stop_unconfirmed`; this policy retries it.
    retry = RetryPolicy(max_attempts=2, retry_on=("deadline", "stop_unconfirmed"))
    async with make_runner(plan=plan, slots=2, attempt_deadline_s=0.3, cancel_grace_s=0.1, retry=retry) as runner:
        real, cleaned_at_start = runner.executor.run, {}

        def run(spec):  # what had been cleaned up when each attempt began
            cleaned_at_start[spec.attempt] = runner.executor.cleanups
            return real(spec)

        runner.executor.run = run
        job = await runner.submit(request(steps=200))
        # The second attempt's `running` is stored when it is claimed; its executor starts just after.
        await wait_until(lambda: 2 in cleaned_at_start, timeout=10)
        assert cleaned_at_start == {1: 0, 2: 1}, "the second attempt began after the first one's cleanup"
        await runner.cancel(job.job_id)


async def test_free_slots_are_filled_from_one_read_of_the_queue(make_runner, tmp_path):
    store = SQLiteEventStore(tmp_path / "claims.db", durable=False)
    ids = [(await Submissions(store).submit(request(steps=2))).state.job_id for _ in range(6)]
    reads = []
    queued = store.queued
    store.queued = lambda limit, exclude=(), modes=None: reads.append(limit) or queued(limit, exclude, modes)
    async with make_runner(plan=FakePlan(step_seconds=0.2), store=store, slots=4) as runner:
        await wait_until(lambda: sum(store.get(j).status == "running" for j in ids) == 4)
        assert reads == [4], "the four free slots took four jobs with one read"
        assert runner.writer.batches == 1, "and started them in one commit"
        await wait_until(ended(runner, *ids), timeout=10)
    assert all(store.get(j).status == "done" for j in ids)


async def test_the_executor_does_not_wait_for_each_progress_event_to_be_written(make_runner, tmp_path):
    store = SQLiteEventStore(tmp_path / "slow.db", durable=False)
    job = (await Submissions(store).submit(request(steps=40))).state.job_id
    gate, yielded = threading.Event(), []
    append_batch = store.append_batch

    def held(items):  # the disk is slow: no progress event is written until the test says so
        if any(b.type == "progress" for _, bodies, _ in items for b in bodies):
            gate.wait(10)
        return append_batch(items)

    store.append_batch = held

    async with make_runner(store=store, checkpoints=CheckpointPolicy()) as runner:  # progress alone in flight
        real = runner.executor.run

        async def counted(spec):
            async for update in real(spec):
                if isinstance(update, Progress):
                    yielded.append(update.step)
                yield update

        runner.executor.run = counted
        # Not one progress event is written, yet the executor ran on: up to PROGRESS_IN_FLIGHT queued.
        await wait_until(lambda: len(yielded) == PROGRESS_IN_FLIGHT + 1)
        await anyio.sleep(0.1)
        assert len(yielded) == PROGRESS_IN_FLIGHT + 1, "and no further than that"
        assert types(runner, job) == ["submitted", "admitted", "running"]
        gate.set()
        await wait_until(ended(runner, job))
    assert types(runner, job) == ["submitted", "admitted", "running"] + ["progress"] * 40 + ["done"]
    assert [e.body.step for e in store.events(job) if e.type == "progress"] == list(range(1, 41))


async def test_stopping_the_runner_mid_job_hands_it_back_and_a_restart_finishes_it(make_runner, tmp_path):
    store = SQLiteEventStore(tmp_path / "shared.db", durable=False)
    async with make_runner(plan=FakePlan(step_seconds=0.05), store=store) as runner:
        job = await runner.submit(request(steps=40))
        await wait_until(lambda: (store.get(job.job_id).step or 0) >= 2)
    # The runner's own task was cancelled: the job is not left running, and no failure is recorded.
    state = store.get(job.job_id)
    assert state.status == "queued" and state.released == 1 and state.attempt_errors == ()
    assert store.events(job.job_id)[-1].type == "released"
    async with make_runner(plan=FakePlan(step_seconds=0.0), store=store) as runner:
        await wait_until(ended(runner, job.job_id))
    done = store.get(job.job_id)
    assert done.status == "done" and done.attempt == 2 and done.spent == 1


async def test_recovery_ends_jobs_a_dead_process_left_running(make_runner, tmp_path):
    store = SQLiteEventStore(tmp_path / "crashed.db", durable=False)
    store.append("dead", [submitted(), Admitted(), Running(attempt=1, executor="fake"), Progress(step=1, total=4)])
    from h3core.domain.retry import RetryPolicy

    no_retry = submitted(retry=RetryPolicy(max_attempts=1))
    store.append("dead2", [no_retry, Admitted(), Running(attempt=1, executor="fake")])
    async with make_runner(store=store) as runner:
        await wait_until(ended(runner, "dead", "dead2"))
    assert types(runner, "dead")[4:6] == ["attempt_failed", "running"]
    assert store.get("dead").status == "done"
    assert store.get("dead2").status == "failed" and store.get("dead2").error.kind == "interrupted"


def _committed_before_a_crash(store, artifacts, job_id: str, *, attempt: int = 1) -> Artifact:
    """A job left running by a dead process whose attempt had committed its video: the executor's
    write path (staging, commit) ran, the runner's Done did not."""
    store.append(job_id, [submitted(), Admitted(), Running(attempt=attempt, executor="fake"), Progress(step=4, total=4)])
    staged = artifacts.staging(job_id, attempt)
    staged.write_bytes(b"\x00\x00\x00\x18ftypmp42 a finished video")
    return artifacts.commit(staged, job_id=job_id, attempt=attempt, frames=24, duration_s=1.0)


async def test_recovery_adopts_a_video_committed_before_the_crash_instead_of_running_again(make_runner, tmp_path):
    store = SQLiteEventStore(tmp_path / "crashed.db", durable=False)
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    committed = _committed_before_a_crash(store, artifacts, "finished")
    async with make_runner(store=store) as runner:
        await wait_until(ended(runner, "finished"))
        assert runner.executor.runs == 0, "nothing ran again"
    state = store.get("finished")
    assert (state.status, state.attempt, state.artifact, state.recovered) == ("done", 1, committed, committed)
    assert types(runner, "finished")[-2:] == ["recovered", "done"]
    assert sha256_file(artifacts.resolve(state.artifact.path)) == committed.sha256


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-3]), "bytes"),
        (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"X"), "sha256"),
        (lambda p: p.unlink(), "missing"),
    ],
    ids=["truncated", "corrupted", "deleted"],
)
async def test_recovery_reruns_an_attempt_whose_committed_video_does_not_check(make_runner, tmp_path, damage, why):
    store = SQLiteEventStore(tmp_path / "crashed.db", durable=False)
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    committed = _committed_before_a_crash(store, artifacts, "damaged")
    damage(artifacts.resolve(committed.path))
    async with make_runner(store=store) as runner:
        await wait_until(ended(runner, "damaged"))
    state = store.get("damaged")
    assert state.status == "done" and state.attempt == 2 and state.recovered is None
    assert why in state.attempt_errors[0].message and state.attempt_errors[0].kind == "interrupted"
    assert [f.path for f in artifacts.files()] == ["damaged/attempt-2.mp4", "damaged/attempt-2.record.json"]


@pytest.mark.parametrize(
    "left",
    [lambda: b"half a video", lambda: _render_mp4(64, 64, 24, 5)[:-9], lambda: _render_mp4(64, 64, 23, 5)],
    ids=["bytes", "cut", "other-frames"],
)
async def test_recovery_clears_the_partial_file_of_an_interrupted_attempt(make_runner, tmp_path, left):
    """A staged file that is not the attempt's whole video (cut short, or with other frames than
    its request makes) is never taken for it: the attempt ends interrupted and the file goes."""
    store = SQLiteEventStore(tmp_path / "crashed.db", durable=False)
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    store.append("partial", [submitted(retry=RetryPolicy(max_attempts=1)), Admitted(), Running(attempt=1, executor="fake")])
    artifacts.staging("partial", 1).write_bytes(left())
    async with make_runner(store=store) as runner:
        await wait_until(ended(runner, "partial"))
    assert store.get("partial").status == "failed" and store.get("partial").recovered is None
    assert artifacts.files() == []


async def test_recovery_adopts_a_whole_staged_video_a_crash_left_before_its_commits_record(make_runner, tmp_path):
    """The encoder had closed the file, the commit had not yet recorded it: recovery reads it whole
    with the frames the request makes, commits it, and the job ends done on that attempt."""
    store = SQLiteEventStore(tmp_path / "crashed.db", durable=False)
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    store.append("staged", [submitted(), Admitted(), Running(attempt=1, executor="fake"), Progress(step=4, total=4)])
    video = _render_mp4(64, 64, 24, 5)
    artifacts.staging("staged", 1).write_bytes(video)
    async with make_runner(store=store) as runner:
        await wait_until(ended(runner, "staged"))
        assert runner.executor.runs == 0, "the encode was not redone"
    state = store.get("staged")
    assert (state.status, state.attempt, state.artifact, state.recovered) == ("done", 1, state.recovered, state.artifact)
    assert types(runner, "staged")[-2:] == ["recovered", "done"]
    assert (state.artifact.path, state.artifact.frames, state.artifact.duration_s) == ("staged/attempt-1.mp4", 24, 1.0)
    assert state.artifact.sha256 == hashlib.sha256(video).hexdigest() == sha256_file(artifacts.resolve(state.artifact.path))


async def test_jobs_run_by_priority_then_in_submission_order(make_runner, tmp_path):
    store = SQLiteEventStore(tmp_path / "order.db", durable=False)
    submissions = Submissions(store)  # submitting needs no executor
    ids = [(await submissions.submit(request(steps=1), priority=p)).state.job_id for p in (0, 0, 3, 0)]
    async with make_runner(store=store) as running:
        await wait_until(ended(running, *ids))
    started = sorted(ids, key=lambda j: next(e.at for e in store.events(j) if e.type == "running"))
    assert started == [ids[2], ids[0], ids[1], ids[3]]


async def test_inert_fields_are_accepted_with_a_warning(make_runner):
    async with make_runner() as runner:
        job = await runner.submit(request(cfg_scale=5.0, turbo=True))
    assert len(job.warnings) == 2 and "cfg_scale" in job.warnings[0] and "turbo" in job.warnings[1]


async def test_a_frame_count_is_said_snapped_only_where_the_executor_makes_another(make_runner, tmp_path):
    from h3core.domain.capabilities import Capabilities
    from h3core.runtime.admission import LocalAdmission

    async with make_runner() as runner:  # the fake writes exactly the frames asked
        job = await runner.submit(request(frames=24))
        await wait_until(ended(runner, job.job_id))
    assert job.warnings == () and runner.store.get(job.job_id).artifact.frames == 24
    model = Capabilities(executor="pipeline")  # the model's 17n + 5
    submissions = Submissions(SQLiteEventStore(tmp_path / "model.db", durable=False), admission=LocalAdmission(lambda: model))
    job = (await submissions.submit(request(frames=24))).state
    assert job.warnings == ("24 frames snapped to 39: MiniMax-H3 makes 17n+5",)  # recorded with the job


async def test_idempotent_submission(make_runner):
    async with make_runner(plan=FakePlan(step_seconds=0.05)) as runner:
        a = await runner.submit(request(), idempotency_key="k")
        b = await runner.submit(request(), idempotency_key="k")
        assert a.job_id == b.job_id
        with pytest.raises(IdempotencyMismatch):
            await runner.submit(request(prompt="another"), idempotency_key="k")


async def test_a_remix_keeps_its_source_in_its_log_and_its_key_covers_it(make_runner, tmp_path):
    async with make_runner(plan=FakePlan(step_seconds=0.05)) as runner:
        source = await runner.submit(request())
        remix = await runner.submit(request(prompt="again"), remixed_from=source.job_id, idempotency_key="r")
        assert (
            await runner.submit(request(prompt="again"), remixed_from=source.job_id, idempotency_key="r")
        ).job_id == remix.job_id
        with pytest.raises(IdempotencyMismatch):
            await runner.submit(request(prompt="again"), remixed_from=None, idempotency_key="r")
    reopened = SQLiteEventStore(tmp_path / "h3.db")  # what a restarted service reads
    try:
        assert reopened.get(remix.job_id).remixed_from == source.job_id
        assert reopened.events(remix.job_id)[0].body.remixed_from == source.job_id
        assert reopened.get(source.job_id).remixed_from is None
    finally:
        reopened.close()


async def test_a_refused_request_never_becomes_a_job(make_runner):
    class RefuseAll:
        def decide(self, req: GenerationRequest, media=None):
            return Refuse(detail="too long")

    async with make_runner() as runner:
        runner.admission = RefuseAll()
        with pytest.raises(Refused, match="too long"):
            await runner.submit(request())
        assert runner.store.counts() == {}


async def test_an_executor_breaking_the_progress_contract_fails_the_job(make_runner):
    async def backwards(job):
        yield Progress(step=2, total=4)
        yield Progress(step=1, total=4)

    async with make_runner() as runner:
        runner.executor.run = backwards
        job = await runner.submit(request())
        await wait_until(ended(runner, job.job_id))
    state = runner.store.get(job.job_id)
    assert state.error.kind == "executor_error" and "does not advance" in state.error.message


async def test_an_executor_returning_something_that_is_not_an_artifact_fails_the_job(make_runner):
    async def sloppy(job):
        yield Result(artifact={"path": "x.mp4"})  # type: ignore[arg-type]

    async with make_runner() as runner:
        real = runner.executor.run
        runner.executor.run = sloppy
        job = await runner.submit(request())
        await wait_until(ended(runner, job.job_id))
        runner.executor.run = real
        nxt = await runner.submit(request(steps=1))
        await wait_until(ended(runner, nxt.job_id))  # the runner survived it
    state = runner.store.get(job.job_id)
    assert state.status == "failed" and state.error.kind == "executor_error" and "not an Artifact" in state.error.message
    assert runner.store.get(nxt.job_id).status == "done"


async def test_an_executor_yielding_after_its_result_fails_the_job(make_runner):
    async def chatty(job):
        yield Result(Artifact(path="x.mp4", bytes=0, sha256="0" * 64, frames=1, duration_s=0.04))
        yield Progress(step=1, total=1)

    async with make_runner() as runner:
        runner.executor.run = chatty
        job = await runner.submit(request())
        await wait_until(ended(runner, job.job_id))
    assert "after its result" in runner.store.get(job.job_id).error.message


async def test_subscribers_get_every_event_and_a_stuck_one_never_blocks_the_runner(make_runner):
    async with make_runner() as runner:
        async with runner.bus.subscribe() as live, runner.bus.subscribe() as stuck:
            job = await runner.submit(request(steps=3))
            await wait_until(ended(runner, job.job_id))
            seen = []
            while len(seen) < 7:
                seen.append((await live.receive()).type)
            assert seen == ["submitted", "admitted", "running", "progress", "progress", "progress", "done"]
        del stuck
    runner.bus._buffer = 2  # a subscriber that never reads is dropped, not waited on
    async with make_runner() as runner2:
        runner2.bus._buffer = 2
        async with runner2.bus.subscribe() as never_read:
            job = await runner2.submit(request(steps=20))
            await wait_until(ended(runner2, job.job_id))
            assert runner2.bus.subscribers == 0
            received = []
            with pytest.raises(anyio.EndOfStream):
                while True:
                    received.append(await never_read.receive())
            assert len(received) == 2


async def test_runner_config_is_validated():
    with pytest.raises(ValueError, match="slots"):
        RunnerConfig(slots=0)


async def test_done_and_oom_events_carry_the_requests_token_count(make_runner):
    from h3core.domain.geometry import count_tokens

    async with make_runner() as runner:  # by default admission is the executor's contract, which counts tokens
        ok = await runner.submit(request(steps=2, width=448, height=256, frames=48))
        oom = await runner.submit(request(steps=2, width=448, height=256, frames=96, prompt="x [fake fail_at=1 kind=oom]"))
        await wait_until(ended(runner, ok.job_id, oom.job_id))
    done_event = runner.store.events(ok.job_id)[-1].body
    failed_event = runner.store.events(oom.job_id)[-1].body
    assert done_event.tokens == count_tokens(runner.store.get(ok.job_id).request).total
    assert failed_event.kind == "oom" and failed_event.tokens == count_tokens(runner.store.get(oom.job_id).request).total


def test_a_resumed_attempt_was_unfollowed_since_its_detach_or_after_a_crash_since_the_runner_was_last_seen():
    from datetime import UTC, datetime, timedelta

    from h3core.domain.events import CancelRequested, Detached, Event, Resumed
    from h3core.runtime._recovery import unfollowed_since

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def log(*bodies):
        return [Event(job_id="j", seq=i + 1, at=t0 + timedelta(seconds=10 * i), body=b) for i, b in enumerate(bodies)]

    begun = [submitted(), Admitted(), Running(attempt=1, executor="comfyui", executor_ref="p"), Progress(step=1, total=9)]
    # A graceful stop: its `detached`, whatever came after it (a cancel stored meanwhile) or was written elsewhere.
    stopped = log(*begun, Detached(attempt=1, executor_ref="p"), CancelRequested())
    assert unfollowed_since(stopped, 1, t0 + timedelta(seconds=45)) == t0 + timedelta(seconds=40)
    # A crash: the last this attempt's runner wrote, or the last any runner wrote to the store if later;
    # a cancel another process stored is no sign of the runner.
    crashed = log(*begun, CancelRequested())
    assert unfollowed_since(crashed, 1, None) == t0 + timedelta(seconds=30)
    assert unfollowed_since(crashed, 1, t0 + timedelta(seconds=35)) == t0 + timedelta(seconds=35)
    # Detached before an earlier resume does not count for the run after it.
    again = log(*begun, Detached(attempt=1, executor_ref="p"), Resumed(attempt=1, executor_ref="p", after_s=1.0))
    assert unfollowed_since(again, 1, None) == t0 + timedelta(seconds=50)


async def test_an_unusable_checkpoint_is_rejected_and_the_one_before_it_is_used(make_runner, tmp_path):
    """The newest checkpoint's file was changed, the one before it is whole: the retry logs the
    first `checkpoint_rejected`, continues after the second's step, and ends with the video an
    uninterrupted run makes (the fake's video depends on every step's state). With every file
    gone, it starts from step 0."""
    store = SQLiteEventStore(tmp_path / "h3.db", durable=False)
    async with make_runner(plan=FakePlan(hang_at=7), store=store, checkpoints=CheckpointPolicy(every_steps=2)) as runner:
        job = (await runner.submit(request(steps=8))).job_id
        await wait_until(lambda: len(store.get(job).checkpoints) == 2 and store.get(job).checkpoint.step == 6)
    stopped = store.get(job)
    older, newest = stopped.checkpoints
    assert (older.step, newest.step) == (4, 6)
    path = tmp_path / "artifacts" / newest.path
    path.write_bytes(path.read_bytes()[:-1] + b"x")  # same size, other bytes
    async with make_runner(plan=FakePlan(), store=store) as runner:
        await wait_until(ended(runner, job))
    events = store.events(job)[stopped.last_seq :]
    assert [e.type for e in events[:3]] == ["running", "checkpoint_rejected", "restored"]
    assert events[1].body.checkpoint == newest and "sha256" in events[1].body.reason
    assert events[2].body.checkpoint == older
    assert [e.body.step for e in events if e.type == "progress"] == [5, 6, 7, 8]
    async with make_runner(plan=FakePlan(), store=store) as runner:
        again = (await runner.submit(request(steps=8))).job_id
        await wait_until(ended(runner, again))
    assert store.get(job).artifact.sha256 == store.get(again).artifact.sha256

    async with make_runner(plan=FakePlan(hang_at=5), store=store, checkpoints=CheckpointPolicy(every_steps=2)) as runner:
        gone = (await runner.submit(request(steps=8))).job_id
        await wait_until(lambda: (store.get(gone).checkpoint or older).step == 4 and store.get(gone).step == 4)
    for f in (tmp_path / "artifacts" / gone).glob("checkpoint-*"):
        f.unlink()
    async with make_runner(plan=FakePlan(), store=store) as runner:
        await wait_until(ended(runner, gone))
    later = [e for e in store.events(gone) if e.seq > 0]
    assert [e.body.reason for e in later if e.type == "checkpoint_rejected"] == ["its file is missing"] * 2
    assert not any(e.type == "restored" for e in later)
    assert store.get(gone).status == "done" and store.get(gone).artifact.sha256 == store.get(again).artifact.sha256
