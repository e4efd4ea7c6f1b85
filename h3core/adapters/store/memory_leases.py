"""The fake of node leases: `MemoryNodeLeases` honours the `NodeLeases` contract in memory, and
`MemoryNodesEventStore` is the memory event store whose appends it fences (`WithNodeLeases`), for
tests of code that runs as one node among several, without a PostgreSQL server. Its `turns`
(`MemoryTurns`) honour the `Turns` contract over the same fake (`WithTurns`).

Several nodes share one fake as PostgreSQL's stores share one database: `as_node` gives another
node's view of the same log and leases. Ages are read from the fake's own clock (`now`, its
"server"), never from a node's `clock` (the one events are stamped with).
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from h3core.adapters.store.base import precheck, utc_now
from h3core.adapters.store.memory import MemoryEventStore
from h3core.adapters.store.nodes import Drain, Expired, Fence, HeldTurn, NodeInfo, NodeRow, NodeTaken, another_live_process
from h3core.domain.events import Body, Event
from h3core.domain.state import JobState

__all__ = ["MemoryNodeLeases", "MemoryNodesEventStore", "MemoryTurns"]


@dataclass
class _Node:
    info: NodeInfo
    lease_s: float
    started_at: datetime
    beat_at: datetime
    left_at: datetime | None = None
    drain: Drain | None = None


@dataclass
class _Lease:
    node_id: str
    attempt: int
    renewed_at: datetime


@dataclass
class _TurnRow:
    token: str
    lease_s: float
    renewed_at: datetime


class _Table:
    """What every node's view shares: the nodes, the leases, their lock and the clock ages are read by."""

    def __init__(self, now: Callable[[], datetime]) -> None:
        self.now = now
        self.lock = threading.Lock()
        self.nodes: dict[str, _Node] = {}
        self.leases: dict[str, _Lease] = {}
        self.turns: dict[str, _TurnRow] = {}

    def age(self, at: datetime) -> float:
        return (self.now() - at).total_seconds()


class MemoryNodeLeases:
    """The fake `NodeLeases` (`h3core.adapters.store.nodes` states the contract): nodes and leases
    in memory, gone with the process. `node_id`: the node this view is (None: none); `now`: the
    fake server's clock, which every age is read by."""

    def __init__(self, node_id: str | None = None, *, now: Callable[[], datetime] = utc_now) -> None:
        """A fake of its own; `as_node` gives other nodes' views of it."""
        self.node_id = node_id
        self._table = _Table(now)
        self._started: dict[str, int] = {}  # the attempts this view (its process) started or resumed: `Fence.keep_starts`

    def as_node(self, node_id: str | None) -> MemoryNodeLeases:
        """Node `node_id`'s view of the same nodes and leases."""
        view = copy.copy(self)  # shares the table: one fake, another node
        view.node_id = node_id
        view._started = {}  # another process: it started none of this one's attempts
        return view

    def _me(self) -> str:
        if self.node_id is None:
            raise RuntimeError("these leases were opened without a node id")
        return self.node_id

    # -- inside a store's append (`MemoryNodesEventStore.append`) ----------------------------

    def fence(self, states: Mapping[str, JobState | None]) -> Fence:
        """The leases of the running jobs among `states`, for the append that holds the store's lock."""
        with self._table.lock:
            held = {
                j: (lease.node_id, lease.attempt)
                for j, s in states.items()
                if s is not None and s.status == "running" and (lease := self._table.leases.get(j)) is not None
            }
        return Fence(self.node_id, held, {j: self._started[j] for j in states if j in self._started})

    def settle(self, fence: Fence, touched: set[str]) -> None:
        """Keep the fence's lease changes for the jobs the append stored events for (taken or kept:
        renewed now), and what it changed of this view's own attempts."""
        fence.keep_starts(self._started, touched)
        with self._table.lock:
            for job_id, lease in fence.changes(touched).items():
                if lease is None:
                    self._table.leases.pop(job_id, None)
                else:
                    self._table.leases[job_id] = _Lease(lease[0], lease[1], self._table.now())

    # -- NodeLeases -------------------------------------------------------------------------

    def join(self, info: NodeInfo, lease_s: float) -> None:
        """Register this node with its lease length; `NodeTaken` if another live process beats under its id."""
        me = self._me()
        with self._table.lock:
            was = self._table.nodes.get(me)
            if was is not None and was.left_at is None:
                age = self._table.age(was.beat_at)
                if age <= lease_s and another_live_process(was.info, info):
                    raise NodeTaken(f"node {me} is alive: process {was.info.pid} on {was.info.host} beat {age:.1f}s ago")
            now = self._table.now()
            drain = was.drain if was is not None else None  # a drain outlives the node's restarts
            self._table.nodes[me] = _Node(info, lease_s, started_at=now, beat_at=now, drain=drain)

    def beat(self, info: NodeInfo) -> set[str]:
        """Record a beat and renew this node's leases; the jobs whose leases it renewed."""
        me = self._me()
        with self._table.lock:
            now = self._table.now()
            node = self._table.nodes.get(me)
            if node is not None:
                node.info, node.beat_at = info, now
            mine = {j for j, lease in self._table.leases.items() if lease.node_id == me}
            for j in mine:
                self._table.leases[j].renewed_at = now
        return mine

    def leave(self) -> None:
        """Mark this node left (a graceful stop)."""
        me = self._me()
        with self._table.lock:
            node = self._table.nodes.get(me)
            if node is not None:
                node.left_at = self._table.now()

    def nodes(self) -> list[NodeRow]:
        """Every node, by id, with its last beat's age by the fake's clock and how many leases it holds."""
        with self._table.lock:
            return [
                NodeRow(
                    **n.info.model_dump(),
                    started_at=n.started_at,
                    beat_at=n.beat_at,
                    beat_age_s=self._table.age(n.beat_at),
                    left_at=n.left_at,
                    lease_s=n.lease_s,
                    leases=sum(lease.node_id == node_id for lease in self._table.leases.values()),
                    drain=n.drain,
                )
                for node_id, n in sorted(self._table.nodes.items())
            ]

    def set_draining(self, node_id: str, draining: bool, by: str | None = None) -> bool:
        """Mark `node_id` draining (keeping an earlier mark) or clear it; False for an unknown node."""
        with self._table.lock:
            node = self._table.nodes.get(node_id)
            if node is None:
                return False
            if not draining:
                node.drain = None
            elif node.drain is None:
                node.drain = Drain(since=self._table.now(), by=by)
            return True

    def draining(self) -> Drain | None:
        """This node's drain (None: it takes new jobs, or the fake does not know it)."""
        me = self._me()
        with self._table.lock:
            node = self._table.nodes.get(me)
            return node.drain if node is not None else None

    def lease_holders(self) -> dict[str, str]:
        """Each leased job's node."""
        with self._table.lock:
            return {j: lease.node_id for j, lease in self._table.leases.items()}

    def expired(self, lease_s: float) -> list[Expired]:
        """Other nodes' leases not renewed for more than `lease_s` (by the fake's clock), oldest first."""
        with self._table.lock:
            old = [
                (lease.renewed_at, Expired(job_id=j, attempt=lease.attempt, node_id=lease.node_id, age_s=age))
                for j, lease in self._table.leases.items()
                if (age := self._table.age(lease.renewed_at)) > lease_s and lease.node_id != self.node_id
            ]
        return [e for _, e in sorted(old, key=lambda pair: pair[0])]

    def take_lease(self, lease: Expired, lease_s: float) -> bool:
        """Move `lease` to this node only if it is still the holder's and still expired, under the fake's lock."""
        me = self._me()
        with self._table.lock:
            held = self._table.leases.get(lease.job_id)
            if held is None or (held.node_id, held.attempt) != (lease.node_id, lease.attempt):
                return False  # another took it, or the attempt ended
            if self._table.age(held.renewed_at) <= lease_s:
                return False  # its holder beat
            self._table.leases[lease.job_id] = _Lease(me, lease.attempt, self._table.now())
            return True


class MemoryTurns:
    """The fake `Turns` (`h3core.adapters.store.nodes` states the contract): a row per turn in
    the fake's table, aged by its clock (`now`), as PostgreSQL's `turns` table by the server's."""

    def __init__(self, leases: MemoryNodeLeases) -> None:
        """The turns of the fake `leases` belongs to (every node's view shares them)."""
        self._table = leases._table

    def take_turn(self, name: str, lease_s: float) -> _MemoryTurn | None:
        """Hold `name` for `lease_s` if it has no row, or one past its holder's lease; None if not."""
        since = time.monotonic()
        with self._table.lock:
            row = self._table.turns.get(name)
            if row is not None and self._table.age(row.renewed_at) <= row.lease_s:
                return None
            token = uuid.uuid4().hex
            self._table.turns[name] = _TurnRow(token, lease_s, self._table.now())
        return _MemoryTurn(self._table, name, token, lease_s, since)


class _MemoryTurn(HeldTurn):
    """A turn held under one token (`MemoryTurns.take_turn`)."""

    def __init__(self, table: _Table, name: str, token: str, lease_s: float, since: float) -> None:
        super().__init__(name, token, lease_s, since)
        self._table = table

    def _renewed(self) -> bool:
        with self._table.lock:
            row = self._table.turns.get(self.name)
            if row is None or row.token != self.token or self._table.age(row.renewed_at) > row.lease_s:
                return False
            row.renewed_at = self._table.now()
            return True

    def _released(self) -> None:
        with self._table.lock:
            row = self._table.turns.get(self.name)
            if row is not None and row.token == self.token:
                del self._table.turns[self.name]


class MemoryNodesEventStore(MemoryEventStore):
    """The memory event store shared by runner nodes (`WithNodeLeases`): its appends are fenced by
    its `leases` inside the same hold of its lock, as PostgreSQL's are inside the append's
    transaction; its `turns` are the fake's too. `leases`: the fake's nodes and leases, as the
    node this view is (by default a fake of its own, for no node); `clock`: what its events are
    stamped with."""

    def __init__(self, leases: MemoryNodeLeases | None = None, *, clock: Callable[[], datetime] = utc_now) -> None:
        """A store of its own (one "database"); `as_node` gives other nodes' views of it."""
        super().__init__(clock=clock)
        self._leases = leases if leases is not None else MemoryNodeLeases()

    @property
    def leases(self) -> MemoryNodeLeases:
        """The nodes and their leases, which fence this store's appends."""
        return self._leases

    @property
    def turns(self) -> MemoryTurns:
        """Named turns over the same fake (`Turns`)."""
        return MemoryTurns(self._leases)

    def as_node(self, node: str | None, *, clock: Callable[[], datetime] | None = None) -> MemoryNodesEventStore:
        """Node `node`'s view of the same log and leases, as another process's store on the same
        database; its events stamped by `clock` (by default this view's)."""
        view = copy.copy(self)  # shares every table and the lock: one store, another node
        view._leases = self._leases.as_node(node)
        if clock is not None:
            view._clock = clock
        return view

    def append(
        self, job_id: str, bodies: Sequence[Body], *, expected_seq: int | None = None
    ) -> tuple[JobState, tuple[Event, ...]]:
        """The memory store's append, checked against and moving the job's lease under the same
        hold of the lock (`append_batch` appends each item through here)."""
        with self._lock:
            state = self._states.get(job_id)
            precheck(state, job_id, bodies, expected_seq)  # the same refusal first as PostgreSQL's
            fence = self._leases.fence({job_id: state})
            fence.check(state, bodies)
            new_state, events = super().append(job_id, bodies, expected_seq=expected_seq)
            fence.record(new_state, bodies)
            self._leases.settle(fence, {job_id})
        return new_state, events
