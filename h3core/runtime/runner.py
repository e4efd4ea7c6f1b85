"""The runner: takes queued jobs from the store, drives executors, writes every event.

The terminal guarantee: once a job is `Running`, exactly one terminal event (or a retry) is
written whatever happens: the executor returns, raises, returns without a result, hangs (stall
timeout), overruns its deadline, is cancelled, or the runner itself is cancelled (docs/design.md
§2.1: cancellation is a `BaseException`, so it is never caught as an error here). Terminal
writes happen in shielded scopes; executors never write events.

One exception, by design: when the runner is stopped while an attempt of a `Resumable` executor
runs and that executor detaches it (its work goes on outside h3core, a ComfyUI prompt), only
`detached` is written and the attempt stays `running` in the log; the next start re-attaches to it
(`Resumed`) and the guarantee resumes there: it ends as above, or `executor_lost` if the work is
gone. A stop or a crash leaves nothing that no start will end.

Nor does a lost store: a failing write is retried for `store_retry_s`; past it nothing can be
written, so `run` stops every attempt and raises `StoreUnavailable` (the process exits), and the
next start ends what stayed `running` as after a crash.

The runner composes its parts, one module each: intake (submit, idempotency, cancel), recovery,
claiming, attempt supervision (and the pure decision of how an attempt ends), the queue deadline,
and the journal (its store access, where a lost store is noticed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime

import anyio
import anyio.abc
from anyio.abc import TaskStatus

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.base import EventStore
from h3core.adapters.store.nodes import node_leases
from h3core.adapters.uploads import UploadStore
from h3core.domain.admission import AdmissionPolicy
from h3core.domain.request import GenerationRequest
from h3core.domain.state import JobState
from h3core.domain.webhooks import WebhookTarget
from h3core.executors.base import Executor
from h3core.runtime._claiming import Claimer
from h3core.runtime._nodes import NodeHeartbeat, last_beat, node_info, watch_nodes
from h3core.runtime._queue_deadline import expire_queued
from h3core.runtime._recovery import recover
from h3core.runtime._supervisor import Supervisor
from h3core.runtime._writer import GroupWriter
from h3core.runtime.admission import CapabilityFile, LocalAdmission, publish_capabilities
from h3core.runtime.bus import EventBus
from h3core.runtime.config import RunnerConfig
from h3core.runtime.deletions import DeletionSweep
from h3core.runtime.fleet import FleetAdmission
from h3core.runtime.ids import new_job_id
from h3core.runtime.submissions import Submissions, WebhookPolicy

__all__ = ["Runner", "new_job_id"]


class Runner:
    """Runs the store's queued jobs on one executor, and takes submits and cancels beside them
    (its `submissions`), until cancelled: see the module's docstring for what it guarantees."""

    def __init__(
        self,
        store: EventStore,
        executor: Executor,
        config: RunnerConfig | None = None,
        *,
        admission: AdmissionPolicy | None = None,
        bus: EventBus | None = None,
        id_factory: Callable[[], str] = new_job_id,
        board: CapabilityFile | None = None,
        artifacts: ArtifactStore | None = None,
        uploads: UploadStore | None = None,
        webhooks: WebhookPolicy | None = None,
    ) -> None:
        """`board`: where to publish what the executor can run, for processes that admit jobs
        this runner runs (an API process on the same store). `artifacts`: where the executor
        commits videos, for recovery to adopt one committed before a crash and to clear what a
        dead attempt left; None: recovery reruns such attempts. `uploads` and `webhooks`: what
        its submissions check requests against (`Submissions`)."""
        self.store = store
        self.executor = executor
        self.artifacts = artifacts
        self.config = config or RunnerConfig()
        # By default a request is judged against what the executor says it can run; on a store
        # shared by runner nodes, against what any live node can run.
        local = LocalAdmission(executor.capabilities)
        if admission is None:
            leases = node_leases(store)
            admission = FleetAdmission(leases, local=local) if leases is not None else local
        # A node of a shared store claims the jobs its own executor's contract admits.
        mine = admission.local if isinstance(admission, FleetAdmission) else admission
        local = mine if isinstance(mine, LocalAdmission) else local
        self._local = local  # what this node claims by, and states to the others (its heartbeat)
        self._last_beat: datetime | None = None  # this node's, before it joined again
        self.submissions = Submissions(
            store, self.config, admission=admission, uploads=uploads, webhooks=webhooks, bus=bus, id_factory=id_factory
        )
        self.bus = self.submissions.bus
        self.board = board
        self._journal = self.submissions.journal
        self._supervisor = Supervisor(
            self._journal, executor, self.config, on_end=self._poke, artifacts=artifacts, uploads=uploads
        )
        self._claimer = Claimer(self._journal, executor, self.config, self._supervisor.busy, contract=local.current)
        self.submissions.on_submitted = self._poke
        self.submissions.on_cancel = self._supervisor.cancel
        self.heartbeat: NodeHeartbeat | None = None  # on a store shared by runner nodes, while running
        # Removes its files of videos deleted through any node, while running (with `artifacts`).
        self.deletions = DeletionSweep(store, artifacts, self.config.deletion_sweep_s) if artifacts is not None else None

    @property
    def admission(self) -> AdmissionPolicy:
        """What every submission (and a log imported without its admission) is judged by."""
        return self.submissions.admission

    @admission.setter
    def admission(self, policy: AdmissionPolicy) -> None:
        self.submissions.admission = policy

    @property
    def writer(self) -> GroupWriter:
        """The single writer every event of this runner goes through (its counters for benchmarks)."""
        return self._journal.writer

    @property
    def accepting(self) -> bool:
        """Running and admitting jobs (false before `run` has recovered, once it stops, and once
        the store is lost)."""
        return self.submissions.accepting

    @property
    def started(self) -> bool:
        """`run` has recovered and begun taking jobs (it stays true once it has stopped)."""
        return self.submissions.started

    def _poke(self) -> None:
        self._claimer.poke()

    # -- public API -----------------------------------------------------------------------

    async def submit(
        self,
        request: GenerationRequest,
        *,
        priority: int = 0,
        idempotency_key: str | None = None,
        job_id: str | None = None,
        remixed_from: str | None = None,
        webhook: WebhookTarget | None = None,
    ) -> JobState:
        """`submissions.submit`'s job as stored (see there)."""
        submission = await self.submissions.submit(
            request,
            priority=priority,
            idempotency_key=idempotency_key,
            job_id=job_id,
            remixed_from=remixed_from,
            webhook=webhook,
        )
        return submission.state

    async def cancel(self, job_id: str, reason: str = "cancelled by request", *, wait_s: float = 0.0) -> JobState:
        """`submissions.cancel`: stored, and passed to the attempt if this runner runs it."""
        return await self.submissions.cancel(job_id, reason, wait_s=wait_s)

    def slot_count(self) -> int:
        """Attempts run at once: the configured slots, or fewer where the executor bounds its own
        concurrency (ComfyUI's prompts): the jobs beyond it wait queued here, in h3core's order."""
        most = self.executor.capabilities().concurrency
        return self.config.slots if most is None else min(self.config.slots, most)

    # -- the loop -------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Recover, then run queued jobs until cancelled. Cancelling this is a shutdown.

        Raises `StoreUnavailable` once the store has failed for `store_retry_s`: every running
        attempt is stopped first (their ends cannot be written: the next start records them)."""
        leases = node_leases(self.store)  # on a store shared by runner nodes, this one's
        if leases is not None:  # before any task group: `NodeTaken` reaches the caller as it is
            info = node_info(leases, self.executor, self.slot_count(), "runner", self._local.current)
            self._last_beat = await anyio.to_thread.run_sync(last_beat, leases)  # the join overwrites it
            await anyio.to_thread.run_sync(leases.join, info, self.config.lease_s)
        async with self.executor.running():
            await self.submissions.writing(functools.partial(self._run_jobs, task_status))

    async def _run_jobs(self, task_status: TaskStatus[None]) -> None:
        leases = node_leases(self.store)
        if leases is None:
            await self._run_node(task_status, None)
            return
        info = functools.partial(node_info, leases, self.executor, self.slot_count(), "runner", self._local.current)
        heartbeat = NodeHeartbeat(leases, info(), self.config.lease_s / 3)
        heartbeat.observe(await self._journal.read(leases.draining))  # before the first claim: a drain outlives restarts
        self._claimer.draining = lambda: heartbeat.drain is not None
        heartbeat.start()
        self.heartbeat = heartbeat
        try:
            await self._run_node(task_status, heartbeat, info)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(heartbeat.stop)
                if self._journal.lost is None:
                    await self._journal.read(leases.leave)

    async def _run_node(self, task_status: TaskStatus[None], heartbeat: NodeHeartbeat | None, info=None) -> None:
        if isinstance(self.admission, FleetAdmission):  # recovery admits imported logs by what every node can run
            await self.admission.read()
        resumable = await recover(self._journal, self.executor, self.admission, self.artifacts, self._last_beat)
        slots = anyio.Semaphore(self.slot_count())
        async with anyio.create_task_group() as tg:
            await self.submissions.watch_nodes(tg)
            if heartbeat is not None:  # other nodes' dead attempts: taken over, ended, retried
                tg.start_soon(
                    watch_nodes,
                    self._journal,
                    heartbeat,
                    info,
                    self.artifacts,
                    self.config.lease_s,
                    self._supervisor,
                    self.executor,
                )
            for state in resumable:  # re-attach first: their work is already running
                await slots.acquire()
                tg.start_soon(functools.partial(self._supervisor.job, state, slots, resume=True))
            self.submissions.open()
            task_status.started()
            tg.start_soon(self._supervisor.watch_store)
            if self.deletions is not None:
                tg.start_soon(self.deletions.run)
            if self.board is not None:
                tg.start_soon(publish_capabilities, self.executor, self.board)
            if self.config.queue_timeout_s is not None:
                tg.start_soon(self._expire_queued, self.config.queue_timeout_s)
            await self._claimer.dispatch(tg, slots, self._supervisor.job)

    async def _expire_queued(self, limit_s: float) -> None:
        await expire_queued(
            self._journal, self.executor, self._supervisor.busy, limit_s=limit_s, poll_s=self.config.poll_interval_s
        )
