"""When a failed attempt earns another: an explicit, recorded policy.

The policy a job runs under is copied into its `Submitted` event, so the fold can check that
every retry in the log was one the policy allowed, and a replay explains why a job was retried.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from h3core.domain.failures import unknown_kinds

# Retryable by default: failures of the machinery around a job, not of the job itself. An OOM
# or an invalid request fails the same way again, so retrying those only wastes a GPU.
DEFAULT_RETRY_ON = ("executor_lost", "interrupted")  # sorted, as the validator keeps it

# An attempt whose work never started (`not_started`: the executor's server was unreachable before
# it took the job) is retried whatever the policy says and does not count against `max_attempts`:
# nothing ran. Up to this many such attempts per job, so that a server that keeps refusing jobs
# still ends them; never lowered (a log that was legal must stay legal).
MAX_NOT_STARTED = 10


class RetryPolicy(BaseModel):
    """How a job's failed attempts are retried: at most `max_attempts` attempts that started, and
    only after failures of a kind in `retry_on`."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    max_attempts: int = Field(default=2, ge=1, le=100)
    retry_on: tuple[str, ...] = DEFAULT_RETRY_ON

    @field_validator("retry_on")
    @classmethod
    def _known_kinds(cls, kinds: tuple[str, ...]) -> tuple[str, ...]:
        if error := unknown_kinds(kinds):
            raise ValueError(error)
        return tuple(sorted(set(kinds)))

    def allows_retry(self, kind: str, attempt: int, *, not_started: int = 0, released: int = 0) -> bool:
        """May a job whose attempt number `attempt` failed with `kind` run again? `not_started`:
        how many of its earlier attempts never started; `released`: how many h3core's own graceful
        stops handed back (neither counts: only failures spend the budget)."""
        if kind == "not_started":
            return not_started < MAX_NOT_STARTED
        return kind in self.retry_on and attempt - not_started - released < self.max_attempts
