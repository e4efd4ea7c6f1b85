"""Executors: the contract (`base`) and its implementations."""

from h3core.executors.base import (
    Checkpointing,
    CheckpointSaved,
    Executor,
    ExecutorFailure,
    Heartbeat,
    JobSpec,
    Result,
    Resume,
    StoppedWithCheckpoint,
    classify,
)
from h3core.executors.fake import FakeExecutor, FakeLimits, FakePlan

__all__ = [
    "CheckpointSaved",
    "Checkpointing",
    "Executor",
    "ExecutorFailure",
    "FakeExecutor",
    "FakeLimits",
    "FakePlan",
    "Heartbeat",
    "JobSpec",
    "Result",
    "Resume",
    "StoppedWithCheckpoint",
    "classify",
]
