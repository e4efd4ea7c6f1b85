"""Executors: the contract (`base`) and its implementations."""

from h3core.executors.base import (
    Executor,
    ExecutorFailure,
    Heartbeat,
    JobSpec,
    Result,
    classify,
)
from h3core.executors.fake import FakeExecutor, FakeLimits, FakePlan

__all__ = ["Executor", "ExecutorFailure", "FakeExecutor", "FakeLimits", "FakePlan", "Heartbeat", "JobSpec", "Result", "classify"]
