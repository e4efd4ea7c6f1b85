"""What the runner answers instead of a job: a refusal, a reused key, a job past cancelling, a stop."""

from __future__ import annotations

from h3core.domain.admission import Refuse
from h3core.domain.state import JobState

__all__ = ["IdempotencyMismatch", "InvalidSubmission", "NotCancellable", "NotQueued", "Refused", "ShuttingDown"]


class Refused(Exception):
    """Admission refused the request; it did not become a job."""

    def __init__(self, decision: Refuse) -> None:
        super().__init__(decision.detail)
        self.decision = decision


class IdempotencyMismatch(Exception):
    """The idempotency key names a job submitted with a different request."""

    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(f"idempotency key {key!r} was used for job {job_id} with a different request")
        self.key = key
        self.job_id = job_id


class NotCancellable(Exception):
    """The job has ended (`state`, how): there is nothing left to cancel."""

    def __init__(self, state: JobState) -> None:
        super().__init__(f"job {state.job_id} already ended '{state.status}'")
        self.state = state


class NotQueued(Exception):
    """The job is not queued (`state`, how): it has started or ended, and keeps its place."""

    def __init__(self, state: JobState) -> None:
        super().__init__(f"job {state.job_id} is '{state.status}', not queued: only a queued job's priority changes")
        self.state = state


class ShuttingDown(Exception):
    """The runner no longer admits work."""


class InvalidSubmission(Exception):
    """A request that names something it may not: an upload that is missing or of the wrong kind,
    or a webhook this service cannot or will not send. `errors`: each field and why, in the
    order the fields were checked; `about`: `uploads` or `webhook`, what was checked; `missing`:
    (field, upload id) of each upload named that the store does not hold (those of `errors` that
    are not there at all, as against there but of another kind)."""

    def __init__(self, about: str, errors: list[tuple[str, str]], *, missing: list[tuple[str, str]] | None = None) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors))
        self.about = about
        self.errors = errors
        self.missing = missing or []
