"""Groups of Ray actors through the runner: progress, failures that take a rank down, cancel,
and groups working side by side.

The tests that leave their group serving (after a rebuild where they broke it) share one runner
with one two-rank group (`group`), in this order; each clears the faults it injected and counts
rebuilds from where it found them. The watchdog and the one-rank groups need settings of their
own, and build their own runner."""

from __future__ import annotations

import os
import time

import av
import pytest

from tests.integration.distributed import faults
from tests.integration.distributed.conftest import ended, kill_rank, on_rank, req, running_groups, steps_seen, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300), pytest.mark.ray]


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"  # module scope: the shared runner lives across this module's tests


@pytest.fixture(scope="module")
async def shared(tmp_path_factory, tiny_model, ray_host):
    # No watchdog round: a rank that dies while idle must be found by the next job's check.
    # A collective times out after 60 s, well past every bound the tests assert.
    root = tmp_path_factory.mktemp("shared-group")
    async with running_groups(root, tiny_model, ray_host, watchdog_s=3600.0, timeout_s=60.0) as runner:
        yield runner


@pytest.fixture
async def group(shared):
    """The shared runner, its group ready and without injected faults after the test."""
    await until(lambda: shared.executor.health()[0].state == "ready", timeout=120)
    yield shared
    await until(lambda: shared.executor.health()[0].state == "ready", timeout=120)
    for rank in (0, 1):
        on_rank(shared.executor, 0, rank, faults.clear)


def progress(runner, job_id):
    return [(e.body.step, e.body.total) for e in runner.store.events(job_id) if e.type == "progress"]


async def rebuilt_and_serving(runner, before: int) -> None:
    """The group was rebuilt once since it had `before` rebuilds, and the next job runs on it."""
    await until(lambda: runner.executor.health()[0].state == "ready", timeout=120)
    assert runner.executor.health()[0].rebuilds == before + 1
    nxt = await runner.submit(req(steps=3))
    assert (await ended(runner, nxt.job_id)).status == "done"


async def test_a_job_on_a_two_rank_group_reports_every_step_and_writes_video(group):
    runner = group
    job = await runner.submit(req(steps=5))
    state = await ended(runner, job.job_id)
    (health,) = runner.executor.health()
    assert state.status == "done", state.error
    assert progress(runner, job.job_id) == [(i, 5) for i in range(1, 6)]
    running = runner.store.events(job.job_id)[2].body
    assert running.info["groups"] == "2" and running.info["parallel"] == "fsdp+ulysses"
    # Decided once at start, run by every rank: what the event names is what each rank installed.
    assert running.info["attention"] == "flash (asked auto)" and {r["attention"] for r in health.ranks} == {"flash (asked flash)"}
    assert [r.kernel for r in runner.executor.attention_report() if r.verdict == "chosen"] == ["flash"]
    assert runner.executor.capabilities().max_tokens is None
    with av.open(str(runner.executor.artifacts.resolve(state.artifact.path))) as c:
        assert sum(1 for _ in c.decode(video=0)) == 22
        assert c.streams.audio[0].channels == 2
    assert health.state == "ready" and health.builds == health.rebuilds + 1
    assert [r["rank"] for r in health.ranks] == [0, 1] and len({r["pid"] for r in health.ranks}) == 2
    assert runner.store.events(job.job_id)[-1].body.steps.computed == 5
    # A faster level on the group: the level in `running`, the steps the ranks agreed to serve in `done`.
    fast = await ended(runner, (await runner.submit(req(steps=8, quality="fast"))).job_id)
    assert fast.status == "done", fast.error
    log = runner.store.events(fast.job_id)
    assert next(e.body.info for e in log if e.type == "running")["quality"] == "fast"
    counts = log[-1].body.steps
    assert counts.quality == "fast" and counts.computed + counts.cached == 8 and counts.cached > 0, counts


async def test_the_ranks_run_at_the_priority_of_the_process_that_started_ray(group):
    """Not at Ray's default nice 15 for workers, where any busy process starves the group."""
    assert [on_rank(group.executor, 0, rank, faults.niceness) for rank in (0, 1)] == [os.nice(0)] * 2


async def test_killing_a_rank_mid_job_fails_it_as_executor_lost_and_the_group_is_rebuilt(group):
    runner, executor = group, group.executor
    before = executor.health()[0].rebuilds
    on_rank(executor, 0, 0, faults.slow, 0.3)
    job = await runner.submit(req(steps=40))
    await steps_seen(runner, job.job_id, 2)
    pid = kill_rank(executor, 0, 1)
    killed = time.monotonic()
    state = await ended(runner, job.job_id, timeout=30)
    took = time.monotonic() - killed
    assert state.status == "failed" and state.error.kind == "executor_lost", state.error
    assert "rank 1 of group 0" in state.error.message and str(pid) in state.error.message
    print(f"failed {took:.1f} s after the kill")
    await rebuilt_and_serving(runner, before)


async def test_an_oom_on_rank_1_fails_the_job_as_oom_without_a_hang_and_the_next_job_runs(group):
    runner, executor = group, group.executor
    before = executor.health()[0].rebuilds
    on_rank(executor, 0, 1, faults.oom_on_call, 2)
    job = await runner.submit(req(steps=6))
    # Rank 0 waits in a collective for rank 1, which will never come; the job must not wait out
    # the collective's timeout (60 s here).
    state = await ended(runner, job.job_id, timeout=20)
    assert state.status == "failed" and state.error.kind == "oom", state.error
    assert "rank 1" in state.error.message and "group 0" in state.error.message
    assert "token sequence" in state.error.message
    assert progress(runner, job.job_id) == [(1, 6)]
    await rebuilt_and_serving(runner, before)


async def test_cancel_mid_job_stops_both_ranks_at_a_step_boundary_and_keeps_the_group(group):
    runner, executor = group, group.executor
    before = executor.health()[0].rebuilds
    jobs_before = [on_rank(executor, 0, rank, faults.jobs)[0] for rank in (0, 1)]
    on_rank(executor, 0, 1, faults.slow, 0.2)  # rank 1 is the slow one: rank 0 still decides the stop
    job = await runner.submit(req(steps=40))
    await steps_seen(runner, job.job_id, 2)
    await runner.cancel(job.job_id)
    state = await ended(runner, job.job_id, timeout=30)
    assert state.status == "cancelled"
    assert len(progress(runner, job.job_id)) < 10
    for rank in (0, 1):
        jobs, busy = on_rank(executor, 0, rank, faults.jobs)
        assert (jobs, busy) == (jobs_before[rank] + 1, False)
    assert executor.health()[0].rebuilds == before
    nxt = await runner.submit(req(steps=3))
    assert (await ended(runner, nxt.job_id)).status == "done"


async def test_two_one_rank_groups_run_two_jobs_at_once(make_runner, group):
    # Built beside the shared runner's group on the same Ray (as a second service joining one
    # cluster would be): group names are the executors' own, so neither takes the other's.
    assert group.executor.health()[0].state == "ready"
    async with make_runner(devices=2, group_size="1") as runner:
        executor = runner.executor
        for index in (0, 1):
            on_rank(executor, index, 0, faults.slow, 0.2)
        a = await runner.submit(req(steps=8, seed=1))
        b = await runner.submit(req(steps=8, seed=2))
        await steps_seen(runner, a.job_id, 1)
        await steps_seen(runner, b.job_id, 1)
        # Both have stepped before either finished: they ran side by side, one per group.
        assert not runner.store.get(a.job_id).terminal and not runner.store.get(b.job_id).terminal
        assert (await ended(runner, a.job_id)).status == "done"
        assert (await ended(runner, b.job_id)).status == "done"
        assert [h.size for h in executor.health()] == [1, 1]
    assert group.executor.health()[0].state == "ready"


async def test_the_watchdog_rebuilds_an_idle_group_whose_rank_died(make_runner):
    async with make_runner(watchdog_s=0.5) as runner:
        executor = runner.executor
        kill_rank(executor, 0, 0)
        await until(lambda: executor.health()[0].rebuilds == 1 and executor.health()[0].state == "ready", timeout=120)
        assert "did not answer a ping" in executor.health()[0].last_error
        job = await runner.submit(req(steps=2))
        assert (await ended(runner, job.job_id)).status == "done"


async def test_a_rank_that_died_while_idle_is_found_before_the_next_job_not_by_it(group):
    runner, executor = group, group.executor  # its runner has no watchdog round
    before = executor.health()[0].rebuilds
    kill_rank(executor, 0, 1)
    job = await runner.submit(req(steps=2))
    state = await ended(runner, job.job_id)
    assert state.status == "done" and state.attempt == 1, state.attempt_errors
    assert "attempt_failed" not in [e.type for e in runner.store.events(job.job_id)]
    assert executor.health()[0].rebuilds == before + 1
