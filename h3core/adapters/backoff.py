"""Trying again with exponential backoff: the one way h3core waits for something to come back.

A `Backoff` is the schedule: pauses from `first_s`, doubling, up to `longest_s`, each cut by up
to `jitter` of itself at random (so that callers failing together do not all come back at once),
and how long to keep at it once a call has failed (`limit_s`; None: until it works). `retry` runs a call on that
schedule (tenacity does the loop); websockets' own reconnection takes the same pauses (`pauses`).
Only `Exception`s the caller names are tried again: cancellation, and every other failure, passes
at once.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from time import monotonic as _now
from typing import TypeVar

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """A schedule of pauses between tries: from `first_s`, doubling, up to `longest_s`, each cut by
    up to `jitter` of itself, for at most `limit_s` after the first failure."""

    first_s: float  # the pause after the first failure
    longest_s: float  # no pause is longer
    limit_s: float | None = None  # give up once the call has failed for this long (from its first failure)
    jitter: float = 0.0  # each pause is cut by a random fraction of itself up to this (0: none, 1: "full jitter")

    def pause(self, tries: int) -> float:
        """The pause after the `tries`-th failure in a row."""
        # The exponent is capped so that a call retried forever never overflows a float.
        pause = min(self.first_s * 2.0 ** min(tries - 1, 64), self.longest_s)
        return pause * (1 - self.jitter * random.random()) if self.jitter else pause

    def pauses(self) -> Iterator[float]:
        """Every pause in turn (websockets' `reconnect_delays`)."""
        return (self.pause(tries) for tries in itertools.count(1))


async def retry(
    call: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    retry_if: Callable[[Exception], bool],
    on_retry: Callable[[Exception, int, float], object] | None = None,
    give_up: Callable[[Exception, int], BaseException] | None = None,
) -> T:
    """`await call()` until it returns. A failure `retry_if` accepts is tried again after the next
    pause, `on_retry(failure, tries, pause)` told first; once it has failed for `backoff.limit_s`,
    `give_up(failure, tries)` is raised from the last failure (without `give_up`, that failure)."""
    # The first try runs bare: tenacity's loop costs about as much as a store append, and almost
    # every call succeeds at once. Its loop takes over from the first failure it should retry.
    try:
        return await call()
    except Exception as exc:
        if not retry_if(exc):
            raise
        failure = exc
    first_failure = _now()

    def left(now: float) -> float:
        """Seconds to the limit, as of `now` (the first failure started the clock)."""
        return math.inf if backoff.limit_s is None else first_failure + backoff.limit_s - now

    def tries(state: RetryCallState) -> int:
        return state.attempt_number + 1  # the bare try was the first

    def wait(state: RetryCallState) -> float:
        # The last pause is cut to the time left, so the last try falls on the limit, not past it.
        return min(backoff.pause(tries(state)), left(state.outcome_timestamp or _now()))

    def told(state: RetryCallState) -> None:
        assert on_retry is not None and state.outcome is not None and state.next_action is not None
        failure = state.outcome.exception()
        assert isinstance(failure, Exception)  # only an `Exception` is retried (`retry=` below)
        on_retry(failure, tries(state), state.next_action.sleep)

    def gave_up(state: RetryCallState) -> T:
        assert give_up is not None and state.outcome is not None
        failure = state.outcome.exception()
        assert isinstance(failure, Exception)  # only an `Exception` is retried, so only one gives up
        raise give_up(failure, tries(state)) from failure

    pause = min(backoff.pause(1), left(first_failure))
    if pause <= 0:
        if give_up is None:
            raise failure
        raise give_up(failure, 1) from failure
    if on_retry is not None:
        on_retry(failure, 1, pause)
    await anyio.sleep(pause)

    # A fresh AsyncRetrying per call: it keeps the state of its loop on itself. The isinstance keeps
    # cancellation (a BaseException) out of reach of any `retry_if`.
    retrying = AsyncRetrying(
        sleep=anyio.sleep,
        wait=wait,
        stop=lambda state: left(state.outcome_timestamp or _now()) <= 0,
        retry=retry_if_exception(lambda exc: isinstance(exc, Exception) and retry_if(exc)),
        before_sleep=told if on_retry is not None else None,
        retry_error_callback=gave_up if give_up is not None else None,
        reraise=True,  # without `give_up`, the last failure itself
    )

    async def attempt() -> T:  # tenacity awaits only what an `async def` returns
        return await call()

    return await retrying(attempt)
