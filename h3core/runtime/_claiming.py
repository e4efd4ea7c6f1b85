"""Claiming: fill free slots with queued jobs, in the store's order, each started by one event.

Every slot free at once is filled from one read of the queue and one group commit of `Running`
events; only jobs in a mode the executor can start now are taken, the others wait in order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from h3core.domain.capabilities import MODES, Capabilities
from h3core.domain.events import Body, Failed, Running
from h3core.domain.state import IllegalEvent, JobState
from h3core.executors.base import Executor, JobSpec, classify
from h3core.runtime._journal import Journal, log_written
from h3core.runtime.config import RunnerConfig
from h3core.runtime.store_retry import StoreUnavailable

# Runs one claimed job in its slot, releasing the slot when it ends.
StartJob = Callable[[JobState, anyio.Semaphore], Awaitable[None]]


class Claimer:
    def __init__(self, journal: Journal, executor: Executor, config: RunnerConfig, busy: set[str]) -> None:
        """`busy`: the ids of jobs whose task is alive here (a retry is queued while its task ends)."""
        self.journal = journal
        self.executor = executor
        self.config = config
        self.busy = busy
        self._wake = anyio.Event()
        # On a store shared by runner nodes, each attempt's `running` event names its node.
        node = getattr(journal.store, "node_id", None)
        self._node = {"node": node} if node is not None else {}

    def poke(self) -> None:
        """There may be work (a submit, a slot freed): look at the queue now, not at the next poll."""
        self._wake.set()
        self._wake = anyio.Event()

    async def dispatch(self, tg: anyio.abc.TaskGroup, slots: anyio.Semaphore, start_job: StartJob) -> None:
        while True:
            await slots.acquire()
            free = 1
            while slots.value:  # every slot free now is filled from the same read of the queue
                slots.acquire_nowait()
                free += 1
            try:
                claimed = await self._claim(free)
            except BaseException:
                for _ in range(free):
                    slots.release()
                raise
            for _ in range(free - len(claimed)):
                slots.release()
            for state in claimed:
                tg.start_soon(start_job, state, slots)

    async def _claim(self, wanted: int) -> list[JobState]:
        """Mark up to `wanted` queued jobs running (at least one: waits for work). Only jobs in a
        mode the executor can start now are taken; the others wait in the queue, in order."""
        while True:
            wake = self._wake
            caps = self.executor.capabilities()
            runnable = caps.runnable_modes
            if runnable:
                modes = None if set(runnable) >= set(MODES) else frozenset(runnable)
                # Our own jobs can be queued while their task ends (a retry): skip those.
                queued = await self.journal.read(self.journal.store.queued, wanted, frozenset(self.busy), modes)
                if queued:
                    starts = [(s.job_id, [self._start(s, caps)], s.last_seq) for s in queued]
                    outcomes = await self.journal.writer.append_many(starts)
                    for (_, bodies, _), outcome in zip(starts, outcomes, strict=True):
                        if isinstance(outcome, StoreUnavailable):
                            raise outcome
                        if not isinstance(outcome, Exception):
                            log_written(outcome, bodies)
                    claimed = [o for o in outcomes if not isinstance(o, Exception) and o.status == "running"]
                    if claimed:
                        return claimed
                    # None taken: each was cancelled or taken meanwhile (Conflict), or refused by the
                    # executor (now failed). Look again at once, unless the log itself refused them all.
                    if not all(isinstance(o, IllegalEvent) for o in outcomes):
                        continue
            with anyio.move_on_after(self.config.poll_interval_s):
                await wake.wait()

    def _start(self, state: JobState, caps: Capabilities) -> Body:
        """The event that starts a queued job's next attempt, or fails it if the executor refuses.
        It records where the attempt runs (`caps.identity()`) beside what the executor chose."""
        spec = JobSpec(state.job_id, state.attempt + 1, state.request, state.tokens)
        try:
            self.executor.check(spec)
            return Running(
                attempt=spec.attempt,
                executor=self.executor.name,
                executor_ref=self.executor.reference(spec),
                info={**caps.identity(), **self._node, **self.executor.info(spec)},
            )
        except Exception as exc:  # the executor cannot even describe this job: end it, go on
            kind, message, detail = classify(exc)
            return Failed(kind="invalid", message=f"the executor refused the job: {message}", detail=detail)
