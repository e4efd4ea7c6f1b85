"""How a runner runs: its slots, its timers and the retry policy of the jobs it admits."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from h3core.domain.checkpoints import CheckpointPolicy
from h3core.domain.retry import RetryPolicy

__all__ = ["RunnerConfig"]


class RunnerConfig(BaseModel):
    """A runner's slots, timers and the retry policy of the jobs it admits (`Settings.runner_config`
    makes one from the process settings)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    slots: int = Field(default=1, ge=1, le=256)
    stall_timeout_s: float = Field(default=600.0, gt=0)  # no progress or heartbeat for this long
    attempt_deadline_s: float | None = Field(default=None, gt=0)
    cancel_grace_s: float = Field(default=30.0, ge=0)  # time an executor gets to stop
    poll_interval_s: float = Field(default=0.5, gt=0)  # to see work other processes stored
    # A job not started this long after it was admitted fails `deadline` (waiting for a slot, or
    # for its mode to become ready); None: it waits as long as it takes.
    queue_timeout_s: float | None = Field(default=None, gt=0)
    retry: RetryPolicy = RetryPolicy()
    # A store write or read failing (locked, I/O error) is retried this long; past it the store is
    # unusable: `run` stops its jobs and raises `StoreUnavailable`.
    store_retry_s: float = Field(default=30.0, gt=0)
    # On a store shared by several runner nodes (PostgreSQL): how long a node's lease on what it
    # runs lasts without a heartbeat (beats come every third of it); past it another node ends the
    # attempt as interrupted and the retry policy decides what follows.
    lease_s: float = Field(default=30.0, gt=0)
    # How often the runner removes its files of videos the store records deleted (a DELETE through
    # another node: h3core.runtime.deletions).
    deletion_sweep_s: float = Field(default=2.0, gt=0)
    # When an executor that keeps denoising checkpoints stores one (`capabilities().checkpoints`);
    # a policy with both criteria off turns them off.
    checkpoints: CheckpointPolicy = CheckpointPolicy(every_steps=5, every_s=120.0)
