"""The node-lease contract as tests, for any event store shared by runner nodes (`WithNodeLeases`).

Subclass `NodeLeasesContract` and override its `open_node` fixture: a function that opens
`(node, clock)`, node `node`'s store (None: a store for no node, as an API process opens) whose
events are stamped by `clock`, every call on the same fresh, empty backend (one database, as
several processes share it), each closed when the test ends; pytest then runs every clause of
the contract in `h3core.adapters.store.nodes` against it, each both ways (what it lets through
and what it refuses):

    class TestMyLeases(NodeLeasesContract):
        @pytest.fixture
        def open_node(self, my_database):
            opened = []
            def open_node(node, clock=utc_now):
                opened.append(MyStore(my_database, node=node, clock=clock))
                return opened[-1]
            yield open_node
            for s in opened:
                s.close()

h3core's own suite runs it against `PostgresEventStore` and the fake, `MemoryNodesEventStore`.
The lease length the expiry tests wait out is `LEASE_S` (a twentieth of a second).

`TurnsContract` is the turns' contract (`WithTurns`), over the same `open_node` fixture: a class
can subclass both. Needs pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from h3core.adapters.store.base import EventStore, utc_now
from h3core.adapters.store.nodes import LeaseLost, NodeInfo, NodeLeases, NodeTaken, Turn, WithNodeLeases, WithTurns
from h3core.domain.events import (
    Admitted,
    AttemptFailed,
    CancelRequested,
    Checkpoint,
    Checkpointed,
    CheckpointRejected,
    Detached,
    Done,
    Progress,
    Restored,
    Resumed,
    Running,
)
from h3core.domain.retry import RetryPolicy
from h3core.testing.factories import artifact, submitted

__all__ = ["LEASE_S", "NodeLeasesContract", "TurnsContract"]

LEASE_S = 0.05
WAIT_S = 30.0  # a bound on a loaded machine for a lease to age past LEASE_S, not a measure
LONG_S = 30.0  # a lease length no test outlasts


def _info(node: str, host: str = "h", pid: int = 1) -> NodeInfo:
    return NodeInfo(node_id=node, host=host, pid=pid, role="runner", slots=2, executor="fake", modes=["t2va"])


def _until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (out := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WAIT_S:g}s for {what}")
        time.sleep(0.01)
    return out


def _run(store, job: str, attempt: int = 1, ref: str | None = None) -> None:
    """Submit and queue `job` (unless it is) and start `attempt` on `store`'s node: its lease.
    `ref`: the executor's work for it, as a resumable executor names it."""
    if store.get(job) is None:
        retry = RetryPolicy(max_attempts=3, retry_on=("interrupted",))
        store.append(job, [submitted(retry=retry, steps=4), Admitted()])
    store.append(job, [Running(attempt=attempt, executor="fake", executor_ref=ref)])


def _checkpoint(attempt: int, step: int) -> Checkpoint:
    """A checkpoint record of `attempt` at `step` of 4 (no file behind it)."""
    return Checkpoint(attempt=attempt, step=step, total=4, path=f"j/checkpoint-{attempt}-{step}.ckpt", bytes=10, sha256="a" * 64)


def _gone_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


class NodeLeasesContract:
    """What every store shared by runner nodes must do (the contract in `h3core.adapters.store.nodes`)."""

    @pytest.fixture
    def open_node(self):
        raise NotImplementedError("override the `open_node` fixture: (node, clock=utc_now) -> a store on one shared backend")

    def test_its_leases_are_node_leases_of_the_node_it_was_opened_for(self, open_node):
        a, api = open_node("a"), open_node(None)
        assert isinstance(a, EventStore) and isinstance(a, WithNodeLeases) and isinstance(a.leases, NodeLeases)
        assert a.leases.node_id == "a" and api.leases.node_id is None
        assert a.leases.nodes() == [] and a.leases.lease_holders() == {} and a.leases.expired(0) == []

    def test_nodes_join_beat_and_leave_and_every_store_sees_them(self, open_node):
        a, b, api = open_node("a"), open_node("b"), open_node(None)
        b.leases.join(_info("b", pid=2), LONG_S)
        a.leases.join(_info("a"), LONG_S)
        a.leases.beat(_info("a").model_copy(update={"slots": 5}))  # a beat says what the node is now
        rows = api.leases.nodes()
        assert [(n.node_id, n.slots, n.lease_s, n.leases, n.alive()) for n in rows] == [
            ("a", 5, LONG_S, 0, True),
            ("b", 2, LONG_S, 0, True),
        ]
        a.leases.leave()
        (left, _) = api.leases.nodes()
        assert left.left_at is not None and not left.alive()

    def test_a_drain_is_set_by_any_store_kept_through_restarts_and_cleared(self, open_node):
        a, b, api = open_node("a"), open_node("b"), open_node(None)
        a.leases.join(_info("a"), LONG_S)
        b.leases.join(_info("b", pid=2), LONG_S)
        assert a.leases.draining() is None and all(n.drain is None for n in api.leases.nodes())
        assert api.leases.set_draining("a", True, by="ops") is True
        first = a.leases.draining()
        assert first is not None and first.by == "ops" and b.leases.draining() is None
        assert api.leases.set_draining("a", True, by="someone else") is True  # the first mark is kept
        assert a.leases.draining() == first
        assert {n.node_id: n.drain for n in b.leases.nodes()} == {"a": first, "b": None}
        a.leases.leave()
        again = open_node("a")  # the node's next process joins: still drained
        again.leases.join(_info("a", pid=3), LONG_S)
        assert again.leases.draining() == first
        assert b.leases.set_draining("a", False) is True  # any node's store may clear it
        assert again.leases.draining() is None and all(n.drain is None for n in api.leases.nodes())
        assert api.leases.set_draining("a", False) is True  # clearing twice is no error
        assert api.leases.set_draining("nobody", True, by="ops") is False
        assert [n.node_id for n in api.leases.nodes()] == ["a", "b"]  # an unknown node is not made up

    def test_a_second_live_process_under_a_nodes_id_is_refused_and_a_gone_one_is_not(self, open_node):
        live, second = open_node("gpu"), open_node("gpu")
        live.leases.join(_info("gpu", host="elsewhere", pid=7), LONG_S)
        with pytest.raises(NodeTaken):
            second.leases.join(_info("gpu", pid=os.getpid()), LONG_S)
        live.leases.join(_info("gpu", host="elsewhere", pid=7), LONG_S)  # the same process joins again
        live.leases.leave()  # a graceful stop frees the id
        second.leases.join(_info("gpu", pid=os.getpid()), LONG_S)
        restarted = open_node("box")  # a process of this host that is gone does not hold its id
        open_node("box").leases.join(_info("box", host="here", pid=_gone_pid()), LONG_S)
        restarted.leases.join(_info("box", host="here", pid=os.getpid()), LONG_S)

    def test_a_running_attempt_is_leased_to_its_node_and_its_beat_renews_it(self, open_node):
        a, b = open_node("a"), open_node("b")
        a.leases.join(_info("a"), LONG_S)
        _run(a, "j")
        _run(b, "k")
        assert a.leases.lease_holders() == {"j": "a", "k": "b"}
        assert a.leases.beat(_info("a")) == {"j"} and b.leases.beat(_info("b")) == {"k"}
        assert [(n.node_id, n.leases) for n in b.leases.nodes()] == [("a", 1)]  # b never joined: no row

    # -- fenced writes -------------------------------------------------------------------

    def test_a_node_cannot_write_onto_an_attempt_another_node_leases(self, open_node):
        a, b = open_node("a"), open_node("b")
        _run(a, "j")
        a.append("j", [Progress(step=1, total=4)])  # the holder's writes pass
        with pytest.raises(LeaseLost):
            b.append("j", [Progress(step=2, total=4)])
        with pytest.raises(LeaseLost):
            b.append("j", [AttemptFailed(kind="interrupted", message="not b's to end", attempt=1)])
        (refused,) = b.append_batch([("j", [Progress(step=2, total=4)], None)])
        assert isinstance(refused, LeaseLost)  # in a group commit, returned in place
        assert [e.type for e in a.events("j")][-1] == "progress" and a.leases.lease_holders() == {"j": "a"}

    def test_a_cancel_request_comes_from_any_node_and_a_store_for_no_node_is_not_fenced(self, open_node):
        a, b, api = open_node("a"), open_node("b"), open_node(None)
        _run(a, "j")
        b.append("j", [CancelRequested(reason="asked on node b")])
        api.append("j", [Progress(step=1, total=4)])
        assert [e.type for e in a.events("j")][-2:] == ["cancel_requested", "progress"]
        assert a.leases.lease_holders() == {"j": "a"}  # neither moved the lease

    def test_only_the_process_that_started_or_resumed_an_attempt_reports_onto_it(self, open_node):
        """A replacement process joined under node a's id while the old one was frozen, ended its
        attempt and started the next: the old process's reports must not land on the new attempt."""
        old, new = open_node("a"), open_node("a")
        _run(old, "j")
        old.append("j", [Progress(step=1, total=4), Checkpointed(checkpoint=_checkpoint(1, 1))])
        new.append("j", [AttemptFailed(kind="interrupted", message="a started again", attempt=1)])  # its recovery
        _run(new, "j", attempt=2)
        kept = _checkpoint(1, 1)  # what attempt 2 may continue from
        for report in (
            [Progress(step=2, total=4)],
            [Restored(attempt=2, checkpoint=kept)],
            [CheckpointRejected(attempt=2, checkpoint=kept, reason="not the old process's to say")],
        ):
            with pytest.raises(LeaseLost, match="not started or resumed by this process"):
                old.append("j", report)
        (refused,) = old.append_batch([("j", [Progress(step=2, total=4)], None)])
        assert isinstance(refused, LeaseLost)  # in a group commit, returned in place
        new.append("j", [Restored(attempt=2, checkpoint=kept)])  # the process that started it reports
        new.append("j", [Progress(step=2, total=4), Checkpointed(checkpoint=_checkpoint(2, 2))])
        old.append("j", [CancelRequested(reason="anyone may ask")])
        assert [e.type for e in new.events("j")][-4:] == ["restored", "progress", "checkpointed", "cancel_requested"]
        assert new.leases.lease_holders() == {"j": "a"}

    def test_a_process_that_resumed_an_attempt_reports_onto_it_and_the_one_that_left_it_does_not(self, open_node):
        left, resumed = open_node("a"), open_node("a")
        _run(left, "j", ref="work-1")
        left.append("j", [Detached(attempt=1, executor_ref="work-1")])
        resumed.append("j", [Resumed(attempt=1, executor_ref="work-1", after_s=1.0)])  # after a restart
        resumed.append("j", [Progress(step=1, total=4)])
        with pytest.raises(LeaseLost):
            left.append("j", [Progress(step=2, total=4)])
        assert [e.type for e in resumed.events("j")][-2:] == ["resumed", "progress"]

    # -- leases end with their attempt ---------------------------------------------------

    def test_a_lease_ends_with_its_attempt_and_the_next_attempt_takes_its_own(self, open_node):
        a, b = open_node("a"), open_node("b")
        _run(a, "j")
        _run(a, "k")
        a.append("j", [AttemptFailed(kind="interrupted", message="retried", attempt=1)])
        assert a.get("j").status == "queued" and a.leases.lease_holders() == {"k": "a"}
        a.append("k", [Done(artifact=artifact("k/attempt-1.mp4"))])
        assert a.leases.lease_holders() == {}
        _run(b, "j", attempt=2)
        assert a.leases.lease_holders() == {"j": "b"}
        b.append("j", [Progress(step=1, total=4)])  # the new holder writes; the old one cannot
        with pytest.raises(LeaseLost):
            a.append("j", [Progress(step=2, total=4)])

    # -- takeover is optimistic ----------------------------------------------------------

    def test_an_expired_lease_is_seen_by_other_nodes_only_and_one_of_two_takers_wins(self, open_node):
        a, b, c = open_node("a"), open_node("b"), open_node("c")
        _run(a, "j")
        (lease,) = _until(lambda: b.leases.expired(LEASE_S), "a's lease to age past LEASE_S")
        assert (lease.job_id, lease.attempt, lease.node_id) == ("j", 1, "a") and lease.age_s > LEASE_S
        assert a.leases.expired(LEASE_S) == []  # a node's own leases are not its to take
        assert b.leases.expired(LONG_S) == []
        won: list[bool] = []
        start = threading.Barrier(2)

        def take(store) -> None:
            start.wait()
            won.append(store.leases.take_lease(lease, LEASE_S))

        threads = [threading.Thread(target=take, args=(s,)) for s in (b, c)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(won) == [False, True], "exactly one of two takers wins"
        winner, loser = (b, c) if a.leases.lease_holders() == {"j": "b"} else (c, b)
        assert a.leases.lease_holders() == {"j": winner.leases.node_id}
        assert not loser.leases.take_lease(lease, LEASE_S)  # the lease it saw is gone
        assert a.leases.beat(_info("a")) == set()  # the old holder comes back: it renews nothing
        with pytest.raises(LeaseLost):
            a.append("j", [Progress(step=1, total=4)])
        winner.append("j", [AttemptFailed(kind="interrupted", message="a stopped beating", attempt=1)])
        assert a.leases.lease_holders() == {}

    def test_a_holder_that_beats_again_keeps_its_lease(self, open_node):
        a, b = open_node("a"), open_node("b")
        _run(a, "j")
        # A lease of a second: the beat and the take below are far closer together than that.
        (lease,) = _until(lambda: b.leases.expired(1.0), "a's lease to age past a second")
        assert a.leases.beat(_info("a")) == {"j"}  # a comes back before b takes over
        assert not b.leases.take_lease(lease, 1.0)  # renewed: no longer expired
        assert a.leases.lease_holders() == {"j": "a"}
        a.append("j", [Progress(step=1, total=4)])

    # -- ages are the server's -----------------------------------------------------------

    def test_beats_and_leases_age_by_the_stores_clock_not_the_nodes(self, open_node):
        skew = timedelta(hours=1)
        behind = open_node("behind", lambda: utc_now() - skew)
        ahead = open_node("ahead", lambda: utc_now() + skew)
        watcher = open_node("watcher")
        for node in (behind, ahead):
            node.leases.join(_info(node.leases.node_id), LONG_S)
            _run(node, node.leases.node_id)
        assert {e.at > utc_now() for e in ahead.events("ahead")} == {True}  # the nodes' clocks are skewed
        assert watcher.leases.expired(LONG_S) == []  # neither expired early (behind) ...
        assert all(0 <= n.beat_age_s < LONG_S and n.alive() for n in watcher.leases.nodes())
        expired = _until(lambda: len(e := watcher.leases.expired(LEASE_S)) == 2 and e, "both leases to age")
        assert {x.node_id for x in expired} == {"behind", "ahead"}  # ... nor late (ahead)
        assert all(LEASE_S < x.age_s < LONG_S for x in expired)


class TurnsContract:
    """What every store with turns must do (`WithTurns`; the contract in `h3core.adapters.store.nodes`)."""

    @pytest.fixture
    def open_node(self):
        raise NotImplementedError("override the `open_node` fixture: (node, clock=utc_now) -> a store on one shared backend")

    def test_a_turn_has_one_holder_until_it_is_released(self, open_node):
        a, b = open_node("a"), open_node("b")
        assert isinstance(a, WithTurns)
        held = a.turns.take_turn("webhooks", LONG_S)
        assert isinstance(held, Turn) and held.held() and held.renew() and held.held()
        assert b.turns.take_turn("webhooks", LONG_S) is None  # one holder per name
        other = b.turns.take_turn("another", LONG_S)
        assert other is not None  # names are apart
        other.release()
        held.release()
        assert not held.held()
        taken = b.turns.take_turn("webhooks", LONG_S)  # a release frees it at once
        assert taken is not None and a.turns.take_turn("webhooks", LONG_S) is None
        held.release()  # the old holder's second release frees nothing of the new holder's
        assert a.turns.take_turn("webhooks", LONG_S) is None and taken.renew()
        taken.release()

    def test_a_turn_not_renewed_within_its_lease_passes_on_and_its_old_holder_knows(self, open_node):
        a, b, c = open_node("a"), open_node("b"), open_node("c")
        old = a.turns.take_turn("webhooks", LEASE_S)
        assert old is not None
        new = _until(lambda: b.turns.take_turn("webhooks", LONG_S), "a's turn to pass its lease")
        assert not old.held()  # by its own clock: it took the turn more than a lease ago
        assert not old.renew() and not old.held()
        old.release()  # frees nothing of the new holder's
        assert c.turns.take_turn("webhooks", LEASE_S) is None and new.renew() and new.held()

    def test_a_holder_that_comes_back_after_its_lease_renews_nothing_even_with_no_other_holder(self, open_node):
        a = open_node("a")
        old = a.turns.take_turn("webhooks", LEASE_S)
        assert old is not None
        time.sleep(LEASE_S * 2)
        assert not old.held() and not old.renew()
        again = a.turns.take_turn("webhooks", LEASE_S)  # free: a new hold, under a new token
        assert again is not None and again.held()

    def test_a_holder_that_renews_keeps_its_turn(self, open_node):
        a, b = open_node("a"), open_node("b")
        lease = 0.5
        for _ in range(5):  # a machine that stalls past the lease between the steps proves nothing: again
            held = a.turns.take_turn("webhooks", lease)
            assert held is not None
            time.sleep(lease / 2)
            renewed = time.monotonic()
            assert held.renew()
            time.sleep(lease * 0.7)  # the take is more than a lease old now, the renewal is not
            taken = b.turns.take_turn("webhooks", lease)
            if time.monotonic() - renewed < lease:
                assert taken is None, "a turn renewed within its lease was taken"
                assert held.held() and held.renew()
                held.release()
                return
            held.release()
            if taken is not None:
                taken.release()
        pytest.skip("the machine stalled past the lease every time: nothing to conclude")

    def test_of_two_takers_of_a_free_turn_exactly_one_wins(self, open_node):
        b, c = open_node("b"), open_node("c")
        won: list[Turn | None] = []
        start = threading.Barrier(2)

        def take(store) -> None:
            start.wait()
            won.append(store.turns.take_turn("webhooks", LONG_S))

        threads = [threading.Thread(target=take, args=(s,)) for s in (b, c)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(w is not None for w in won) == [False, True], "exactly one of two takers wins"

    def test_turns_age_by_the_stores_clock_not_the_holders(self, open_node):
        skew = timedelta(hours=1)
        ahead = open_node("ahead", lambda: utc_now() + skew)
        behind = open_node("behind", lambda: utc_now() - skew)
        watcher = open_node("watcher")
        assert behind.turns.take_turn("long", LONG_S) is not None
        assert watcher.turns.take_turn("long", LONG_S) is None  # not expired early
        assert ahead.turns.take_turn("short", LEASE_S) is not None
        _until(lambda: watcher.turns.take_turn("short", LONG_S), "the short turn to pass its lease")  # nor late
