"""Node leases on PostgreSQL: the `NodeLeases` of a `PostgresEventStore` (its `leases`), over the
store's own connections and tables (`nodes`, `leases`: schema version 2; drains: 8).

Beats, joins and takeovers write no event, so they do not take the events lock; a beat does not
even wait behind this process's write lock (a group commit in flight must not delay it past the
lease). Ages are `now() - beat_at` on the server. The fence is the one part that runs inside the
event log's append: `fence` reads the leases in the append's transaction (under the events lock)
and `settle` writes what the append changed before it commits, so a node's write and the lease it
is checked against are one transaction. The attempts this process started or resumed (what only it
reports onto: the contract's reports from the attempt's own process) are kept in this object, one
per store object, so in the process: a replacement process under the same node id has its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from h3core.adapters.store._postgres import Connections
from h3core.adapters.store.nodes import Drain, Expired, Fence, NodeInfo, NodeRow, NodeTaken, another_live_process
from h3core.domain.state import JobState

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresNodeLeases"]


class PostgresNodeLeases:
    """Nodes and leases in the store's database (`h3core.adapters.store.nodes` states the
    contract); `node_id`: the node this process is, None for none."""

    def __init__(self, db: Connections, node_id: str | None) -> None:
        """`db`: the store's connections (this object opens none of its own)."""
        self._db = db
        self.node_id = node_id
        # The attempt of each job this process started or resumed (`Fence.keep_starts`), kept as its
        # appends are (under the store's write lock).
        self._started: dict[str, int] = {}

    def _me(self) -> str:
        if self.node_id is None:
            raise RuntimeError("this store was opened without a node id")
        return self.node_id

    # -- inside the event log's append ------------------------------------------------------

    def fence(self, conn: psycopg.Connection, states: Mapping[str, JobState | None]) -> Fence:
        """The leases of the running jobs among `states`, read on `conn`: the append's own
        transaction, under the events lock, so every other append's lease changes committed
        before it or wait for it to commit."""
        running = [j for j, s in states.items() if s is not None and s.status == "running"]
        started = {j: self._started[j] for j in states if j in self._started}
        if not running:
            return Fence(self.node_id, {}, started)
        rows = conn.execute("SELECT job_id, node_id, attempt FROM leases WHERE job_id = ANY(%s)", (running,)).fetchall()
        return Fence(self.node_id, {job_id: (node, attempt) for job_id, node, attempt in rows}, started)

    def settle(self, conn: psycopg.Connection, fence: Fence, touched: set[str]) -> None:
        """Write the fence's lease changes for the jobs the append stored events for, on its
        transaction: those taken (or kept) renewed now, those ended dropped; and keep what it
        changed of this process's own attempts (before the commit: a commit that fails leaves
        one recorded that this process does not run, and whose lease it does not hold)."""
        fence.keep_starts(self._started, touched)
        leases = fence.changes(touched)
        gone = [j for j, lease in leases.items() if lease is None]
        held = {j: lease for j, lease in leases.items() if lease is not None}
        if gone:
            conn.execute("DELETE FROM leases WHERE job_id = ANY(%s)", (gone,))
        if held:
            conn.execute(
                "INSERT INTO leases (job_id, node_id, attempt, renewed_at) SELECT j, n, a, now() "
                "FROM unnest(%s::text[], %s::text[], %s::int[]) AS x(j, n, a) "
                "ON CONFLICT (job_id) DO UPDATE SET node_id = excluded.node_id, attempt = excluded.attempt, renewed_at = now()",
                (list(held), [n for n, _ in held.values()], [a for _, a in held.values()]),
            )

    # -- NodeLeases -------------------------------------------------------------------------

    def join(self, info: NodeInfo, lease_s: float) -> None:
        """Register this node with its lease length; `NodeTaken` if another live process beats under
        its id (one of this host that is gone does not count)."""
        me = self._me()

        def join(conn: psycopg.Connection) -> None:
            row = conn.execute(
                "SELECT info, extract(epoch FROM now() - beat_at)::float8, left_at FROM nodes WHERE node_id = %s FOR UPDATE",
                (me,),
            ).fetchone()
            if row is not None and row[2] is None and row[1] <= lease_s:
                was = NodeInfo.model_validate_json(row[0])
                if another_live_process(was, info):
                    raise NodeTaken(
                        f"node {me} is alive: process {was.pid} on {was.host} beat {row[1]:.1f}s ago; "
                        f"give this one another id (H3_NODE) or wait {lease_s - row[1]:.0f}s"
                    )
            conn.execute(
                "INSERT INTO nodes (node_id, info, lease_s, started_at, beat_at) VALUES (%s, %s, %s, now(), now()) "
                "ON CONFLICT (node_id) DO UPDATE SET info = excluded.info, lease_s = excluded.lease_s, "
                "started_at = now(), beat_at = now(), left_at = NULL",
                (me, info.model_dump_json(), lease_s),
            )

        self._db.write(join, events=False)

    def beat(self, info: NodeInfo) -> set[str]:
        """Record a beat and renew this node's leases, without waiting for a group commit; the jobs whose leases it renewed."""
        me = self._me()

        def beat(conn: psycopg.Connection) -> set[str]:
            conn.execute("UPDATE nodes SET beat_at = now(), info = %s WHERE node_id = %s", (info.model_dump_json(), me))
            rows = conn.execute("UPDATE leases SET renewed_at = now() WHERE node_id = %s RETURNING job_id", (me,)).fetchall()
            return {j for (j,) in rows}

        return self._db.at_once(beat)

    def leave(self) -> None:
        """Mark this node left (a graceful stop)."""
        me = self._me()
        self._db.write(lambda conn: conn.execute("UPDATE nodes SET left_at = now() WHERE node_id = %s", (me,)), events=False)

    def nodes(self) -> list[NodeRow]:
        """Every node, by id, with its last beat's age by the server's clock and how many leases it holds."""
        rows = self._db.read(
            "SELECT n.info, n.started_at, n.beat_at, extract(epoch FROM now() - n.beat_at)::float8, n.left_at, n.lease_s, "
            "(SELECT count(*) FROM leases l WHERE l.node_id = n.node_id), n.drain_since, n.drain_by FROM nodes n "
            "ORDER BY n.node_id"
        )
        return [
            NodeRow(
                **json.loads(info),
                started_at=started,
                beat_at=beat,
                beat_age_s=age,
                left_at=left,
                lease_s=lease_s,
                leases=leases,
                drain=Drain(since=since, by=by) if since is not None else None,
            )
            for info, started, beat, age, left, lease_s, leases, since, by in rows
        ]

    def set_draining(self, node_id: str, draining: bool, by: str | None = None) -> bool:
        """Mark `node_id` draining (an earlier mark kept: its time and asker) or clear it, in one
        statement; False for a node the store does not know."""

        def mark(conn: psycopg.Connection) -> int:
            return conn.execute(
                "UPDATE nodes SET drain_since = CASE WHEN %(on)s THEN coalesce(drain_since, now()) END, "
                "drain_by = CASE WHEN NOT %(on)s THEN NULL WHEN drain_since IS NULL THEN %(by)s ELSE drain_by END "
                "WHERE node_id = %(node)s",
                {"on": draining, "by": by, "node": node_id},
            ).rowcount

        return self._db.write(mark, events=False) == 1

    def draining(self) -> Drain | None:
        """This node's drain, read now (None: it takes new jobs)."""
        rows = self._db.read("SELECT drain_since, drain_by FROM nodes WHERE node_id = %s", (self._me(),))
        return Drain(since=rows[0][0], by=rows[0][1]) if rows and rows[0][0] is not None else None

    def lease_holders(self) -> dict[str, str]:
        """Each leased job's node."""
        return dict(self._db.read("SELECT job_id, node_id FROM leases"))

    def expired(self, lease_s: float) -> list[Expired]:
        """Other nodes' leases not renewed for more than `lease_s` (by the server's clock), oldest first."""
        rows = self._db.read(
            "SELECT job_id, attempt, node_id, extract(epoch FROM now() - renewed_at)::float8 FROM leases "
            "WHERE renewed_at < now() - make_interval(secs => %s) AND node_id IS DISTINCT FROM %s ORDER BY renewed_at",
            (lease_s, self.node_id),
        )
        return [Expired(job_id=j, attempt=a, node_id=n, age_s=age) for j, a, n, age in rows]

    def take_lease(self, lease: Expired, lease_s: float) -> bool:
        """Move `lease` to this node, in one statement, only if it is still the holder's and still
        expired; False if it was not (another took it, or the holder beat)."""
        me = self._me()

        def take(conn: psycopg.Connection) -> int:
            return conn.execute(
                "UPDATE leases SET node_id = %s, renewed_at = now() WHERE job_id = %s AND attempt = %s AND node_id = %s "
                "AND renewed_at < now() - make_interval(secs => %s)",
                (me, lease.job_id, lease.attempt, lease.node_id, lease_s),
            ).rowcount

        return self._db.at_once(take) == 1
