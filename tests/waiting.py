"""Waiting for a condition against a deadline: the suite's one way to synchronise (never a sleep
standing in for it). A run past the deadline fails naming what was awaited, with what a caller
can say about the state it found; deadlines are generous, so a loaded machine is slower, not red."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio

from h3core.domain.state import JobState
from h3core.runtime.runner import Runner

T = TypeVar("T")


def poll(predicate: Callable[[], T], timeout: float, what: str, diagnose: Callable[[], str] = lambda: "") -> T:
    """Call `predicate` until it returns something truthy, and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{diagnose()}")
        time.sleep(0.05)


async def until(predicate: Callable[[], object], timeout: float = 60.0, what: str = "the condition") -> None:
    """`poll` for async code: the event loop runs on between looks."""
    try:
        with anyio.fail_after(timeout):
            while not predicate():
                await anyio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}") from None


async def ended(runner: Runner, job_id: str, timeout: float = 60.0) -> JobState:
    """The job's state once it has ended."""
    await until(lambda: runner.store.get(job_id).terminal, timeout, f"job {job_id} to end")
    return runner.store.get(job_id)
