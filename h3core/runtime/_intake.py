"""Intake: a request becomes a job (admitted, idempotent per key) or a refusal; a cancel is stored.

A submit's `Submitted` and `Admitted` are one append at `expected_seq=0`, so a job either exists
admitted or not at all; two submits racing on one idempotency key meet in that append's conflict
and both answer the one job stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from h3core.adapters.store.base import Conflict
from h3core.domain.admission import AdmissionPolicy, Refuse, admission_events
from h3core.domain.events import Body, Cancelled, CancelRequested, Reprioritized, Submitted
from h3core.domain.geometry import Media
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import IllegalEvent, JobState
from h3core.domain.webhooks import WebhookTarget
from h3core.runtime._journal import Journal
from h3core.runtime.errors import IdempotencyMismatch, NotCancellable, NotQueued, Refused


class Intake:
    def __init__(self, journal: Journal, admission: AdmissionPolicy, retry: RetryPolicy, new_id: Callable[[], str]) -> None:
        self.journal = journal
        self.admission = admission
        self.retry = retry
        self.new_id = new_id

    async def submit(
        self,
        request: GenerationRequest,
        *,
        job_id: str | None,
        priority: int,
        idempotency_key: str | None,
        media: Mapping[str, Media] | None,
        remixed_from: str | None,
        webhook: WebhookTarget | None = None,
        retry_of: str | None = None,
        by: str | None = None,
    ) -> JobState:
        if idempotency_key is not None:
            existing = await self.journal.read(self.journal.store.by_idempotency_key, idempotency_key)
            if existing is not None:
                return _same_or_mismatch(existing, request, priority, remixed_from, webhook, idempotency_key)
        decision = self.admission.decide(request, media)
        if isinstance(decision, Refuse):
            raise Refused(decision)
        bodies: list[Body] = [
            Submitted(
                request=request,
                priority=priority,
                retry=self.retry,
                warnings=request.warnings(decision.frames),
                idempotency_key=idempotency_key,
                remixed_from=remixed_from,
                retry_of=retry_of,
                by=by,
                webhook=webhook,
            ),
            *admission_events(decision),
        ]
        try:
            return await self.journal.append(job_id or self.new_id(), bodies, expected_seq=0)
        except Conflict:
            if idempotency_key is None:
                raise
            existing = await self.journal.read(self.journal.store.by_idempotency_key, idempotency_key)
            if existing is None:
                raise
            return _same_or_mismatch(existing, request, priority, remixed_from, webhook, idempotency_key)

    async def cancel(self, job_id: str, reason: str, by: str | None = None) -> JobState:
        """Store the cancel: `Cancelled` for a job not running, `CancelRequested` for a running one."""
        while True:
            state = await self.journal.read(self.journal.store.get, job_id)
            if state is None:
                raise KeyError(job_id)
            if state.terminal:
                raise NotCancellable(state)
            if state.status == "running" and state.cancel_requested:
                return state
            ended = state.status != "running"
            body: Body = Cancelled(reason=reason, by=by) if ended else CancelRequested(reason=reason, by=by)
            try:
                return await self.journal.append(job_id, [body], expected_seq=state.last_seq)
            except (Conflict, IllegalEvent):
                continue  # the job moved on (started, progressed, ended): decide again

    async def reprioritize(self, job_id: str, priority: int, by: str | None = None) -> JobState:
        """Store a queued job's new priority (`Reprioritized`); `NotQueued` once it has started."""
        while True:
            state = await self.journal.read(self.journal.store.get, job_id)
            if state is None:
                raise KeyError(job_id)
            if state.status not in ("submitted", "queued"):
                raise NotQueued(state)
            if state.priority == priority:
                return state
            try:
                return await self.journal.append(job_id, [Reprioritized(priority=priority, by=by)], expected_seq=state.last_seq)
            except (Conflict, IllegalEvent):
                continue  # it moved on (started, cancelled): decide again


def _same_or_mismatch(
    existing: JobState,
    request: GenerationRequest,
    priority: int,
    remixed_from: str | None,
    webhook: WebhookTarget | None,
    key: str,
) -> JobState:
    same = existing.request == request and existing.priority == priority and existing.remixed_from == remixed_from
    if same and existing.webhook == webhook:
        return existing
    raise IdempotencyMismatch(key, existing.job_id)
