"""Cancelling, as every HTTP dialect does: store the cancel, then wait a little for the job to end,
so that the answer says how it ended: `cancelled`, or `done` because the cancel came too late (the
work had finished before the stop could take effect: its video is kept, and its `done` event says
so)."""

from __future__ import annotations

from h3core.domain.state import JobState
from h3core.service.context import Service

__all__ = ["CANCEL_ANSWER_S", "cancel", "refusal"]

# How long a cancel's answer waits for a running job to end (a stop takes a step of the model,
# or ComfyUI's interrupt); past it the answer says the job is still stopping.
CANCEL_ANSWER_S = 5.0


async def cancel(svc: Service, job_id: str, reason: str = "cancelled by request", by: str | None = None) -> JobState:
    """The job's state once its cancel is stored and it has ended, or `CANCEL_ANSWER_S` has passed;
    `by`, who asked, is kept in the log. Raises `KeyError` for an unknown job and `NotCancellable` for
    one that had ended already."""
    return await svc.submissions.cancel(job_id, reason, wait_s=CANCEL_ANSWER_S, by=by)


def refusal(state: JobState) -> tuple[str, dict[str, str]]:
    """Why a job that has ended was not cancelled, and the fields that say it (a 409's body):
    `status`, the state it ended in, and `reason: too_late` where it ended done."""
    if state.status == "done":
        detail = f"too late: job {state.job_id} finished before the cancel could take effect; it is done and its video is kept"
        return detail, {"status": "done", "reason": "too_late"}
    return f"job {state.job_id} already ended '{state.status}'", {"status": state.status}
