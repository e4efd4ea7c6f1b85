"""What /readyz reports from outside this process's memory, kept fresh by a background task.

A readiness probe must answer within its timeout (Kubernetes: 1 s by default) however loaded the
service and its store are. A probe that looked at the store itself waited behind every commit of
every process writing the store (SQLite's write lock; a worker thread besides): p99 730 ms with
8 processes writing the store. So the looks run in the background and the handler reads memory:

- `Readiness.run` looks every `interval_s`: is the store writable (proved without a lock by a
  commit of this process within the interval, else by `ping` on a thread of its own), and, in the
  api role, who runs the jobs (the runner lock's holder; on PostgreSQL the runner nodes, read for
  every role: /readyz lists them). A look that fails says why (`store: "not writable: ..."`);
- `Readiness.now()` is the last look, read from memory; once no look has come back for
  `stale_s` (the store hangs, or the task stopped), the store is reported unchecked, and so not
  ready, whatever the last look said;
- what lives in memory anyway (the runner accepting, the executor's modes, its groups) is read on
  every request by the handler, so a runner that stops or an executor that goes down is reported
  at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import anyio
from anyio.abc import TaskStatus

from h3core.adapters.lock import RunnerLock
from h3core.adapters.store.base import EventStore
from h3core.adapters.store.nodes import NodeRow, WithNodeLeases
from h3core.service.views import NodeView

__all__ = ["Look", "Readiness"]

log = logging.getLogger("h3core.service")

T = TypeVar("T")


@runtime_checkable
class _CommitClock(Protocol):
    """A store that knows when this process last committed (SQLite's and PostgreSQL's)."""

    def committed_within(self, seconds: float) -> bool: ...


@dataclass(frozen=True)
class Look:
    """One look at what /readyz reports from outside memory: `store` ("ok", or why it cannot be
    written), `runner` (api role: who runs the jobs, None for no one), the runner nodes of a shared
    store (as /readyz lists them), and when the look began (`at`, the readiness clock's)."""

    store: str
    runner: str | None = None
    nodes: tuple[NodeView, ...] = ()
    at: float = 0.0


class Readiness:
    """The store's writability, (api role) who runs the jobs, and the runner nodes, looked at every
    `interval_s` by `run` and read by /readyz from memory (`now`)."""

    def __init__(
        self,
        store: EventStore,
        runner_lock: Path | None,
        interval_s: float,
        stale_s: float,
        *,
        api: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`runner_lock`: the SQLite runner lock whose holder runs the jobs (api role); `api`: this
        process runs no jobs (who does is part of readiness)."""
        self._db = store
        self.runner_lock = runner_lock
        self.interval_s = interval_s
        self.stale_s = stale_s
        self.api = api
        self._clock = clock
        self._last: Look | None = None
        self._warned: str | None = None  # the last failure logged: a failing store is logged once, not every look
        # Its own thread: a look never waits for one the requests hold, nor holds one they need.
        self._thread = anyio.CapacityLimiter(1)

    def now(self) -> Look:
        """The last look, from memory; the store reported unchecked (not ready) where none has come
        back within `stale_s`."""
        last, now = self._last, self._clock()
        if last is None:
            return Look(store="not checked yet: the first look at the store has not come back", at=now)
        age = now - last.at
        if age > self.stale_s:
            why = f"not checked for {age:.1f} s: the last look at the store has not come back (bound {self.stale_s:g} s)"
            return replace(last, store=why)
        return last

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Look every `interval_s` until cancelled; `task_status` is started once the first look has
        come back, so /readyz answers from one."""
        started = False
        while True:
            began = self._clock()
            self._last = await self.look(began)
            if not started:
                task_status.started()
                started = True
            await anyio.sleep(max(0.0, self.interval_s - (self._clock() - began)))

    async def look(self, began: float | None = None) -> Look:
        """One look (what `run` keeps): never raises but for cancellation; a part that fails says why."""
        began = self._clock() if began is None else began
        store = await self._writable()
        try:
            rows = await self._thread_run(self._db.leases.nodes) if isinstance(self._db, WithNodeLeases) else []
        except Exception as exc:  # the store's own answer says it is failing; who runs the jobs is unknown
            self._warn(f"/readyz could not read the runner nodes: {exc}")
            return Look(store if store != "ok" else f"the runner nodes cannot be read: {exc}", None, (), began)
        nodes = tuple(NodeView.of(n) for n in rows)
        runner = await self._runner(rows) if self.api else None
        if store == "ok":
            self._warned = None
        return Look(store, runner, nodes, began)

    def _warn(self, message: str) -> None:
        if message != self._warned:
            log.warning("%s", message, extra={"error": message})
            self._warned = message

    async def _thread_run(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=self._thread)

    async def _writable(self) -> str:
        if isinstance(self._db, _CommitClock) and self._db.committed_within(self.interval_s):
            return "ok"  # a commit that recent took the write lock itself
        try:
            await self._thread_run(self._db.ping)
            return "ok"
        except Exception as exc:  # any failure to write means not ready; report it, do not crash
            return f"not writable: {exc}"

    async def _runner(self, rows: list[NodeRow]) -> str | None:
        if isinstance(self._db, WithNodeLeases):  # PostgreSQL: runner nodes beat in the store
            return ", ".join(f"node {n.node_id} ({n.slots} slots)" for n in rows if n.alive() and n.drain is None) or None
        lock = self.runner_lock
        if lock is None:
            return None
        try:
            return await self._thread_run(lambda: RunnerLock.holder(lock))
        except OSError as exc:
            self._warn(f"/readyz could not look at the runner lock: {exc}")
            return None
