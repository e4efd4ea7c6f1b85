"""Several runner nodes on one store: who they are, and the lease each holds on what it runs.

A store shared by runner nodes (PostgreSQL's) is `WithNodeLeases`: besides the event log and its
projections it has `leases`, a `NodeLeases` that keeps a row per node (its identity, slots, what
its executor can run and the rules its admission judges by, profile included, its last heartbeat)
and a lease per running attempt, taken by the `running` (or `resumed`) event the node writes and
renewed by the node's heartbeat. The store is opened for one node (`leases.node_id`) or for none
(an API process: it reads the nodes and writes unfenced).
The contract, which `h3core.testing.nodes.NodeLeasesContract` checks against PostgreSQL and the
fake (`memory_leases.MemoryNodeLeases`, fencing a `MemoryNodesEventStore`):

- **Fenced writes.** A store opened for a node (`node_id` set) refuses, with `LeaseLost`, any
  event but `cancel_requested` on a running job whose lease another node holds: a node that lost
  its lease (it stopped beating, another took over) cannot write onto an attempt it no longer owns.
  The check is made inside the append's own write (its transaction, under its lock), never before
  it: a lease taken over between a check and the write would let the write through. `Fence` is
  that check and the lease changes an append makes, for an implementation to run inside its write.
- **Reports from the attempt's own process.** It also refuses, with `LeaseLost`, what only the
  process running an attempt reports onto it (`OWN_REPORTS`: progress, segments done, checkpoints logged,
  restored or rejected) onto a running attempt that this store object (this process) did not
  start or resume, or that it left running (`detached`): a process that lost an attempt cannot
  report onto a later attempt of the job, not even one its node id holds again (a replacement
  process joined under the id while it was frozen). Ends, adoptions and cancel requests are not
  reports: recovery and takeover write them for attempts they did not start.
- **Leases end with their attempt.** An append that leaves the job not running drops its lease.
- **Takeover is optimistic.** `take_lease` moves a lease only if it is still held by the node the
  caller saw and still older than the lease length, in one statement: of two nodes taking over, or
  a node taking over while the holder comes back and beats, exactly one wins.
- **Ages are the server's.** Beats and lease ages use the store's clock, so nodes' clocks may
  differ without a lease expiring early or late.
- **Draining is the store's, and outlives the node's restarts.** Any store (one opened for no
  node included) may mark a node it knows draining (`set_draining`): the node claims no new job
  while it is, and the attempts it runs go on. The mark keeps when it was first set and who set
  it, every store sees it in `nodes`, the node reads it with `draining`, and it stays through the
  node's restarts and joins until a store clears it, as a cordon does: a node drained for
  maintenance does not take work again because its process came back.

A store shared by nodes may also be `WithTurns`: its `turns` are work that one process of the
deployment must do at a time (delivering webhooks from the log), each waiting for a named turn.
The contract, which `h3core.testing.nodes.TurnsContract` checks against PostgreSQL and the fake:

- **One holder per name.** A turn is taken for a lease (`take_turn(name, lease_s)`) and renewed
  by its holder (`renew`); nobody else takes it while its last renewal (or the take) is younger
  than that lease, by the store's clock. Of two takers of a free turn exactly one wins.
- **A lease, not a session.** A holder that stops renewing (killed, frozen, cut off from the
  store) loses the turn once its lease has passed: another process takes it then, and the old
  holder's `renew` says False from then on, even where nobody took it. A release frees it at once.
- **The holder knows without asking.** `held()` reads no store: it is True while the last renewal
  that succeeded (or the take) began less than the lease ago by the holder's own monotonic clock,
  so a holder that thaws after a freeze knows it may have lost the turn before it acts again;
  a taker, by the store's clock, cannot take it before then.

Callers ask a store for these parts with `isinstance(store, WithNodeLeases)` (or `node_leases`,
for a store opened as a node) and `isinstance(store, WithTurns)`; a store without them (SQLite,
memory) has one runner and no nodes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from pydantic import BaseModel

from h3core.adapters.store.base import Conflict
from h3core.domain.admission import RulesStatement
from h3core.domain.capabilities import Capabilities
from h3core.domain.events import (
    Body,
    CancelRequested,
    Checkpointed,
    CheckpointRejected,
    Detached,
    Progress,
    Restored,
    Resumed,
    Running,
    SegmentDone,
)
from h3core.domain.state import JobState

__all__ = [
    "Drain",
    "Expired",
    "Fence",
    "LeaseLost",
    "NodeInfo",
    "NodeLeases",
    "NodeRow",
    "NodeTaken",
    "OWN_REPORTS",
    "HeldTurn",
    "Turn",
    "TurnLost",
    "Turns",
    "WithNodeLeases",
    "WithTurns",
    "another_live_process",
    "node_leases",
]


# What only the process running an attempt writes onto it, and only while it does (the module
# docstring's reports from the attempt's own process).
OWN_REPORTS = (Progress, Checkpointed, Restored, CheckpointRejected, SegmentDone)


class LeaseLost(Conflict):
    """The job's running attempt is not this node's to write onto: another node holds its lease
    (`holder`, where known), or this process did not start it (see the module's contract)."""

    def __init__(self, message: str, holder: str | None = None) -> None:
        """`holder`: the node whose lease the attempt is under now, where the store knows."""
        super().__init__(message)
        self.holder = holder


class NodeTaken(RuntimeError):
    """Another live process already beats under this node id."""


class NodeInfo(BaseModel):
    """What a node says of itself at each beat."""

    node_id: str
    host: str
    pid: int
    role: str  # "runner" or "all"
    slots: int
    executor: str
    modes: list[str]  # what its executor can start now
    # Its executor's whole statement (modes, window, budgets, ...). None from a node of an older
    # version (it states its modes only).
    capabilities: Capabilities | None = None
    # What its own admission judges a request by: those capabilities with the budgets its capacity
    # profiles give each group, and the profile that describes it. Every node admits for it by this
    # (`h3core.runtime.fleet`). None from a node of an older version: a reader applies its own profiles.
    rules: RulesStatement | None = None


class Drain(BaseModel):
    """A node marked draining: since when (the store's clock) and by whom (None: not said)."""

    since: datetime
    by: str | None = None


class NodeRow(NodeInfo):
    """A node as the store keeps it: with when it started, last beat (and that beat's age by the
    store's clock), whether it left (a graceful stop), how many attempts it leases now, and its
    drain (None: it takes new jobs)."""

    started_at: datetime
    beat_at: datetime
    beat_age_s: float
    left_at: datetime | None
    lease_s: float
    leases: int
    drain: Drain | None = None

    def alive(self) -> bool:
        """Whether the node still runs: it has not left, and its last beat is no older than its lease length."""
        return self.left_at is None and self.beat_age_s <= self.lease_s


class Expired(BaseModel):
    """A running attempt whose lease was not renewed for longer than the lease length."""

    job_id: str
    attempt: int
    node_id: str
    age_s: float


@runtime_checkable
class NodeLeases(Protocol):
    """Nodes and leases (the module docstring states the contract). `node_id`: the node this
    process is, whose writes are fenced and whose `running` events take leases; None for a
    process that is no node (it reads the nodes; `join`, `beat`, `leave` and `take_lease` raise)."""

    node_id: str | None

    def join(self, info: NodeInfo, lease_s: float) -> None:
        """Register this node (raises `NodeTaken` if a live process beats under its id)."""
        ...

    def beat(self, info: NodeInfo) -> set[str]:
        """Record a heartbeat and renew this node's leases; returns the jobs whose leases it renewed."""
        ...

    def leave(self) -> None:
        """Mark this node stopped (a graceful stop: its leases ended with its attempts)."""
        ...

    def nodes(self) -> list[NodeRow]:
        """Every node the store knows, live or not, by id."""
        ...

    def set_draining(self, node_id: str, draining: bool, by: str | None = None) -> bool:
        """Mark node `node_id` draining (it claims no new job; what it runs goes on), keeping the
        first mark's time and `by` while it stays draining, or clear the mark; False for a node
        the store does not know. Any store may, one opened for no node included."""
        ...

    def draining(self) -> Drain | None:
        """This node's drain, read from the store now (None: it takes new jobs)."""
        ...

    def lease_holders(self) -> dict[str, str]:
        """Each leased job's node."""
        ...

    def expired(self, lease_s: float) -> list[Expired]:
        """Other nodes' leases not renewed for more than `lease_s`, oldest first."""
        ...

    def take_lease(self, lease: Expired, lease_s: float) -> bool:
        """Move `lease` to this node if it is still the holder's and still expired; False if not."""
        ...


@runtime_checkable
class Turn(Protocol):
    """A named turn this process holds (the module docstring states the contract)."""

    name: str
    lease_s: float

    def renew(self) -> bool:
        """Renew the lease on the store; False once the turn is no longer this holder's (its lease
        passed, another holder took it). Raises what the store raises when it cannot answer."""
        ...

    def held(self) -> bool:
        """Still this holder's as far as it knows without asking the store: not lost to a renewal,
        and the last renewal that succeeded (or the take) began less than the lease ago."""
        ...

    def release(self) -> None:
        """Give the turn up: another process may take it now."""
        ...


@runtime_checkable
class Turns(Protocol):
    """Named turns, each held by one process of the deployment at a time (the module docstring)."""

    def take_turn(self, name: str, lease_s: float) -> Turn | None:
        """Hold the turn `name` for `lease_s` (renewed by its holder) if nobody holds it; None if
        another process does."""
        ...


class TurnLost(RuntimeError):
    """A turn this process held is no longer its own (or may not be): it must not act on it."""


class HeldTurn:
    """A turn held under one token, as `Turn` says, for its implementations: this bookkeeping of
    what the holder knows of its lease without asking the store (the contract's last clause), over
    the store's own statements, which a subclass gives (`_renewed`, `_released`)."""

    def __init__(self, name: str, token: str, lease_s: float, since: float) -> None:
        """`since`: this process's monotonic time before the take was sent (the store's lease
        starts no earlier)."""
        self.name = name
        self.token = token
        self.lease_s = lease_s
        self._since = since
        self._lost = False

    def renew(self) -> bool:
        """Renew on the store (`_renewed`); False, for good, once the turn is not this hold's."""
        at = time.monotonic()  # before the statement goes: the store's renewal is no earlier
        if self._renewed():
            self._since = max(self._since, at)
            return True
        self._lost = True
        return False

    def held(self) -> bool:
        """Not lost, and the last renewal that succeeded (or the take) began less than the lease ago."""
        return not self._lost and time.monotonic() - self._since < self.lease_s

    def release(self) -> None:
        """Never held again from now; the store's row gone if it is still this hold's (`_released`)."""
        self._lost = True
        self._released()

    def _renewed(self) -> bool:
        raise NotImplementedError

    def _released(self) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, lease_s={self.lease_s:g})"


@runtime_checkable
class WithNodeLeases(Protocol):
    """An optional capability: an event store shared by runner nodes, whose `leases` fence its
    appends (the module docstring)."""

    @property
    def leases(self) -> NodeLeases:
        """The store's nodes and leases, over the same database as its log."""
        ...


@runtime_checkable
class WithTurns(Protocol):
    """An optional capability: an event store whose `turns` let one process of the deployment at
    a time do a named piece of work (the module docstring)."""

    @property
    def turns(self) -> Turns:
        """The store's named turns."""
        ...


def node_leases(store: object) -> NodeLeases | None:
    """The store's leases where it was opened as a node (`WithNodeLeases`, a `node_id`); None for
    a store without nodes or one opened for no node (an API process)."""
    if isinstance(store, WithNodeLeases) and store.leases.node_id is not None:
        return store.leases
    return None


class Fence:
    """The leases of the jobs one write touches, read inside that write (its transaction, under
    its lock), and the attempts among them this process started or resumed: `check` refuses what
    the contract's fenced writes refuse, `record` makes the lease change an append makes, `changes`
    is what to write back before the write commits, and `keep_starts` brings this process's own
    attempts up to the write. No I/O: each implementation of `NodeLeases` reads and writes the
    leases its own way, keeps its process's attempts itself, and decides alike."""

    def __init__(
        self, node_id: str | None, held: Mapping[str, tuple[str, int] | None], started: Mapping[str, int] | None = None
    ) -> None:
        """`held`: (node, attempt) of each running job's lease, as read in the write; jobs with none
        are left out. `started`: the attempt of each job this process started or resumed, as it
        kept them (jobs with none left out)."""
        self.node_id = node_id
        self._held = dict(held)
        self._started: dict[str, int | None] = dict(started or {})
        self._starts: set[str] = set()  # the jobs whose own attempt this write started or ended

    def check(self, state: JobState | None, bodies: Sequence[Body]) -> None:
        """Raise `LeaseLost` where `bodies` go onto a running attempt another node leases (a cancel
        request comes from anywhere), or report onto one this process did not start or resume (a
        store opened for no node is not fenced)."""
        if self.node_id is None or state is None or state.status != "running":
            return
        lease = self._held.get(state.job_id)
        asks_cancel = all(isinstance(b, CancelRequested) for b in bodies)
        if lease is not None and lease != (self.node_id, state.attempt) and not asks_cancel:
            raise LeaseLost(
                f"job {state.job_id}: attempt {state.attempt} is leased to node {lease[0]}, not {self.node_id}", lease[0]
            )
        if self._started.get(state.job_id) != state.attempt and any(isinstance(b, OWN_REPORTS) for b in bodies):
            raise LeaseLost(
                f"job {state.job_id}: attempt {state.attempt} was not started or resumed by this process of node "
                f"{self.node_id}: its reports are not this process's to write",
                lease[0] if lease is not None else None,
            )

    def record(self, state: JobState, bodies: Sequence[Body]) -> None:
        """`bodies` were folded into `state`: a job no longer running loses its lease, an attempt
        this node starts (`running`) or re-attaches to (`resumed`) is leased to it, and is this
        process's own to report onto until it ends or the process leaves it (`detached`)."""
        if state.status != "running":
            self._held[state.job_id] = None
            self._started[state.job_id] = None
            self._starts.add(state.job_id)
        elif self.node_id is not None and any(isinstance(b, Running | Resumed) for b in bodies):
            self._held[state.job_id] = (self.node_id, state.attempt)
            self._started[state.job_id] = state.attempt
            self._starts.add(state.job_id)
        elif any(isinstance(b, Detached) for b in bodies):
            self._started[state.job_id] = None
            self._starts.add(state.job_id)

    def changes(self, touched: set[str]) -> dict[str, tuple[str, int] | None]:
        """The leases of the jobs the write stored events for, each to take (and renew) as
        (node, attempt) or to drop as None; a job that had none and took none is left out."""
        return {j: lease for j, lease in self._held.items() if j in touched}

    def keep_starts(self, started: dict[str, int], touched: set[str]) -> None:
        """Bring `started`, this process's own attempts as it keeps them (by job), up to what the
        write changed of them among the jobs it stored events for: an attempt started or resumed
        is added, one that ended dropped. One taken over by another node stays until the job's
        next start or end here: it admits no other attempt's reports."""
        for job_id in self._starts & touched:
            attempt = self._started[job_id]
            if attempt is None:
                started.pop(job_id, None)
            else:
                started[job_id] = attempt


def another_live_process(was: NodeInfo, info: NodeInfo) -> bool:
    """Whether `was`, the process that last beat under a node id, is another process than `info`'s
    that may still run: so `join` refuses the id (`NodeTaken`). One of this host whose pid is gone
    does not count (a node restarted on its host takes its id back at once)."""
    if (was.host, was.pid) == (info.host, info.pid):
        return False
    return was.host != info.host or _pid_alive(was.pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
