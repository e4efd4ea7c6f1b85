"""The queue deadline: a job not started within `queue_timeout_s` of its admission fails `deadline`,
saying why it waited (its mode not ready, or every slot busy)."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio

from h3core.adapters.store.base import Conflict
from h3core.domain.events import Failed
from h3core.domain.state import IllegalEvent
from h3core.executors.base import Executor
from h3core.runtime._journal import Journal


async def expire_queued(journal: Journal, executor: Executor, busy: set[str], *, limit_s: float, poll_s: float) -> None:
    """Fail jobs that were not started within `limit_s` of their admission (never returns)."""
    every = min(max(limit_s / 10, poll_s), 30.0)
    while True:
        await anyio.sleep(every)
        now = datetime.now(UTC)
        caps = executor.capabilities()
        for state in await journal.read(journal.store.unfinished):
            if state.status != "queued" or state.attempt or state.admitted_at is None or state.job_id in busy:
                continue
            waited = (now - state.admitted_at).total_seconds()
            if waited < limit_s:
                continue
            why = caps.waiting_reason(state.request.mode)
            body = Failed(
                kind="deadline",
                message=f"not started within {limit_s:g}s of admission (waited {waited:.0f}s"
                + (f"; {why})" if why else "; every slot was busy)"),
            )
            try:
                await journal.append(state.job_id, [body], expected_seq=state.last_seq)
            except (Conflict, IllegalEvent):
                pass  # it moved on meanwhile (started or cancelled)
