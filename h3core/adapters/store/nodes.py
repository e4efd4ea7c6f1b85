"""Several runner nodes on one store: who they are, and the lease each holds on what it runs.

A store that honours `NodeLeases` (PostgreSQL's) keeps a row per node (its identity, slots, what
its executor can run, its last heartbeat) and a lease per running attempt, taken by the `running`
(or `resumed`) event the node writes and renewed by the node's heartbeat. Its contract:

- **Fenced writes.** A store opened for a node (`node_id` set) refuses, with `LeaseLost`, any
  event but `cancel_requested` on a running job whose lease another node holds: a node that lost
  its lease (it stopped beating, another took over) cannot write onto an attempt it no longer owns.
- **Leases end with their attempt.** An append that leaves the job not running drops its lease.
- **Takeover is optimistic.** `take_lease` moves a lease only if it is still held by the node the
  caller saw and still older than the lease length, in one statement: of two nodes taking over, or
  a node taking over while the holder comes back and beats, exactly one wins.
- **Ages are the server's.** Beats and lease ages use the store's clock, so nodes' clocks may
  differ without a lease expiring early or late.

A store shared by nodes may also honour `Turns`: work that one process of the deployment must do
at a time (delivering webhooks from the log) waits for a named turn. At most one holder per name;
a turn ends when released or when its holder's process dies, and `held()` says whether it still is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from pydantic import BaseModel

from h3core.adapters.store.base import Conflict
from h3core.domain.capabilities import Capabilities

__all__ = ["Expired", "LeaseLost", "NodeInfo", "NodeLeases", "NodeRow", "NodeTaken", "Turn", "Turns"]


class LeaseLost(Conflict):
    """The job's running attempt is leased to another node: this node no longer owns it."""


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
    # Its executor's whole statement (modes, window, budgets, ...): what admission across nodes
    # judges a request by. None from a node of an older version (it states its modes only).
    capabilities: Capabilities | None = None


class NodeRow(NodeInfo):
    """A node as the store keeps it: with when it started, last beat (and that beat's age by the
    store's clock), whether it left (a graceful stop), and how many attempts it leases now."""

    started_at: datetime
    beat_at: datetime
    beat_age_s: float
    left_at: datetime | None
    lease_s: float
    leases: int

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
    """Nodes and leases (the module docstring states the contract)."""

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

    def held(self) -> bool:
        """Still held: False once its connection to the store is gone (another may hold it now)."""
        ...

    def release(self) -> None:
        """Give the turn up: another process may take it now."""
        ...


@runtime_checkable
class Turns(Protocol):
    """An optional capability: named turns, each held by one process of the deployment at a time (the module docstring)."""

    def take_turn(self, name: str) -> Turn | None:
        """Hold the turn `name` if no other process does; None if one does."""
        ...
