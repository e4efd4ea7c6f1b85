"""What the runner does when the store fails: retry a while, then give up loudly.

A locked or briefly failing database (`database is locked` past the busy timeout, `disk I/O
error`) is retried with a bounded exponential backoff (`h3core.adapters.backoff`). A store still
failing after the limit is unusable: `StoreUnavailable`, on which the runner stops and its
process exits non-zero, rather than living on with jobs it can no longer end. The store's own
refusals (`Conflict`, `IllegalEvent`, an unknown job) are answers, not failures, and are never
retried.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
from collections.abc import Callable
from typing import TypeVar

import anyio

from h3core.adapters.backoff import Backoff, retry

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
    """A failure of the database itself (locked, I/O, a lost server connection), which a later try
    may not meet. Integrity and programming errors are the caller's and would fail the same way again."""
    psycopg = sys.modules.get("psycopg")  # loaded only where a PostgreSQL store is in use
    if psycopg is not None and isinstance(exc, psycopg.OperationalError):  # the pool's timeout included
        return True
    # The server ended a transaction that waited on this process too long (it was frozen: the
    # PostgreSQL store's module docstring): a later try, on a fresh connection, goes through.
    if psycopg is not None and isinstance(exc, psycopg.errors.IdleInTransactionSessionTimeout):
        return True
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(
        exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.NotSupportedError, sqlite3.DataError)
    )


async def retrying(call: Callable[[], T], *, limit_s: float, what: str, limiter: anyio.CapacityLimiter | None = None) -> T:
    """`call()` in a worker thread, tried again on transient failures for up to `limit_s` (from the
    first failure); then `StoreUnavailable` naming the last failure. Other exceptions pass at once."""

    def retried(exc: Exception, tries: int, pause: float) -> None:
        log.warning(
            "store %s failed (%s); retrying in %.2fs",
            what,
            exc,
            pause,
            extra={"operation": what, "tries": tries, "error": str(exc)},
        )

    def unusable(exc: Exception, tries: int) -> StoreUnavailable:
        log.error(
            "store unusable: %s failed for %gs (%d tries): %s",
            what,
            limit_s,
            tries,
            exc,
            extra={"operation": what, "tries": tries, "error": str(exc)},
        )
        return StoreUnavailable(f"the store failed every {what} for {limit_s:g}s ({tries} tries): {exc}")

    return await retry(
        lambda: anyio.to_thread.run_sync(call, limiter=limiter),
        Backoff(FIRST_PAUSE_S, LONGEST_PAUSE_S, limit_s),
        retry_if=transient,
        on_retry=retried,
        give_up=unusable,
    )


async def in_thread(call: Callable[[], T], *, limit_s: float | None, what: str) -> T:
    """`call()` in a worker thread: with `limit_s`, tried again on transient failures as `retrying`
    says; with None, once (its failure raised as it is)."""
    if limit_s is None:
        return await anyio.to_thread.run_sync(call)
    return await retrying(call, limit_s=limit_s, what=what)
