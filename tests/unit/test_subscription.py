"""Named durable subscriptions (`Jobs.subscribe`): every job's events in store order, at least
once, from the position the store keeps across restarts."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from h3core import FakeExecutor, FakePlan, Jobs, LocalArtifactStore, MemoryEventStore, RetryPolicy, RunnerConfig, Subscription
from h3core.domain.events import Event
from h3core.runtime.bus import EventBus
from tests.factories import request, submitted
from tests.readme import subscription_example
from tests.waiting import until

pytestmark = pytest.mark.anyio

CONFIG = RunnerConfig(poll_interval_s=0.05, retry=RetryPolicy(max_attempts=1))


def jobs_on(tmp_path) -> Jobs:
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    return Jobs(
        tmp_path / "h3.db", FakeExecutor(artifacts, default=FakePlan(step_seconds=0.005)), artifacts=artifacts, config=CONFIG
    )


class Seen:
    """A handler that records what it was handed; `fail_on` (job, seq) raises once each."""

    def __init__(self, fail_on: set[tuple[str, int]] = frozenset()) -> None:
        self.events: list[Event] = []
        self.fail_on = set(fail_on)

    async def __call__(self, event: Event) -> None:
        if (event.job_id, event.seq) in self.fail_on:
            self.fail_on.discard((event.job_id, event.seq))
            raise RuntimeError("the handler failed")
        self.events.append(event)

    def keys(self) -> list[tuple[str, int]]:
        return [(e.job_id, e.seq) for e in self.events]


async def _run_until(jobs: Jobs, name: str, handler: Seen, done) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(jobs.subscribe(name).run, handler)
        await until(done, 30, "the subscription to see the events")
        tg.cancel_scope.cancel()


async def test_every_event_of_every_job_arrives_once_in_store_order(tmp_path):
    async with jobs_on(tmp_path) as jobs:
        handler = Seen()
        async with anyio.create_task_group() as tg:
            tg.start_soon(jobs.subscribe("audit").run, handler)
            ids = [(await jobs.submit(request(steps=3))).job_id for _ in range(3)]
            for job_id in ids:
                await jobs.wait(job_id)
            total = sum([len(await jobs.events(j)) for j in ids])
            await until(lambda: len(handler.events) >= total, 30, "every event")
            tg.cancel_scope.cancel()
        stored = [e for _, e in jobs.runner.store.events_after(0, 10_000)]
    assert handler.events == stored  # store order, each once
    for job_id in ids:
        seqs = [e.seq for e in handler.events if e.job_id == job_id]
        assert seqs == list(range(1, len(seqs) + 1)) and seqs[-1] > 3


async def test_a_restart_goes_on_from_the_saved_position(tmp_path):
    first, second = Seen(), Seen()
    async with jobs_on(tmp_path) as jobs:
        a = await jobs.submit(request(steps=2))
        await jobs.wait(a.job_id)
        count_a = len(await jobs.events(a.job_id))
        await _run_until(jobs, "billing", first, lambda: len(first.events) >= count_a)
    async with jobs_on(tmp_path) as jobs:  # the same store, opened again: the next process
        b = await jobs.submit(request(steps=2))
        await jobs.wait(b.job_id)
        count_b = len(await jobs.events(b.job_id))
        await _run_until(jobs, "billing", second, lambda: len(second.events) >= count_b)
        other = Seen()  # another name has its own place: from the beginning
        await _run_until(jobs, "audit", other, lambda: len(other.events) >= count_a + count_b)
    assert {e.job_id for e in first.events} == {a.job_id}
    assert [e.job_id for e in second.events] == [b.job_id] * count_b  # nothing of job a again
    assert other.keys() == first.keys() + second.keys()


async def test_a_handler_that_raises_does_not_advance_the_position_and_gets_the_event_again(tmp_path):
    async with jobs_on(tmp_path) as jobs:
        job = await jobs.submit(request(steps=2))
        await jobs.wait(job.job_id)
        count = len(await jobs.events(job.job_id))
        handler = Seen(fail_on={(job.job_id, 3)})
        sub = jobs.subscribe("flaky")
        with pytest.raises(RuntimeError, match="the handler failed"):
            await sub.run(handler)
        assert [seq for _, seq in handler.keys()] == [1, 2]
        assert jobs.runner.store.position("flaky") == jobs.runner.store.events_after(0, 2)[-1][0]  # after #2, not #3
        await _run_until(jobs, "flaky", handler, lambda: len(handler.events) >= count)
    assert [seq for _, seq in handler.keys()] == list(range(1, count + 1))  # #3 redelivered, then on in order


async def test_start_end_skips_what_was_stored_before_the_first_run_and_only_that(tmp_path):
    store, bus = MemoryEventStore(), EventBus()
    store.append("old", [submitted()])
    sub = Subscription(store, bus, "late", start="end", resync_s=0.05)
    assert await sub.position() == 1
    store.append("new", [submitted()])
    handler = Seen()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sub.run, handler)
        await until(lambda: handler.events, 10, "the new job's event")
        tg.cancel_scope.cancel()
    assert handler.keys() == [("new", 1)]
    assert store.position("late") == 2


async def test_a_published_event_wakes_a_waiting_subscription(tmp_path):
    """Beside a runner it waits on the bus, not on a timer: with a resync far off, a new event
    still arrives (the resync would take an hour)."""
    store, bus = MemoryEventStore(), EventBus()
    sub = Subscription(store, bus, "live", resync_s=3600)
    handler = Seen()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sub.run, handler)
        await until(lambda: bus.subscribers == 1, 10, "the subscription to wait on the bus")
        _, events = store.append("j", [submitted()])
        bus.publish(events)
        await until(lambda: handler.events, 10, "the published event")
        tg.cancel_scope.cancel()
    assert handler.keys() == [("j", 1)]


def test_the_readme_subscription_example_hears_of_the_job_s_end(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(subscription_example())
    billed = []
    for _ in range(2):  # again on the same store: the first job is not billed twice
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bill ") and lines[0].endswith(" done"), result.stdout
        billed.append(lines[0].split()[1])
    assert billed[0] != billed[1]
