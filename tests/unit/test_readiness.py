"""What is admitted is what runs: admission is the executor's own contract, and the runner starts
an attempt only in a mode the executor can run now; the others wait in the queue, visibly."""

from __future__ import annotations

import pytest

from h3core import FakeLimits, Refused
from tests.factories import request
from tests.unit.conftest import wait_until

pytestmark = pytest.mark.anyio


def looks(runner):
    """Count the runner's looks at what the executor can run (each claim makes one)."""
    calls = []
    real = runner.executor.capabilities

    def counted():
        calls.append(1)
        return real()

    runner.executor.capabilities = counted
    return calls


async def test_a_submit_beyond_the_executors_limits_is_refused_with_the_limit(make_runner):
    async with make_runner(limits=FakeLimits(modes=("t2va",), max_seconds=10.0)) as runner:
        with pytest.raises(Refused) as too_long:
            await runner.submit(request(frames=300))
        with pytest.raises(Refused) as other_mode:
            await runner.submit(request(mode="fl2va", keyframes={"first": "k1"}, frames=48))
        ok = await runner.submit(request(frames=221, steps=1))  # snaps to 226: 9.4 s
        await wait_until(lambda: runner.store.get(ok.job_id).terminal)
    assert too_long.value.decision.reason == "model_window" and too_long.value.decision.ceiling.max_frames == 226
    assert other_mode.value.decision.reason == "mode_unavailable"
    assert runner.store.get(ok.job_id).status == "done"
    assert runner.store.job_ids() == [ok.job_id], "nothing refused became a job"


async def test_a_job_waits_queued_while_its_mode_is_not_ready_and_runs_once_it_is(make_runner):
    async with make_runner() as runner:
        runner.executor.set_ready(False, "ComfyUI unreachable")
        calls = looks(runner)
        job = await runner.submit(request(steps=2))
        seen = len(calls)
        await wait_until(lambda: len(calls) >= seen + 3)  # the runner looked three more times
        state = runner.store.get(job.job_id)
        assert state.status == "queued" and state.attempt == 0, "no attempt was used"
        assert runner.executor.capabilities().waiting_reason("t2va") == "fake not ready for t2va: ComfyUI unreachable"
        runner.executor.set_ready(True)
        await wait_until(lambda: runner.store.get(job.job_id).terminal)
    state = runner.store.get(job.job_id)
    assert state.status == "done" and state.attempt == 1


async def test_only_the_unready_mode_waits_the_others_go_past_it(make_runner):
    async with make_runner() as runner:
        runner.executor.set_ready(False, "fl2va nodes missing", modes=("fl2va",))
        first = await runner.submit(request(mode="fl2va", keyframes={"first": "k1"}, steps=2), priority=5)
        second = await runner.submit(request(steps=2))
        await wait_until(lambda: runner.store.get(second.job_id).terminal)
        assert runner.store.get(first.job_id).status == "queued", "ahead in the queue, but its mode cannot start"
        runner.executor.set_ready(True, modes=("fl2va",))
        await wait_until(lambda: runner.store.get(first.job_id).terminal)
    assert runner.store.get(first.job_id).status == "done"


async def test_a_job_that_waits_past_the_queue_timeout_fails_as_deadline_naming_why(make_runner):
    async with make_runner(queue_timeout_s=0.2) as runner:
        runner.executor.set_ready(False, "ComfyUI unreachable")
        job = await runner.submit(request(steps=2))
        await wait_until(lambda: runner.store.get(job.job_id).terminal)
    state = runner.store.get(job.job_id)
    assert state.status == "failed" and state.error.kind == "deadline" and state.attempt == 0
    assert "not started within 0.2s" in state.error.message and "ComfyUI unreachable" in state.error.message


async def test_a_job_the_executor_no_longer_takes_fails_invalid_at_start_not_mid_run(make_runner):
    async with make_runner() as runner:
        runner.executor.set_ready(False, "restarting")
        job = await runner.submit(request(frames=300, steps=2))  # admitted: no limits yet
        runner.executor.limits = FakeLimits(max_seconds=10.0)  # it came back with a shorter window
        runner.executor.set_ready(True)
        await wait_until(lambda: runner.store.get(job.job_id).terminal)
    state = runner.store.get(job.job_id)
    assert state.status == "failed" and state.error.kind == "invalid" and "outside the fake's window" in state.error.message
    assert runner.executor.runs == 0


async def test_the_running_event_records_where_the_attempt_ran(make_runner):
    async with make_runner() as runner:
        job = await runner.submit(request(steps=1))
        await wait_until(lambda: runner.store.get(job.job_id).terminal)
    info = runner.store.get(job.job_id).info
    assert info["hardware"] == "fake" and info["group_sizes"] == "1" and "plan" in info
