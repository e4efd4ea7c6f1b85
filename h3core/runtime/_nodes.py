"""A runner node among several on one store: it joins, beats, and takes over dead nodes' attempts.

The heartbeat runs in a thread of its own, with its own connection from the store's pool: an
executor that blocks the event loop (a GPU step called without a worker thread) or a long group
commit does not stop it, so a busy node keeps its leases. What it beats with (slots, the executor's
capabilities and the rules its admission judges by, profile included: what admission on every
node judges a request for it by) is refreshed from the event loop, which is where the executor is
asked.

Every node looks for leases older than `lease_s` (their node stopped beating: killed, frozen, cut
off from the store). It takes each over (`take_lease`: one wins), and ends the attempt as recovery
ends a dead process's: its committed video adopted (or a whole staged one its commit had not yet
recorded, judged by this node's executor's frames), else `interrupted` naming the node and the
lease's age, retried or failed by the job's retry policy. A node that comes back after that (it
was frozen: SIGSTOP, a long pause, a hung driver) finds its writes refused (`LeaseLost`) and its
first beat renewing nothing: each of its attempts is lost to it (h3core.runtime._supervisor), its
executor stopped and nothing more written for it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

import anyio

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.nodes import Drain, NodeInfo, NodeLeases, node_leases
from h3core.domain.admission import AdmissionRules
from h3core.executors.base import Executor
from h3core.runtime._journal import Journal
from h3core.runtime._recovery import end_dead_attempt

if TYPE_CHECKING:
    from h3core.runtime._supervisor import Supervisor

__all__ = ["NodeHeartbeat", "node_info", "not_renewed", "take_over_expired", "watch_nodes"]

log = logging.getLogger("h3core.nodes")


def node_info(
    leases: NodeLeases, executor: Executor, slots: int, role: str, rules: Callable[[], AdmissionRules] | None = None
) -> NodeInfo:
    """What this node says of itself (asked on the event loop: the executor's capabilities); `rules`:
    what its own admission judges by now, stated whole (its profile included) for the other nodes
    to admit for it by."""
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
        rules=rules().statement() if rules is not None else None,
    )


def last_beat(leases: NodeLeases) -> datetime | None:
    """This node's last heartbeat as the store keeps it (None: it never joined): read before it
    joins again, when its previous process was last seen alive."""
    return next((row.beat_at for row in leases.nodes() if row.node_id == leases.node_id), None)


class NodeHeartbeat:
    """Beats every `every_s` from its own thread until stopped; `info` is what it beats with.
    After each beat it reads the node's drain (`drain`: None while it takes new jobs), which the
    claims ask before each look at the queue: a drain set anywhere stops them within a beat."""

    def __init__(self, leases: NodeLeases, info: NodeInfo, every_s: float) -> None:
        self.leases = leases
        self.info = info
        self.every_s = every_s
        self.drain: Drain | None = None
        # The last beat that went through: when it began (time.monotonic) and the jobs whose leases it renewed.
        self.last: tuple[float, frozenset[str]] | None = None
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
                began = time.monotonic()
                self.last = (began, frozenset(self.leases.beat(self.info)))  # one assignment: read whole by the event loop
                self.beats += 1
                self.observe(self.leases.draining())
            except Exception as exc:  # the store is away: beat again; past the lease, others take over
                log.warning("node %s: heartbeat failed: %s", self.leases.node_id, exc, extra={"error": str(exc)})
            self._stop.wait(self.every_s)

    def observe(self, drain: Drain | None) -> None:
        """Keep the node's drain as read (by a beat, or before the node's first claim), saying in
        the log when it changes."""
        was, self.drain = self.drain, drain
        node = self.leases.node_id
        if drain is not None and was is None:
            by = f" by {drain.by}" if drain.by else ""
            log.info("node %s is draining (marked%s): it takes no new jobs; what it runs goes on", node, by, extra={"node": node})
        elif drain is None and was is not None:
            log.info("node %s is no longer draining: it takes new jobs again", node, extra={"node": node})


def not_renewed(heartbeat: NodeHeartbeat, began: Mapping[str, float]) -> list[str]:
    """The jobs among `began` (each with when its attempt began here, after its lease was taken)
    whose lease the last beat, begun later, did not renew: another node took it over, or ended
    the attempt. Pure."""
    if heartbeat.last is None:
        return []
    at, renewed = heartbeat.last
    return [job_id for job_id, since in began.items() if since < at and job_id not in renewed]


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
    supervisor: Supervisor,
    executor: Executor | None = None,
) -> None:
    """Every third of a lease: refresh what the heartbeat says, stop this node's attempts whose
    leases it no longer holds, and take over dead nodes' attempts."""
    while True:
        heartbeat.info = info()
        if gone := not_renewed(heartbeat, supervisor.leased()):
            await _lose_leases(journal, heartbeat.leases, supervisor, gone)
        await take_over_expired(journal, artifacts, lease_s, executor)
        await anyio.sleep(lease_s / 3)


async def _lose_leases(journal: Journal, leases: NodeLeases, supervisor: Supervisor, job_ids: list[str]) -> None:
    """Stop this node's attempts of `job_ids`, whose leases it no longer holds, naming who does."""
    holders = await journal.read(leases.lease_holders)
    for job_id in job_ids:
        holder = holders.get(job_id)
        if holder == leases.node_id:  # held under this node's id after all: its writes will tell
            continue
        held = f"node {holder} holds it now" if holder is not None else "no node holds it now (its attempt ended)"
        supervisor.lose(job_id, f"the heartbeat did not renew its lease: {held}", holder)
