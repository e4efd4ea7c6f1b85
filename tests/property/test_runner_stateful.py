"""A stateful model of the runner: random submits, cancels, executor failures, hangs, graceful
restarts and hard crashes (writes lost mid-flight, as with SIGKILL), then recovery.

Whatever the sequence, every log folds, the projection equals the replay, and once the runner
has been up for longer than the stall timeout every job has ended, exactly once, with no task
left behind.
"""

from __future__ import annotations

import concurrent.futures
import tempfile
import threading
import time
from pathlib import Path

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from h3core import (
    FakeExecutor,
    FakePlan,
    LocalArtifactStore,
    NotCancellable,
    RetryPolicy,
    Runner,
    RunnerConfig,
    SQLiteEventStore,
)
from h3core.adapters.store.memory import MemoryEventStore
from h3core.domain.state import fold
from tests.factories import request
from tests.pgserver import PgServer
from tests.profiles import examples

plans = st.one_of(
    st.just(FakePlan()),
    st.builds(FakePlan, step_seconds=st.sampled_from([0.0, 0.01, 0.03])),
    st.builds(
        FakePlan,
        fail_at=st.integers(1, 3),
        kind=st.sampled_from(["oom", "executor_error", "executor_lost", "invalid"]),
        fail_attempts=st.integers(1, 2),
    ),
    st.builds(FakePlan, hang_at=st.integers(1, 3)),
    st.builds(FakePlan, no_result=st.just(True)),
    st.builds(FakePlan, step_seconds=st.just(0.02), cleanup_seconds=st.sampled_from([0.0, 0.3])),
)

STALL = 0.3


class CrashableStore:
    """The real store until the crash point; from then on every write is lost, as when the
    process is killed: the runner is told its writes landed, the file never changes again.

    The crash strikes inside the runner's own write path: every runner write is a group commit
    (`append_batch`, from the group writer's thread), and `arm(n)` lets `n` more of them reach
    the file before the rest vanish, so the kill lands between two commits of a running
    runner, or in the middle of its shutdown. Once crashed, reads and writes go to an
    in-memory copy (what the dead process believed), so the runner carries on consistently
    while nothing it does reaches the file.
    """

    def __init__(self, real: SQLiteEventStore) -> None:
        self.real = real
        self._left: int | None = None  # group commits still reaching the file; None: not armed
        self._lock = threading.Lock()
        self.ghost: MemoryEventStore | None = None

    def arm(self, after_batches: int) -> None:
        with self._lock:
            self._left = after_batches
            if after_batches == 0:
                self._die()

    def _die(self) -> None:
        self.ghost = MemoryEventStore()
        self.ghost.import_events(list(self.real.all_events()))

    def append_batch(self, items):
        with self._lock:
            if self.ghost is None and self._left is not None:
                if self._left == 0:
                    self._die()
                else:
                    self._left -= 1
            target = self.ghost or self.real
        return target.append_batch(items)

    def append(self, job_id, bodies, *, expected_seq=None):
        raise AssertionError("the runner writes through append_batch only")

    def __getattr__(self, name):
        return getattr(self.ghost or self.real, name)


async def _task_count() -> int:
    return len(anyio.get_running_tasks())


class RunnerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.real = self.open_store()
        self.artifacts = LocalArtifactStore(Path(self.tmp.name) / "artifacts")
        self.plans: dict[str, FakePlan] = {}
        self.jobs: list[str] = []
        self._portal_cm = start_blocking_portal("asyncio")
        self.portal = self._portal_cm.__enter__()
        self.baseline_tasks = self.portal.call(_task_count)
        self.future: concurrent.futures.Future | None = None
        self._start()

    def open_store(self):
        return SQLiteEventStore(Path(self.tmp.name) / "h3.db", durable=False)

    def _start(self) -> None:
        self.store = CrashableStore(self.real)
        executor = FakeExecutor(self.artifacts, plans=lambda job: self.plans.get(job.job_id))
        config = RunnerConfig(
            slots=2,
            stall_timeout_s=STALL,
            cancel_grace_s=0.1,
            poll_interval_s=0.02,
            retry=RetryPolicy(max_attempts=2, retry_on=("executor_lost", "interrupted", "stalled")),
        )
        self.runner = Runner(self.store, executor, config)
        self.future, _ = self.portal.start_task(self.runner.run)

    def _stop(self) -> None:
        assert self.future is not None
        self.future.cancel()
        concurrent.futures.wait([self.future], timeout=30)
        assert self.future.done(), "the runner stops when cancelled"
        self.future = None

    @rule(plan=plans, steps=st.integers(1, 4), priority=st.integers(0, 2))
    def submit(self, plan, steps, priority):
        job_id = f"job{len(self.jobs)}"
        self.plans[job_id] = plan
        state = self.portal.call(lambda: self.runner.submit(request(steps=steps), priority=priority, job_id=job_id))
        assert state.status == "queued"
        self.jobs.append(job_id)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data):
        job_id = data.draw(st.sampled_from(self.jobs))
        try:
            state = self.portal.call(self.runner.cancel, job_id)
        except NotCancellable as exc:
            assert exc.state.terminal
        else:
            assert state.status in ("cancelled", "running")

    @rule(seconds=st.sampled_from([0.0, 0.02, 0.1]))
    def time_passes(self, seconds):
        self.portal.call(anyio.sleep, seconds)

    @rule()
    def graceful_restart(self):
        self._stop()
        assert not any(s.status == "running" for s in self.real.unfinished()), "a graceful stop leaves nothing running"
        self._start()

    @rule(after_batches=st.integers(0, 3), seconds=st.sampled_from([0.0, 0.02, 0.1]))
    def crash_and_recover(self, after_batches, seconds):
        self.store.arm(after_batches)
        self.portal.call(anyio.sleep, seconds)  # the runner works on; the kill lands where it lands
        self._stop()
        event("the kill struck" if self.store.ghost is not None else "the kill came after the runner stopped")
        self._start()

    @invariant()
    def every_log_folds_and_matches_its_projection(self):
        for job_id in self.jobs:
            # The runner writes meanwhile: take the projection first, then the log up to it.
            state = self.real.get(job_id)
            log = self.real.events(job_id)[: state.last_seq]
            assert fold(log) == state
            assert sum(e.terminal for e in log) <= 1

    def teardown(self):
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(not self.real.get(j).terminal for j in self.jobs):
                time.sleep(0.02)
            stuck = [(j, self.real.get(j).status) for j in self.jobs if not self.real.get(j).terminal]
            assert not stuck, f"jobs not ended after the runner ran well past the stall timeout: {stuck}"
            for j in self.jobs:
                log = self.real.events(j)
                assert log[-1].terminal and sum(e.terminal for e in log) == 1
            self._stop()
            assert self.portal.call(_task_count) == self.baseline_tasks, "no task outlives the runner"
        finally:
            if self.future is not None:
                self.future.cancel()
            self._portal_cm.__exit__(None, None, None)
            self.real.close()
            self.tmp.cleanup()


RunnerMachine.TestCase.settings = settings(max_examples=examples(15), stateful_step_count=25)
TestRunnerStateful = RunnerMachine.TestCase

_servers: list[PgServer] = []


@pytest.fixture(scope="module")
def _postgres(pg_server):
    """The worker's PostgreSQL, where a state machine (which takes no fixtures) finds it."""
    _servers.append(pg_server)
    yield
    _servers.remove(pg_server)


class PostgresRunnerMachine(RunnerMachine):
    """The same model on the PostgreSQL store, a fresh schema per example."""

    def open_store(self):
        from h3core.adapters.store.postgres import PostgresEventStore

        return PostgresEventStore(_servers[0].fresh_schema())


# Fewer examples than SQLite's: every step waits on server round trips (the same model, the same rules).
PostgresRunnerMachine.TestCase.settings = settings(max_examples=examples(6), stateful_step_count=25)
TestRunnerStatefulPostgres = pytest.mark.usefixtures("_postgres")(PostgresRunnerMachine.TestCase)
