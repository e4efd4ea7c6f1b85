"""The kinds of failure a job's attempt can end with: the one vocabulary the events, the retry
policy, the executors and the settings share."""

from __future__ import annotations

from typing import Literal, get_args

FailureKind = Literal[
    "oom",  # the device ran out of memory
    "executor_error",  # the executor raised something else
    "executor_lost",  # the executor (process, actor, server) went away mid-job
    "stalled",  # no progress within the stall timeout
    "deadline",  # the attempt ran past its deadline
    "interrupted",  # h3core itself stopped or died mid-job
    "invalid",  # the job cannot run as asked (bad input the executor found)
    "stop_unconfirmed",  # stopping it (a cancel, a stall) was not confirmed: its work may still run
    "not_started",  # the executor could not take the job (its server unreachable before it got it): nothing ran
]
FAILURE_KINDS: tuple[str, ...] = get_args(FailureKind)


def unknown_kinds(kinds: tuple[str, ...] | list[str]) -> str | None:
    """The error to raise for names that are not failure kinds, or None when all are."""
    unknown = [k for k in kinds if k not in FAILURE_KINDS]
    return f"unknown failure kind(s) {unknown}; known: {list(FAILURE_KINDS)}" if unknown else None
