"""`Jobs`, the embedding API: submit, follow, wait/result, cancel, on a real runner and store."""

from __future__ import annotations

import anyio
import pytest

from h3core import (
    FakeExecutor,
    FakePlan,
    JobCancelled,
    JobFailed,
    Jobs,
    LocalArtifactStore,
    MemoryEventStore,
    NotCancellable,
    RetryPolicy,
    RunnerConfig,
    SQLiteEventStore,
    UnknownJob,
)
from h3core.adapters.lock import LockHeld
from tests.factories import request
from tests.unit.conftest import wait_until

pytestmark = pytest.mark.anyio

CONFIG = RunnerConfig(poll_interval_s=0.05, cancel_grace_s=2.0, retry=RetryPolicy(max_attempts=1))


def jobs_on(tmp_path, store=None, plan: FakePlan | None = None, **config) -> Jobs:
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    executor = FakeExecutor(artifacts, default=plan)
    cfg = CONFIG.model_copy(update=config)
    return Jobs(tmp_path / "h3.db" if store is None else store, executor, artifacts=artifacts, config=cfg)


async def test_a_job_runs_to_done_and_follow_sees_every_event_once_in_order(tmp_path):
    async with jobs_on(tmp_path, plan=FakePlan(step_seconds=0.01)) as jobs:
        job = await jobs.submit(request(steps=5))
        assert job.status == "queued"
        seen = [e async for e in jobs.follow(job.job_id)]
        state = await jobs.result(job.job_id)
        stored = await jobs.events(job.job_id)
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
    assert seen == stored
    assert [e.type for e in seen] == ["submitted", "admitted", "running"] + ["progress"] * 5 + ["done"]
    assert state.status == "done" and state.artifact is not None
    assert (tmp_path / "artifacts" / state.artifact.path).stat().st_size == state.artifact.bytes


async def test_followers_started_at_any_moment_miss_nothing(tmp_path):
    """Subscribe before read: followers joining before, during and after the run see one log."""
    async with jobs_on(tmp_path, store=MemoryEventStore(), plan=FakePlan(step_seconds=0.005)) as jobs:
        job = await jobs.submit(request(steps=20))
        logs: list[list[int]] = []

        async def follow() -> None:
            logs.append([e.seq async for e in jobs.follow(job.job_id)])

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await wait_until(lambda: jobs.runner.store.get(job.job_id).status == "running")
            tg.start_soon(follow)
            await wait_until(lambda: (jobs.runner.store.get(job.job_id).step or 0) >= 10)
            tg.start_soon(follow)
        tg_done = await jobs.wait(job.job_id)
        logs.append([e.seq async for e in jobs.follow(job.job_id)])  # after the end: the history
        tail = [e.seq async for e in jobs.follow(job.job_id, after_seq=20)]
    full = list(range(1, tg_done.last_seq + 1))
    assert logs == [full] * 4
    assert tail == list(range(21, tg_done.last_seq + 1))


async def test_a_failed_job_waits_to_failed_and_result_raises_naming_its_kind(tmp_path):
    async with jobs_on(tmp_path) as jobs:
        job = await jobs.submit(request(prompt="a fox [fake fail_at=2 kind=oom]"))
        state = await jobs.wait(job.job_id)
        assert state.status == "failed" and state.error.kind == "oom"
        with pytest.raises(JobFailed, match=rf"job {job.job_id} failed \(oom: ") as caught:
            await jobs.result(job.job_id)
    assert caught.value.state == state


async def test_cancel_ends_a_running_job_and_a_queued_one(tmp_path):
    async with jobs_on(tmp_path, plan=FakePlan(hang_at=1)) as jobs:
        running = await jobs.submit(request())
        queued = await jobs.submit(request(seed=1))  # one slot: it waits behind the first
        await wait_until(lambda: jobs.runner.store.get(running.job_id).status == "running")
        assert (await jobs.cancel(queued.job_id)).status == "cancelled"  # at once
        assert (await jobs.cancel(running.job_id)).cancel_requested
        assert (await jobs.wait(running.job_id)).status == "cancelled"
        with pytest.raises(JobCancelled, match=f"job {running.job_id} was cancelled"):
            await jobs.result(running.job_id)
        with pytest.raises(NotCancellable):
            await jobs.cancel(queued.job_id)


async def test_unknown_jobs_are_refused_by_every_method(tmp_path):
    async with jobs_on(tmp_path, store=MemoryEventStore()) as jobs:
        for call in (jobs.get, jobs.events, jobs.wait, jobs.result, jobs.cancel):
            with pytest.raises(UnknownJob):
                await call("nope")
        with pytest.raises(UnknownJob):
            async for _ in jobs.follow("nope"):
                pass


async def test_a_store_path_takes_the_runner_lock_and_keeps_the_jobs(tmp_path):
    async with jobs_on(tmp_path) as jobs:
        job = await jobs.submit(request())
        await jobs.result(job.job_id)
        with pytest.raises(LockHeld):
            async with jobs_on(tmp_path):
                pass  # pragma: no cover
    async with jobs_on(tmp_path) as again:  # released at exit: a later one opens the same store
        assert (await again.get(job.job_id)).status == "done"
    with pytest.raises(RuntimeError, match="not open"):
        await jobs.get(job.job_id)


@pytest.mark.parametrize("attempts", [1, 2])
async def test_closing_while_a_job_runs_hands_it_back_and_the_next_start_continues_it(tmp_path, attempts):
    """A graceful stop is not a failure, whatever the retry budget: the attempt checkpoints where
    it stops and is `released`, the waiter is told the runner stopped, and the next start
    continues after that step, spending no attempt of the budget."""
    outcomes: list[str] = []
    plans = {1: FakePlan(hang_at=3), 2: FakePlan(step_seconds=0.01)}
    async with anyio.create_task_group() as tg:
        async with jobs_on(tmp_path, plan=plans[1], retry=RetryPolicy(max_attempts=attempts)) as jobs:
            job = await jobs.submit(request(steps=6))

            async def waiter() -> None:
                try:
                    outcomes.append((await jobs.wait(job.job_id)).status)
                except Exception as exc:
                    outcomes.append(type(exc).__name__)

            tg.start_soon(waiter)
            await wait_until(lambda: jobs.runner.store.get(job.job_id).step == 2)
    assert outcomes == ["ShuttingDown"]
    store = SQLiteEventStore(tmp_path / "h3.db")
    try:
        state = store.get(job.job_id)
        assert (state.status, state.released, state.spent, state.attempt_errors) == ("queued", 1, 0, ())
        assert state.checkpoint is not None and state.checkpoint.step == 2, "checkpointed where it stopped"
    finally:
        store.close()
    async with jobs_on(tmp_path, plan=plans[2], retry=RetryPolicy(max_attempts=attempts)) as again:
        done = await again.result(job.job_id)
        events = await again.events(job.job_id)
    assert done.status == "done" and done.spent == 1
    second = [e.body for e in events if e.seq > state.last_seq]
    assert [b.type for b in second[:2]] == ["running", "restored"]
    assert [b.step for b in second if b.type == "progress"] == [3, 4, 5, 6], "no step computed twice"


async def test_a_store_the_caller_owns_stays_open(tmp_path):
    store = SQLiteEventStore(tmp_path / "own.db", durable=False)
    try:
        async with jobs_on(tmp_path, store=store) as jobs:
            job = await jobs.submit(request())
            await jobs.result(job.job_id)
        assert store.get(job.job_id).status == "done"
    finally:
        store.close()


async def test_a_quality_level_the_executor_does_not_run_is_refused_naming_it(tmp_path):
    from h3core import Refused
    from h3core.executors.fake import FakeLimits

    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    executor = FakeExecutor(artifacts, limits=FakeLimits(qualities=("exact",)))
    async with Jobs(None, executor, artifacts=artifacts, config=CONFIG) as jobs:
        with pytest.raises(Refused, match="quality fast is not run by fake") as caught:
            await jobs.submit(request(quality="fast"))
        assert caught.value.decision.field == "quality"
        assert (await jobs.submit(request(quality="exact"))).status == "queued"
