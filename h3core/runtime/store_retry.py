"""What the runner does when the store fails: retry a while, then give up loudly.

A locked or briefly failing database (`database is locked` past the busy timeout, `disk I/O
error`) is retried with a bounded exponential backoff. A store still failing after the limit is
unusable: `StoreUnavailable`, on which the runner stops and its process exits non-zero, rather
than living on with jobs it can no longer end. The store's own refusals (`Conflict`,
`IllegalEvent`, an unknown job) are answers, not failures, and are never retried.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

log = logging.getLogger("h3core.store")

FIRST_PAUSE_S = 0.05
LONGEST_PAUSE_S = 2.0


class StoreUnavailable(RuntimeError):
    """The store failed every try for longer than the runner's limit (`store_retry_s`)."""

    @staticmethod
    def within(group: BaseExceptionGroup) -> StoreUnavailable:
        """The first `StoreUnavailable` in a (nested) group from `except* StoreUnavailable`."""
        exc: BaseException = group
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        assert isinstance(exc, StoreUnavailable)
        return exc


def transient(exc: BaseException) -> bool:
    """A failure of the database itself (locked, I/O), which a later try may not meet. Integrity
    and programming errors are the caller's and would fail the same way again."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(
        exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.NotSupportedError, sqlite3.DataError)
    )


async def retrying(call: Callable[[], T], *, limit_s: float, what: str, limiter: anyio.CapacityLimiter | None = None) -> T:
    """`call()` in a worker thread, tried again on transient failures for up to `limit_s`;
    then `StoreUnavailable` naming the last failure. Other exceptions pass at once."""
    give_up: float | None = None
    pause = FIRST_PAUSE_S
    tries = 0
    while True:
        try:
            return await anyio.to_thread.run_sync(call, limiter=limiter)
        except Exception as exc:
            if not transient(exc):
                raise
            tries += 1
            now = anyio.current_time()
            give_up = now + limit_s if give_up is None else give_up
            if now >= give_up:
                log.error(
                    "store unusable: %s failed for %gs (%d tries): %s",
                    what,
                    limit_s,
                    tries,
                    exc,
                    extra={"operation": what, "tries": tries, "error": str(exc)},
                )
                raise StoreUnavailable(f"the store failed every {what} for {limit_s:g}s ({tries} tries): {exc}") from exc
            log.warning(
                "store %s failed (%s); retrying in %.2fs",
                what,
                exc,
                pause,
                extra={"operation": what, "tries": tries, "error": str(exc)},
            )
            await anyio.sleep(min(pause, give_up - now))
            pause = min(pause * 2, LONGEST_PAUSE_S)
