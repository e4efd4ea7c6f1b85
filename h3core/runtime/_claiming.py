"""Claiming: fill free slots with queued jobs, in the store's order, each started by one event.

Every slot free at once is filled from one read of the queue and one group commit of `Running`
events; only jobs in a mode the executor can start now are taken, the others wait in order.

On a store shared by runner nodes, a node takes only the jobs its own contract admits (modes,
uploads, window, caps, kernel limit, budget: `AdmissionRules.why_not`, with the tokens admission stored);
the others stay queued for a node that can run them. The store drops most of those itself
(`AdmissionRules.queue_filter`, a necessary condition, in SQL); the ones it lets through are judged here
once and remembered as not for this node until its capabilities change. On a store of one runner
there is no other node: a job its executor refuses is failed `invalid`, as ever. A node marked
draining (`draining`, asked before each look at the queue) claims nothing until the mark is
cleared; what it runs goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from h3core.adapters.store.nodes import node_leases
from h3core.domain.admission import AdmissionRules
from h3core.domain.capabilities import MODES, Capabilities
from h3core.domain.events import Body, Failed, Running
from h3core.domain.state import IllegalEvent, JobState
from h3core.executors.base import Executor, classify
from h3core.runtime._attempt import spec_of
from h3core.runtime._journal import Journal, log_written
from h3core.runtime.config import RunnerConfig
from h3core.runtime.store_retry import StoreUnavailable

log = logging.getLogger("h3core.runner")

# Past this many jobs left to other nodes (most of them ended elsewhere since), forget them
# rather than send the store an ever longer list: the next claim judges the rest once more.
FORGET_AT = 10_000

# Runs one claimed job in its slot, releasing the slot when it ends.
StartJob = Callable[[JobState, anyio.Semaphore], Coroutine[Any, Any, None]]


class Claimer:
    def __init__(
        self,
        journal: Journal,
        executor: Executor,
        config: RunnerConfig,
        busy: set[str],
        contract: Callable[[], AdmissionRules] | None = None,
        draining: Callable[[], bool] | None = None,
    ) -> None:
        """`busy`: the ids of jobs whose task is alive here (a retry is queued while its task ends).
        `contract`: what this node can run now, by which a node on a shared store picks its jobs.
        `draining`: whether this node is marked draining now (None: it never is)."""
        self.journal = journal
        self.executor = executor
        self.config = config
        self.busy = busy
        self.draining = draining
        self._wake = anyio.Event()
        # On a store shared by runner nodes, each attempt's `running` event names its node.
        leases = node_leases(journal.store)
        node = leases.node_id if leases is not None else None
        self._node = {"node": node} if node is not None else {}
        self._contract = contract if node is not None else None
        self._judged_by: AdmissionRules | None = None  # the contract `not_here` was judged by
        self.not_here: set[str] = set()  # queued jobs this node cannot run: left to the other nodes

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
        mode the executor can start now are taken (on a shared store, only jobs this node can run);
        the others wait in the queue, in order."""
        while True:
            wake = self._wake
            caps = self.executor.capabilities()
            runnable = caps.runnable_modes if self.draining is None or not self.draining() else ()
            if runnable:
                modes = None if set(runnable) >= set(MODES) else frozenset(runnable)
                # Our own jobs can be queued while their task ends (a retry): skip those.
                skip, mine = frozenset(self.busy), self._mine()
                if mine is not None:  # and jobs it found it cannot run; most others the store drops
                    skip |= self.not_here
                fits = (mine.queue_filter(),) if mine is not None else ()
                queued = await self.journal.read(self.journal.store.queued, wanted, skip, modes, *fits)
                starts = [(s.job_id, [body], s.last_seq) for s in queued if (body := self._start(s, caps, mine)) is not None]
                if queued and not starts:
                    continue  # none of them for this node: further down the queue
                if starts:
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
            if len(self.not_here) > FORGET_AT:  # only between claims: a claim's walk down the queue always ends
                self.not_here.clear()
            with anyio.move_on_after(self.config.poll_interval_s):
                await wake.wait()

    def _mine(self) -> AdmissionRules | None:
        """This node's contract now (None: the store has no other node); a change of what it can
        run forgets which jobs it could not."""
        if self._contract is None:
            return None
        contract = self._contract()
        if contract is not self._judged_by and (self._judged_by is None or contract.caps != self._judged_by.caps):
            self.not_here.clear()
        self._judged_by = contract
        return contract

    def _start(self, state: JobState, caps: Capabilities, mine: AdmissionRules | None) -> Body | None:
        """The event that starts a queued job's next attempt, or fails it if the executor refuses.
        It records where the attempt runs (`caps.identity()`) beside what the executor chose.
        None: on a shared store, a job this node cannot run (another node may): it stays queued."""
        spec = spec_of(state, attempt=state.attempt + 1)
        if mine is not None and (why := mine.why_not(state.request, state.tokens, state.plan)) is not None:
            self._not_mine(state, why)
            return None
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
            if mine is not None:
                self._not_mine(state, f"the executor refused it: {message}")
                return None
            return Failed(kind="invalid", message=f"the executor refused the job: {message}", detail=detail)

    def _not_mine(self, state: JobState, why: str) -> None:
        """Leave the job queued for another node (None: no event), and say why once in the log."""
        self.not_here.add(state.job_id)
        node = self._node["node"]
        log.info(
            "job %s left queued for another node: node %s cannot run it (%s)",
            state.job_id,
            node,
            why,
            extra={"job_id": state.job_id, "node": node},
        )
        return None
