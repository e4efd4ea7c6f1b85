"""Admission across the runner nodes of a shared store (`FleetAdmission`), from the nodes' statements
as the store returns them: live nodes judge, this node's executor first; with none alive, the last
statements admit jobs to wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest

from h3core.adapters.store.nodes import NodeInfo, NodeRow
from h3core.domain.capabilities import Capabilities, FrameWindow
from h3core.domain.capacity import CapacityProfile, MeasuredPoint
from h3core.domain.request import GenerationRequest
from h3core.runtime.admission import LocalAdmission
from h3core.runtime.fleet import FleetAdmission
from tests.waiting import until

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def caps(max_seconds: float) -> Capabilities:
    return Capabilities(executor="fake", window=FrameWindow(max_seconds=max_seconds, source="fake limits"))


def row(
    node: str, max_seconds: float | None, *, age_s: float = 1.0, beat: int = 0, profile: CapacityProfile | None = None
) -> NodeRow:
    """A node as `nodes()` returns it; `max_seconds` None: a node of an older version (no statement);
    `profile`: the rules it states are its capabilities under that profile (else it states none, as
    a node of the version before profiles were stated)."""
    rules = LocalAdmission(lambda: caps(max_seconds), profile=profile).current().statement() if profile is not None else None
    return NodeRow(
        node_id=node,
        host="h",
        pid=1,
        role="runner",
        slots=1,
        executor="fake",
        modes=["t2va"],
        capabilities=caps(max_seconds) if max_seconds is not None else None,
        rules=rules,
        started_at=T0,
        beat_at=T0 + timedelta(seconds=beat),
        beat_age_s=age_s,
        left_at=None,
        lease_s=30.0,
        leases=0,
    )


class Store:
    def __init__(self, node_id: str | None, rows: list[NodeRow]) -> None:
        self.node_id = node_id
        self.rows = rows
        self.reads = 0

    def nodes(self) -> list[NodeRow]:
        self.reads += 1
        return self.rows


def req(frames: int) -> GenerationRequest:
    return GenerationRequest(prompt="p", width=448, height=256, frames=frames)


def test_a_request_is_admitted_if_any_live_node_can_run_it_else_refused_naming_the_closest():
    store = Store(None, [row("small", 5.0), row("big", 20.0), row("dead", 60.0, age_s=99.0), row("old", None)])
    fleet = FleetAdmission(store)
    assert fleet.decide(req(240)).admitted  # before any read: no node known, nothing refused blind
    fleet.refresh()
    assert fleet.decide(req(240)).admitted and fleet.decide(req(240)).frames == 243
    refused = fleet.decide(req(1000))  # the dead node's 60 s do not count
    assert not refused.admitted and refused.reason == "model_window" and refused.ceiling.max_frames == 464
    assert refused.detail.startswith("no node of 2 runs it; the closest, node big: 1000 frames"), refused.detail
    t2va = next(r for r in fleet.ceilings() if (r.shape.mode, r.shape.width, r.shape.height) == ("t2va", 448, 256))
    assert t2va.max_frames == 464 and t2va.why.startswith("node big: ")
    assert fleet.source().runnable_modes == ("t2va", "fl2va", "ref2va")


def small_box() -> CapacityProfile:
    """A profile measured at one short run: requests past its tokens are refused (unverified)."""
    ran = MeasuredPoint(width=448, height=256, frames=48, outcome="ran")
    return CapacityProfile(
        name="small-box", hardware="h", attention="a", api_max_frames=1200, resolutions=((448, 256),), points=(ran,)
    )


def test_each_node_is_judged_by_the_profile_it_states_and_an_older_one_by_this_nodes():
    store = Store(None, [row("small", 20.0, profile=small_box())])
    fleet = FleetAdmission(store)  # an API node with no profile of its own
    fleet.refresh()
    assert fleet.decide(req(48)).admitted
    refused = fleet.decide(req(240))  # in the node's window, past its profile's budget: it would never claim it
    assert not refused.admitted and refused.reason == "unverified" and "profile small-box" in refused.detail, refused
    t2va = next(r for r in fleet.ceilings() if (r.shape.mode, r.shape.width, r.shape.height) == ("t2va", 448, 256))
    assert t2va.max_frames == 56 and t2va.reason == "unverified"
    # A node of the version before: its capabilities alone, judged with this node's profiles.
    store.rows = [row("old", 20.0)]
    for mine, admitted in ((None, True), (small_box(), False)):
        fleet = FleetAdmission(store, profile=mine)
        fleet.refresh()
        assert fleet.decide(req(240)).admitted is admitted
    # Its row, as it stored it, still reads.
    older = NodeInfo.model_validate_json(
        '{"node_id": "old", "host": "h", "pid": 1, "role": "runner", "slots": 1, "executor": "fake", "modes": ["t2va"]}'
    )
    assert older.rules is None and older.capabilities is None


def test_this_nodes_executor_is_judged_fresh_and_first():
    mine = caps(5.0)
    store = Store("small", [row("small", 60.0), row("big", 20.0)])  # its own row is an older statement
    fleet = FleetAdmission(store, local=LocalAdmission(lambda: mine))
    fleet.refresh()
    assert [n for n, _ in fleet.nodes()] == ["small", "big"] and fleet.current().caps.window.max_seconds == 5.0
    assert fleet.decide(req(240)).admitted  # the big node can
    assert "the closest, node big" in fleet.decide(req(1000)).detail  # not the row's 60 s: the executor's 5 s
    mine = caps(50.0)  # what the executor says now, without a read of the store
    assert fleet.decide(req(1000)).admitted and store.reads == 1


def test_with_no_live_node_the_last_statements_admit_jobs_to_wait():
    store = Store(None, [row("a", 5.0, age_s=99.0, beat=1), row("b", 20.0, age_s=99.0, beat=2)])
    fleet = FleetAdmission(store)
    fleet.refresh()
    assert [n for n, _ in fleet.nodes()] == ["b", "a"]  # the latest statement first
    assert fleet.decide(req(240)).admitted  # b could run it: it waits queued for b (or a node like it)
    assert not fleet.decide(req(1000)).admitted
    source = fleet.source()
    assert source.served_modes == ("t2va", "fl2va", "ref2va") and source.runnable_modes == ()
    assert source.waiting_reason("t2va") == "fake not ready for t2va: node b is not alive"
    store.rows = [*store.rows, row("c", 5.0)]  # a node came up: only live nodes judge
    fleet.refresh()
    assert not fleet.decide(req(240)).admitted and fleet.source().runnable_modes == ("t2va", "fl2va", "ref2va")


@pytest.mark.anyio
async def test_a_failed_read_of_the_nodes_keeps_the_last_statements_and_the_watch_goes_on():
    store = Store(None, [row("big", 20.0)])
    fleet = FleetAdmission(store, interval_s=0.01)
    reads = []

    def away() -> list[NodeRow]:
        reads.append(1)
        if len(reads) > 1:
            raise ConnectionError("the database went away")
        return store.rows

    store.nodes = away
    async with anyio.create_task_group() as tg:
        await tg.start(fleet.watch)
        assert fleet.decide(req(240)).admitted  # the first read
        await until(lambda: len(reads) >= 5, 10, "reads that fail, the watch living on")
        assert fleet.decide(req(240)).admitted and not fleet.decide(req(1000)).admitted  # big's statement kept
        tg.cancel_scope.cancel()
