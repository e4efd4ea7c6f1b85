"""A runner node among several on one store: it joins, beats, and takes over dead nodes' attempts.

The heartbeat runs in a thread of its own, with its own connection from the store's pool: an
executor that blocks the event loop (a GPU step called without a worker thread) or a long group
commit does not stop it, so a busy node keeps its leases. What it beats with (slots, the executor's
capabilities: what admission on every node judges by) is refreshed from the event loop, which is
where the executor is asked.

Every node looks for leases older than `lease_s` (their node stopped beating: killed, frozen, cut
off from the store). It takes each over (`take_lease`: one wins), and ends the attempt as recovery
ends a dead process's: its committed video adopted (or a whole staged one its commit had not yet
recorded, judged by this node's executor's frames), else `interrupted` naming the node and the
lease's age, retried or failed by the job's retry policy. A node that comes back after that finds
its writes refused (`LeaseLost`), and its attempt ends without writing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

import anyio

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.nodes import NodeInfo, NodeLeases, node_leases
from h3core.executors.base import Executor
from h3core.runtime._journal import Journal
from h3core.runtime._recovery import end_dead_attempt

__all__ = ["NodeHeartbeat", "node_info", "take_over_expired", "watch_nodes"]

log = logging.getLogger("h3core.nodes")


def node_info(leases: NodeLeases, executor: Executor, slots: int, role: str) -> NodeInfo:
    """What this node says of itself (asked on the event loop: the executor's capabilities)."""
    assert leases.node_id is not None
    caps = executor.capabilities()
    return NodeInfo(
        node_id=leases.node_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        role=role,
        slots=slots,
        executor=executor.name,
        modes=list(caps.runnable_modes),
        capabilities=caps,
    )


class NodeHeartbeat:
    """Beats every `every_s` from its own thread until stopped; `info` is what it beats with."""

    def __init__(self, leases: NodeLeases, info: NodeInfo, every_s: float) -> None:
        self.leases = leases
        self.info = info
        self.every_s = every_s
        self.renewed: set[str] = set()  # the jobs whose leases the last beat renewed
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"h3core-heartbeat-{leases.node_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.renewed = self.leases.beat(self.info)
                self.beats += 1
            except Exception as exc:  # the store is away: beat again; past the lease, others take over
                log.warning("node %s: heartbeat failed: %s", self.leases.node_id, exc, extra={"error": str(exc)})
            self._stop.wait(self.every_s)


async def take_over_expired(
    journal: Journal, artifacts: ArtifactStore | None, lease_s: float, executor: Executor | None = None
) -> int:
    """End the attempts of nodes that stopped beating (each lease taken over first: one node wins
    it); `executor`: this node's, whose frames say whether a staged video is whole. Returns how
    many this node ended."""
    leases = node_leases(journal.store)
    assert leases is not None
    ended = 0
    for lease in await journal.read(leases.expired, lease_s):
        if not await journal.read(leases.take_lease, lease, lease_s):
            continue  # another node took it, or its holder beat again
        state = await journal.read(journal.store.get, lease.job_id)
        if state is None or state.status != "running" or state.attempt != lease.attempt:
            continue  # it ended meanwhile
        message = (
            f"node {lease.node_id} stopped heartbeating while attempt {lease.attempt} ran: its lease was "
            f"{lease.age_s:.1f}s old (lease {lease_s:g}s); ended by node {leases.node_id}"
        )
        log.warning("job %s: %s", lease.job_id, message, extra={"job_id": lease.job_id, "node": lease.node_id})
        if await end_dead_attempt(journal, artifacts, state, message, executor) is not None:
            ended += 1
    return ended


async def watch_nodes(
    journal: Journal,
    heartbeat: NodeHeartbeat,
    info: Callable[[], NodeInfo],
    artifacts: ArtifactStore | None,
    lease_s: float,
    executor: Executor | None = None,
) -> None:
    """Refresh what the heartbeat says and take over dead nodes' attempts, every third of a lease."""
    while True:
        heartbeat.info = info()
        await take_over_expired(journal, artifacts, lease_s, executor)
        await anyio.sleep(lease_s / 3)
