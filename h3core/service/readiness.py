"""The checks behind /readyz that touch the disk, reused for a short while.

A readiness probe must answer within its timeout (Kubernetes: 1 s by default) however loaded the
service is. Taking the store's write lock to prove it writable waited behind every group commit
and on a free worker thread: under 8 submitters and 32 readers, p99 1.24 s and max 2 s. So:

- the store is writable if this process committed a write within the last `max_age` seconds
  (under load it always has: no lock, no thread); otherwise it takes the write lock once, as before;
- that answer, and the api role's look at who holds the runner lock (on PostgreSQL: which runner
  nodes beat within their lease), are reused for `max_age`
  seconds, one check in flight at a time whatever the number of probes;
- what lives in memory (the runner accepting, the executor's modes, its groups) is read on every
  request, so a runner that stops or an executor that goes down is reported at once.

`max_age` 0 checks on every request, as /readyz did before (bench/throughput/readyz.py compares).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar, runtime_checkable

import anyio

from h3core.adapters.lock import RunnerLock
from h3core.adapters.store.base import EventStore
from h3core.adapters.store.nodes import NodeRow, WithNodeLeases

__all__ = ["Readiness", "Recent"]

T = TypeVar("T")


@runtime_checkable
class _CommitClock(Protocol):
    """A store that knows when this process last committed (SQLite's and PostgreSQL's)."""

    def committed_within(self, seconds: float) -> bool: ...


class Recent(Generic[T]):
    """The latest result of an async check, reused while younger than `max_age` seconds. One check
    runs at a time: callers that arrive meanwhile wait for its result instead of starting another.
    `max_age` 0: every call checks."""

    def __init__(self, check: Callable[[], Awaitable[T]], max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._check = check
        self.max_age = max_age
        self._clock = clock
        self._value: tuple[float, T] | None = None
        self._running: anyio.Event | None = None

    async def get(self) -> T:
        """The latest result while it is younger than `max_age`, else a fresh check's (the one in
        flight, if any)."""
        if self.max_age <= 0:
            return await self._check()
        while True:
            if self._value is not None and self._clock() - self._value[0] < self.max_age:
                return self._value[1]
            if self._running is None:
                break
            await self._running.wait()  # then fresh, or the check was cancelled: look again
        self._running = done = anyio.Event()
        try:
            started = self._clock()  # its age counts from before it looked
            value = await self._check()
            self._value = (started, value)
            return value
        finally:
            self._running = None
            done.set()


class Readiness:
    """The store's writability and (api role) the runner process, for /readyz."""

    def __init__(self, store: EventStore, runner_lock: Path | None, max_age: float) -> None:
        self._db = store
        self.runner_lock = runner_lock
        self.max_age = max_age
        self._store = Recent(self._writable, max_age)
        self._holder = Recent(self._runner, max_age)
        self._nodes = Recent(self._read_nodes, max_age)

    async def store(self) -> str:
        """ "ok", or why the store cannot be written."""
        return await self._store.get()

    async def runner(self) -> str | None:
        """Who holds the runner lock (api role: the runner process), or None."""
        return await self._holder.get()

    async def _writable(self) -> str:
        if self.max_age > 0 and isinstance(self._db, _CommitClock) and self._db.committed_within(self.max_age):
            return "ok"  # a commit that recent took the write lock itself
        try:
            await anyio.to_thread.run_sync(self._db.ping)
            return "ok"
        except Exception as exc:  # any failure to write means not ready; report it, do not crash
            return f"not writable: {exc}"

    async def _runner(self) -> str | None:
        if isinstance(self._db, WithNodeLeases):  # PostgreSQL: runner nodes beat in the store
            alive = [n for n in await self.nodes() if n.alive()]
            return ", ".join(f"node {n.node_id} ({n.slots} slots)" for n in alive) or None
        if self.runner_lock is None:
            return None
        return await anyio.to_thread.run_sync(RunnerLock.holder, self.runner_lock)

    async def nodes(self) -> list[NodeRow]:
        """The store's runner nodes ([] for a store without nodes)."""
        return await self._nodes.get()

    async def _read_nodes(self) -> list[NodeRow]:
        if not isinstance(self._db, WithNodeLeases):
            return []
        return await anyio.to_thread.run_sync(self._db.leases.nodes)
