"""Submissions: a request becomes a stored job, the one way every door does it (the HTTP routes in
both dialects, `h3core enqueue`, `Jobs.submit`), and a cancel is stored.

A submit checks, in this order: the webhook target (a secret to sign with, and an address a
delivery may reach, after resolving its host), the uploads the request names (each one stored and
of the kind its field takes), then the idempotency key, admission, and one append of the job's
`submitted` and `admitted` events. Its answer says whether this call created the job or replayed
the one an earlier call with the same key created, so that exactly one call per key is told
"created", however many race.

Writes go through one group-committing writer (`run` or `writing` runs it); a process that only
takes requests (the API role, the CLI's `enqueue`) runs `Submissions` alone, and a `Runner` runs
one inside it, beside the jobs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.abc import TaskStatus

from h3core.adapters.store.base import EventStore
from h3core.adapters.store.nodes import node_leases
from h3core.adapters.uploads import UploadStore
from h3core.domain.admission import AdmissionPolicy, AdmitAll
from h3core.domain.geometry import Media
from h3core.domain.request import UPLOAD_KINDS, GenerationRequest
from h3core.domain.state import JobState, apply
from h3core.domain.webhooks import Allow, WebhookTarget
from h3core.runtime._intake import Intake
from h3core.runtime._journal import Journal
from h3core.runtime.bus import EventBus
from h3core.runtime.config import RunnerConfig
from h3core.runtime.errors import InvalidSubmission, ShuttingDown
from h3core.runtime.fleet import FleetAdmission
from h3core.runtime.follow import follow
from h3core.runtime.ids import new_job_id
from h3core.runtime.store_retry import StoreUnavailable

__all__ = ["Submission", "Submissions", "WebhookPolicy"]


@dataclass(frozen=True)
class Submission:
    """What a submit did: the job as stored, and whether this call created it (False: an
    idempotent replay of the job an earlier call with the same key created)."""

    state: JobState
    created: bool


@dataclass(frozen=True)
class WebhookPolicy:
    """Whether this service sends webhooks (`signing`: it has a secret to sign them with) and the
    private hosts and networks a target may name anyway (`allow`, H3_WEBHOOKS_ALLOW)."""

    signing: bool = False
    allow: Allow = field(default_factory=Allow)


class Submissions:
    """Admit and store jobs, store cancels: the write side every door shares."""

    def __init__(
        self,
        store: EventStore,
        config: RunnerConfig | None = None,
        *,
        admission: AdmissionPolicy | None = None,
        uploads: UploadStore | None = None,
        webhooks: WebhookPolicy | None = None,
        bus: EventBus | None = None,
        id_factory: Callable[[], str] = new_job_id,
    ) -> None:
        """`admission`: what every request is judged by (by default, on a store shared by runner
        nodes, what any live node states it can run; else everything). `uploads`: where the
        uploads requests name are kept (None: not checked here, nor counted by admission; the
        executor reads them where it keeps them). `webhooks`: by
        default none are sent, so a request with a webhook is refused."""
        self.store = store
        self.config = config or RunnerConfig()
        self.uploads = uploads
        self.webhooks = webhooks or WebhookPolicy()
        self.bus = bus or EventBus()
        if admission is None:
            leases = node_leases(store)
            admission = FleetAdmission(leases) if leases is not None else AdmitAll()
        self.journal = Journal(store, self.bus, retry_s=self.config.store_retry_s)
        self._intake = Intake(self.journal, admission, self.config.retry, id_factory)
        self._new_id = id_factory
        # Set by a runner beside these: a new job to claim, a cancel to pass to a running attempt.
        self.on_submitted: Callable[[], None] = lambda: None
        self.on_cancel: Callable[[str], None] = lambda job_id: None
        self._accepting = False
        self.started = False

    @property
    def admission(self) -> AdmissionPolicy:
        """What every submission (and a log imported without its admission) is judged by."""
        return self._intake.admission

    @admission.setter
    def admission(self, policy: AdmissionPolicy) -> None:
        self._intake.admission = policy

    @property
    def accepting(self) -> bool:
        """Running and admitting jobs (false before `run` or a runner has started, once it stops,
        and once the store is lost)."""
        return self._accepting and self.journal.lost is None

    def open(self) -> None:
        """From now on submits are taken (and, once closed, refused with `ShuttingDown`)."""
        self._accepting = True
        self.started = True

    # -- the write side -------------------------------------------------------------------

    async def submit(
        self,
        request: GenerationRequest,
        *,
        priority: int = 0,
        idempotency_key: str | None = None,
        webhook: WebhookTarget | None = None,
        remixed_from: str | None = None,
        job_id: str | None = None,
        retry_of: str | None = None,
        by: str | None = None,
    ) -> Submission:
        """Check the request's webhook and uploads, then admit and store it.

        Raises `InvalidSubmission` (each bad field and why), `Refused` (admission's reason and
        ceiling), `IdempotencyMismatch` (the key names a job submitted with something else) or
        `ShuttingDown`. `remixed_from`: the job this one remixes, `retry_of`: the ended job it
        runs again, `by`: who submitted it, each kept in its log. `job_id`: the id to create (by
        default a new one)."""
        if webhook is not None:
            await self.vet_webhook(webhook)
        media = await self.upload_media(request)
        if not self.accepting and self.started:
            raise ShuttingDown("h3core is shutting down and admits no new jobs")
        job_id = job_id or self._new_id()
        state = await self._intake.submit(
            request,
            job_id=job_id,
            priority=priority,
            idempotency_key=idempotency_key,
            media=media,
            remixed_from=remixed_from,
            webhook=webhook,
            retry_of=retry_of,
            by=by,
        )
        self.on_submitted()
        # Any other id back is the job an earlier (or a concurrent) call with the same key created.
        return Submission(state, created=state.job_id == job_id)

    async def vet_webhook(self, webhook: WebhookTarget) -> None:
        """`InvalidSubmission` unless a delivery may go to `webhook`: this service signs webhooks,
        and its host resolves only to addresses the policy allows."""
        if not self.webhooks.signing:
            raise InvalidSubmission("webhook", [("webhook", "this service sends no webhooks: H3_WEBHOOK_SECRET is not set")])
        # The resolver and sender need the service extra; a service that signs webhooks has it.
        from h3core.adapters.webhooks import target_refusal

        why = await target_refusal(webhook.url, self.webhooks.allow)
        if why is not None:
            raise InvalidSubmission("webhook", [("webhook", why)])

    async def upload_media(self, request: GenerationRequest) -> dict[str, Media]:
        """What is known of each upload the request names (for admission to count its tokens);
        `InvalidSubmission` naming every one that is missing (in its `missing` too) or of the
        wrong kind. Without an upload store, nothing is known: {}."""
        wanted: list[tuple[str, str, str]] = []  # (field, id, kind)
        for name, ids in request.uploads().items():
            single = name.startswith("keyframes.")
            wanted += [(name if single else f"{name}.{i}", v, UPLOAD_KINDS[name]) for i, v in enumerate(ids)]
        uploads = self.uploads
        if not wanted or uploads is None:
            return {}

        media: dict[str, Media] = {}
        errors: list[tuple[str, str]] = []
        missing: list[tuple[str, str]] = []

        def read() -> None:  # the uploads' records: file I/O
            for where, upload_id, kind in wanted:
                upload = uploads.get(upload_id)
                if upload is None:
                    errors.append((where, f"no upload {upload_id!r} (POST /v1/uploads first)"))
                    missing.append((where, upload_id))
                elif upload.kind != kind:
                    errors.append((where, f"upload {upload_id!r} is {upload.kind}, not {kind}"))
                else:
                    media[upload_id] = upload.media()

        await anyio.to_thread.run_sync(read)
        if errors:
            raise InvalidSubmission("uploads", errors, missing=missing)
        return media

    async def reprioritize(self, job_id: str, priority: int, *, by: str | None = None) -> JobState:
        """Move a queued job in the queue: its new `priority` (higher starts first), logged with who
        asked (`by`). Raises `KeyError` for an unknown job, `NotQueued` for one that has started
        or ended."""
        state = await self._intake.reprioritize(job_id, priority, by)
        self.on_submitted()  # a runner waiting for work looks at the queue again
        return state

    async def cancel(
        self, job_id: str, reason: str = "cancelled by request", *, wait_s: float = 0.0, by: str | None = None
    ) -> JobState:
        """Queued jobs end at once; running ones end once the executor has stopped, or `done` where
        the work finished before the stop took effect (the cancel came too late). `wait_s`: wait up
        to that long for a running job to end, and return the state it ended in (the latest one if
        it has not). `by`: who asked, kept in the log. Raises `KeyError` for an unknown job,
        `NotCancellable` for one that has ended."""
        state = await self._intake.cancel(job_id, reason, by)
        self.on_cancel(job_id)
        if state.terminal or wait_s <= 0:
            return state
        # Its runner may be another process: its events come through the store, read this often.
        resync_s = min(wait_s, self.config.poll_interval_s)
        with anyio.move_on_after(wait_s):
            async with aclosing(follow(self.bus, self.store.events, job_id, state.last_seq, resync_s=resync_s)) as events:
                async for event in events:
                    if event is not None:
                        state = apply(state, event)
        return state

    # -- the lifetime ---------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Take submits and cancels, group-committed, until cancelled (which stops admitting), for
        a process whose jobs another process's runner runs (it sees them in the store). Raises
        `StoreUnavailable` once the store has failed for `store_retry_s`."""

        async def admit(task_status: TaskStatus[None]) -> None:
            async with anyio.create_task_group() as tg:
                await self.watch_nodes(tg)
                self.open()
                task_status.started()
                await anyio.sleep_forever()

        await self.writing(lambda: admit(task_status))

    async def watch_nodes(self, tg: anyio.abc.TaskGroup) -> None:
        """Where admission judges across nodes, keep their statements fresh (read once first)."""
        if isinstance(self.admission, FleetAdmission):
            await tg.start(self.admission.watch)

    async def writing(self, work: Callable[[], Awaitable[None]]) -> None:
        """`work()` while the writer runs (shielded: the ends of cancelled attempts are written
        through it) and a lost store stops everything with `StoreUnavailable`; after it, admit
        nothing more, drain what was written and stop the writer."""
        try:
            async with anyio.create_task_group() as writing:
                await writing.start(self._write_shielded)
                writing.start_soon(self.journal.raise_when_lost)
                try:
                    await work()
                finally:
                    self._accepting = False
                    self.journal.writer.close()  # every job task has ended: drain what they wrote, stop
        except* StoreUnavailable as group:
            raise self.journal.lost or StoreUnavailable.within(group) from None
        finally:
            self._accepting = False

    async def _write_shielded(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope(shield=True):
            await self.journal.writer.run(task_status=task_status)
