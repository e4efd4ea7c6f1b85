"""Waiting for a condition against a deadline: the suite's one way to synchronise (never a sleep
standing in for it). A run past the deadline fails naming what was awaited, with what a caller
can say about the state it found; deadlines are generous, so a loaded machine is slower, not red:
past its deadline a wait goes on while the machine is loaded (`stretch`: the load average over the
cores, at most `MOST_STRETCH` times the deadline), as a fresh clone at load 12-22 went red on
deadlines that pass alone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import anyio

from h3core.domain.state import JobState
from h3core.runtime.runner import Runner

T = TypeVar("T")

MOST_STRETCH = 4.0


def stretch() -> float:
    """How much longer than its deadline a wait may take now: 1 on a machine with a core to spare,
    the load average per core above that (at most `MOST_STRETCH`)."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(MOST_STRETCH, max(1.0, per_core))


def overdue(started: float, timeout: float) -> bool:
    """Has a wait that began at `started` (time.monotonic()) run past `timeout`, stretched by the load?"""
    elapsed = time.monotonic() - started
    return elapsed > timeout and elapsed > timeout * stretch()


def poll(predicate: Callable[[], T], timeout: float, what: str, diagnose: Callable[[], str] = lambda: "") -> T:
    """Call `predicate` until it returns something truthy, and return that; fail after `timeout` s."""
    started = time.monotonic()
    while True:
        value = predicate()
        if value:
            return value
        if overdue(started, timeout):
            waited = time.monotonic() - started
            raise AssertionError(f"timed out after {waited:.0f}s (deadline {timeout:g}s) waiting for {what}\n{diagnose()}")
        time.sleep(0.05)


async def until(predicate: Callable[[], object], timeout: float = 60.0, what: str = "the condition") -> None:
    """`poll` for async code: the event loop runs on between looks."""
    started = time.monotonic()
    while not predicate():
        if overdue(started, timeout):
            raise AssertionError(f"timed out after {time.monotonic() - started:.0f}s (deadline {timeout:g}s) waiting for {what}")
        await anyio.sleep(0.01)


async def ended(runner: Runner, job_id: str, timeout: float = 60.0) -> JobState:
    """The job's state once it has ended."""
    await until(lambda: runner.store.get(job_id).terminal, timeout, f"job {job_id} to end")
    return runner.store.get(job_id)
