"""The node-lease and turn contracts (`h3core.testing.nodes`) run against PostgreSQL and the fake,
the fake held to the event-store contract too, and fakes that break a clause failing them."""

from __future__ import annotations

import pytest

from h3core.adapters.store.base import utc_now
from h3core.adapters.store.memory import MemoryEventStore
from h3core.adapters.store.memory_leases import MemoryNodeLeases, MemoryNodesEventStore, MemoryTurns, _TurnRow
from h3core.testing.nodes import NodeLeasesContract, TurnsContract
from h3core.testing.store import EventStoreContract


class TestPostgresNodeLeases(NodeLeasesContract, TurnsContract):
    @pytest.fixture
    def open_node(self, pg_url):
        from h3core.adapters.store.postgres import PostgresEventStore

        opened = []

        def open_node(node, clock=utc_now):
            opened.append(PostgresEventStore(pg_url, node=node, clock=clock, pool_size=2))
            return opened[-1]

        yield open_node
        for s in opened:
            s.close()


def memory_nodes(store: MemoryNodesEventStore):
    return lambda node, clock=utc_now: store.as_node(node, clock=clock)


class TestMemoryNodeLeases(NodeLeasesContract, TurnsContract):
    @pytest.fixture
    def open_node(self):
        return memory_nodes(MemoryNodesEventStore())


class TestMemoryNodesEventStore(EventStoreContract):
    @pytest.fixture
    def store(self):
        return MemoryNodesEventStore(MemoryNodeLeases("a"))


class _Unfenced(MemoryNodesEventStore):
    append = MemoryEventStore.append  # checks no lease


class _ReportsFromAnyProcess(MemoryNodeLeases):
    def fence(self, states):
        fence = super().fence(states)
        fence._started = {j: s.attempt for j, s in states.items() if s is not None}  # as if it started them all
        return fence


class _EveryTakerWins(MemoryNodeLeases):
    def take_lease(self, lease, lease_s):
        super().take_lease(lease, lease_s)
        return True


class _LeasesOutliveAttempts(MemoryNodeLeases):
    def settle(self, fence, touched):
        super().settle(fence, {j for j in touched if fence.changes({j})[j] is not None})


class _AgedByTheNodesClock(MemoryNodesEventStore):
    def append(self, job_id, bodies, *, expected_seq=None):
        out = super().append(job_id, bodies, expected_seq=expected_seq)
        lease = self.leases._table.leases.get(job_id)
        if lease is not None:
            lease.renewed_at = self._clock()  # the writing node's clock, not the store's
        return out


class _DrainForgottenOnRestart(MemoryNodeLeases):
    def join(self, info, lease_s):
        super().join(info, lease_s)
        self._table.nodes[self._me()].drain = None  # as a join that rewrites the whole row


class _EveryDrainRestamped(MemoryNodeLeases):
    def set_draining(self, node_id, draining, by=None):
        if node_id in self._table.nodes:
            self._table.nodes[node_id].drain = None  # the first mark's time and asker lost
        return super().set_draining(node_id, draining, by)


@pytest.mark.parametrize(
    ("broken", "test"),
    [
        (
            MemoryNodesEventStore(_DrainForgottenOnRestart()),
            NodeLeasesContract.test_a_drain_is_set_by_any_store_kept_through_restarts_and_cleared,
        ),
        (
            MemoryNodesEventStore(_EveryDrainRestamped()),
            NodeLeasesContract.test_a_drain_is_set_by_any_store_kept_through_restarts_and_cleared,
        ),
        (_Unfenced(), NodeLeasesContract.test_a_node_cannot_write_onto_an_attempt_another_node_leases),
        (
            MemoryNodesEventStore(_ReportsFromAnyProcess()),
            NodeLeasesContract.test_only_the_process_that_started_or_resumed_an_attempt_reports_onto_it,
        ),
        (
            MemoryNodesEventStore(_EveryTakerWins()),
            NodeLeasesContract.test_an_expired_lease_is_seen_by_other_nodes_only_and_one_of_two_takers_wins,
        ),
        (
            MemoryNodesEventStore(_LeasesOutliveAttempts()),
            NodeLeasesContract.test_a_lease_ends_with_its_attempt_and_the_next_attempt_takes_its_own,
        ),
        (_AgedByTheNodesClock(), NodeLeasesContract.test_beats_and_leases_age_by_the_stores_clock_not_the_nodes),
    ],
    ids=[
        "drain-forgotten-on-restart",
        "every-drain-restamped",
        "unfenced",
        "reports-from-any-process",
        "every-taker-wins",
        "leases-outlive-attempts",
        "aged-by-the-nodes-clock",
    ],
)
def test_the_contract_fails_a_store_that_breaks_it(broken, test):
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        test(NodeLeasesContract(), memory_nodes(broken))


class _TurnsFreeWhileHeld(MemoryTurns):
    def take_turn(self, name, lease_s):
        self._table.turns.pop(name, None)  # as a session lock on a pooled connection handed back
        return super().take_turn(name, lease_s)


class _TurnsForAsLongAsTheSession(MemoryTurns):
    def take_turn(self, name, lease_s):
        return super().take_turn(name, 3600.0 if lease_s < 1 else lease_s)  # no lease of its own: the session's


class _TurnsAgedByTheHoldersClock(MemoryTurns):
    def take_turn(self, name, lease_s):
        turn = super().take_turn(name, lease_s)
        if turn is not None:
            row = self._table.turns[name]
            self._table.turns[name] = _TurnRow(row.token, row.lease_s, self.clock())  # the holder's clock, not the store's
        return turn


class _BrokenTurns(MemoryNodesEventStore):
    """A fake whose `turns` are of class `kind`, the holder's clock handed to them."""

    def __init__(self, kind: type[MemoryTurns]) -> None:
        super().__init__()
        self.kind = kind

    @property
    def turns(self) -> MemoryTurns:
        turns = self.kind(self._leases)
        turns.clock = self._clock  # type: ignore[attr-defined]
        return turns


@pytest.mark.parametrize(
    ("broken", "test"),
    [
        (_TurnsFreeWhileHeld, TurnsContract.test_a_turn_has_one_holder_until_it_is_released),
        (_TurnsForAsLongAsTheSession, TurnsContract.test_a_turn_not_renewed_within_its_lease_passes_on_and_its_old_holder_knows),
        (_TurnsAgedByTheHoldersClock, TurnsContract.test_turns_age_by_the_stores_clock_not_the_holders),
    ],
    ids=["free-while-held", "held-for-the-session", "aged-by-the-holders-clock"],
)
def test_the_turns_contract_fails_turns_that_break_it(broken, test, monkeypatch):
    monkeypatch.setattr("h3core.testing.nodes.WAIT_S", 1.0)  # a turn that never passes: fail in a second
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        test(TurnsContract(), memory_nodes(_BrokenTurns(broken)))
