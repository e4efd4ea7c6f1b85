"""Several runner nodes on one PostgreSQL store: claims never hand one job to two nodes, a dead
node's attempts are taken over and retried, a node that lost its lease cannot write onto the
attempt (and stops it, writing nothing more for it), and the heartbeat goes on while the executor
blocks the event loop."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.from_thread import start_blocking_portal

from h3core import FakeExecutor, FakeLimits, FakePlan, LocalArtifactStore, RetryPolicy, Runner, RunnerConfig
from h3core.adapters.store.nodes import Expired, LeaseLost, WithNodeLeases
from h3core.adapters.store.postgres import PostgresEventStore
from h3core.domain.events import Admitted, AttemptFailed, CancelRequested, Progress, Running
from h3core.executors.base import Heartbeat as Beat
from h3core.executors.base import Progress as Step
from tests.factories import request, submitted
from tests.waiting import poll, until

pytestmark = pytest.mark.anyio


def config(**kw) -> RunnerConfig:
    base = {"stall_timeout_s": 30.0, "cancel_grace_s": 2.0, "poll_interval_s": 0.05, "lease_s": 1.0}
    return RunnerConfig(retry=RetryPolicy(max_attempts=2, retry_on=("interrupted",)), **{**base, **kw})


@asynccontextmanager
async def nodes(
    url: str, tmp_path, names: list[str], plan: FakePlan, limits: dict[str, FakeLimits] | None = None, plans=None, **kw
) -> AsyncIterator[list[Runner]]:
    """Runner nodes on one store (each its own store object, pool and node id), one artifact folder;
    `limits`: what a node's executor can run, by node (default: anything); `plans`: the fake's plan by attempt."""
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    stores = [PostgresEventStore(url, node=name) for name in names]
    runners = [
        Runner(
            s,
            FakeExecutor(artifacts, default=plan, plans=plans, limits=(limits or {}).get(name)),
            config(**kw),
            artifacts=artifacts,
        )
        for name, s in zip(names, stores, strict=True)
    ]
    try:
        async with anyio.create_task_group() as tg:
            for r in runners:
                await tg.start(r.run)
            yield runners
            tg.cancel_scope.cancel()
    finally:
        for s in stores:
            s.close()


def runs(store, job_id) -> list[tuple[int, str]]:
    """(attempt, node) of each `running` event of the job."""
    return [(e.body.attempt, e.body.info.get("node")) for e in store.events(job_id) if isinstance(e.body, Running)]


def writers(url: str, job_id: str) -> list[tuple[int, str, str | None]]:
    """(seq, type, node that wrote it) of each of the job's events, as the store recorded them."""
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("SELECT seq, type, node FROM events WHERE job_id = %s ORDER BY seq", (job_id,)).fetchall()


async def test_two_nodes_share_one_queue_and_no_job_is_claimed_twice(pg_url, tmp_path):
    async with nodes(pg_url, tmp_path, ["a", "b"], FakePlan(step_seconds=0.01), slots=2) as (a, b):
        jobs = [await (a if i % 2 else b).submit(request(steps=2)) for i in range(24)]
        await until(lambda: all(a.store.get(j.job_id).terminal for j in jobs), 60, "every job to end")
        assert {a.store.get(j.job_id).status for j in jobs} == {"done"}
        for j in jobs:
            (attempt, node), *more = runs(a.store, j.job_id)
            assert not more and attempt == 1 and node in ("a", "b"), runs(a.store, j.job_id)
        assert {n.node_id: (n.slots, n.executor, n.alive()) for n in a.store.leases.nodes()} == {
            "a": (2, "fake", True),
            "b": (2, "fake", True),
        }


def queue(store, job_id: str, tokens: int | None = None, **kw) -> None:
    """A job admitted elsewhere (another node, an API node): submitted and queued in the store."""
    store.append(job_id, [submitted(**kw), Admitted(tokens=tokens)])


async def test_a_job_only_a_bigger_node_can_run_waits_for_it_and_is_never_failed_by_a_smaller_one(pg_url, tmp_path):
    store = PostgresEventStore(pg_url)
    queue(store, "long", frames=240)  # 10 s: outside the small node's 5-second window
    queue(store, "short", frames=48)  # behind it in the queue
    limits = {"small": FakeLimits(max_seconds=5.0), "big": FakeLimits(max_seconds=20.0)}
    async with nodes(pg_url, tmp_path, ["small"], FakePlan(), limits) as (small,):
        await until(lambda: store.get("short").status == "done", 30, "the small node to run the job it can")
        assert store.get("long").status == "queued"  # passed over, not failed `invalid`: another node may run it
    async with nodes(pg_url, tmp_path, ["small", "big"], FakePlan(), limits):
        await until(lambda: store.get("long").terminal, 30, "the big node to run the long job")
    assert store.get("long").status == "done" and runs(store, "long") == [(1, "big")]
    assert runs(store, "short") == [(1, "small")]
    store.close()


async def test_a_job_the_store_lets_through_is_judged_once_and_again_when_the_nodes_capabilities_change(pg_url, tmp_path):
    store = PostgresEventStore(pg_url)
    # No token count stored (admitted without one): the store's pre-filter cannot drop it, the node's judgement does.
    queue(store, "wide", width=832, height=480, frames=240)
    queue(store, "narrow", tokens=10, frames=48)
    queue(store, "outside", tokens=999_999, frames=48)  # over the budget by its stored count: dropped in the store
    async with nodes(pg_url, tmp_path, ["small"], FakePlan(), {"small": FakeLimits(budget_tokens=5_000)}) as (small,):
        await until(lambda: store.get("narrow").status == "done", 30, "the node to run the job it can")
        assert small._claimer.not_here == {"wide"}  # judged here; "outside" never left the store
        assert store.get("wide").status == store.get("outside").status == "queued"
        small.executor.limits = FakeLimits(budget_tokens=10**7)  # it can run more now: every queued job is judged again
        await until(lambda: store.get("wide").terminal and store.get("outside").terminal, 30, "the node to run them now")
        assert small._claimer.not_here == set()
    assert runs(store, "wide") == runs(store, "outside") == [(1, "small")]
    store.close()


async def test_a_dead_nodes_attempt_is_ended_by_another_node_naming_it_and_retried(pg_url, tmp_path):
    dead = PostgresEventStore(pg_url, node="dead")
    dead.append("j", [submitted(retry=RetryPolicy(max_attempts=2, retry_on=("interrupted",)), steps=2), Admitted()])
    dead.append("j", [Running(attempt=1, executor="fake", info={"node": "dead"})])  # takes the lease; never beats
    async with nodes(pg_url, tmp_path, ["b"], FakePlan()) as (b,):
        await until(lambda: b.store.get("j").status == "done", 30, "the job to be retried and done")
    failed = [e.body for e in dead.events("j") if isinstance(e.body, AttemptFailed)]
    assert len(failed) == 1 and failed[0].kind == "interrupted"
    assert "node dead stopped heartbeating" in failed[0].message and "ended by node b" in failed[0].message
    assert runs(dead, "j") == [(1, "dead"), (2, "b")]
    dead.close()


def test_a_node_that_lost_its_lease_cannot_write_onto_the_attempt(pg_url):
    a, b = PostgresEventStore(pg_url, node="a"), PostgresEventStore(pg_url, node="b")
    a.append("j", [submitted(steps=4), Admitted()])
    a.append("j", [Running(attempt=1, executor="x")])
    a.append("j", [Progress(step=1, total=4)])  # a holds the lease: its writes pass
    with pytest.raises(LeaseLost):
        b.append("j", [Progress(step=2, total=4)])
    (lease,) = poll(lambda: b.leases.expired(0.05), 10, "a's lease to age past 0.05 s")
    assert (lease.job_id, lease.node_id) == ("j", "a") and lease.age_s >= 0.05
    assert b.leases.take_lease(lease, 0.05) and not a.leases.take_lease(lease, 0.05)  # one wins
    state = b.append("j", [AttemptFailed(kind="interrupted", message="a stopped beating", attempt=1)])[0]
    state = b.append("j", [Running(attempt=2, executor="x")], expected_seq=state.last_seq)[0]
    assert a.leases.beat(a_info()) == set()  # a comes back: it renews nothing
    with pytest.raises(LeaseLost, match="leased to node b"):
        a.append("j", [Progress(step=2, total=4)])
    with pytest.raises(LeaseLost):
        a.append("j", [AttemptFailed(kind="executor_error", message="late", attempt=1)], expected_seq=state.last_seq)
    a.append("j", [CancelRequested(reason="anyone may ask")])  # a cancel comes from any node
    assert [e.type for e in a.events("j")][-3:] == ["attempt_failed", "running", "cancel_requested"]
    a.close()
    b.close()


def a_info():
    from h3core.adapters.store.nodes import NodeInfo

    return NodeInfo(node_id="a", host="h", pid=1, role="runner", slots=1, executor="x", modes=["t2va"])


class BlockingExecutor(FakeExecutor):
    """A step that blocks the event loop (a GPU call made without a worker thread)."""

    block_s = 2.5

    async def run(self, job):
        yield Beat("loaded")
        time.sleep(self.block_s)  # noqa: ASYNC251 - blocking on purpose
        async for update in super().run(job):
            if not isinstance(update, Beat | Step):
                yield update


def test_the_heartbeat_goes_on_while_the_executor_blocks_the_event_loop(pg_url, tmp_path):
    store = PostgresEventStore(pg_url, node="busy")
    watcher = PostgresEventStore(pg_url, node="watcher")
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    runner = Runner(store, BlockingExecutor(artifacts), config(lease_s=1.0), artifacts=artifacts)
    with start_blocking_portal("asyncio") as portal:
        future, _ = portal.start_task(runner.run)
        job = portal.call(lambda: runner.submit(request(steps=1)))
        poll(lambda: store.get(job.job_id).status == "running", 30, "the job to start")
        beats = runner.heartbeat.beats
        deadline = time.monotonic() + BlockingExecutor.block_s
        while time.monotonic() < deadline and store.get(job.job_id).status == "running":
            assert watcher.leases.expired(1.0) == [], "the lease expired while the node was alive"
            time.sleep(0.1)
        assert runner.heartbeat.beats > beats, "no beat while the event loop was blocked"
        poll(lambda: store.get(job.job_id).status == "done", 30, "the job to finish")
        future.cancel()
    assert isinstance(store, WithNodeLeases) and [e.type for e in store.events(job.job_id)].count("attempt_failed") == 0
    store.close()
    watcher.close()


async def test_a_second_process_under_a_live_nodes_id_is_refused(pg_url, tmp_path):
    from h3core.adapters.store.nodes import NodeTaken

    live = PostgresEventStore(pg_url, node="gpu")
    live.leases.join(a_info().model_copy(update={"node_id": "gpu", "host": "elsewhere", "pid": 7}), 30)
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    store = PostgresEventStore(pg_url, node="gpu")
    runner = Runner(store, FakeExecutor(artifacts), config(), artifacts=artifacts)
    with pytest.raises(NodeTaken, match="node gpu is alive: process 7 on elsewhere"):
        await runner.run()
    live.leases.leave()  # a graceful stop: the id is free again
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        tg.cancel_scope.cancel()
    store.close()
    live.close()


async def test_ending_a_dead_attempt_reads_again_after_a_conflict_and_leaves_another_nodes_claim(pg_url):
    """What a restarted node or a taker meets: a cancel request stored since it read the job (it
    ends the attempt as cancelled), or the job claimed by a live node since (it writes nothing)."""
    from h3core.adapters.store.nodes import Expired
    from h3core.runtime._journal import Journal
    from h3core.runtime._recovery import end_dead_attempt
    from h3core.runtime.bus import EventBus

    dead, me, b = (PostgresEventStore(pg_url, node=n) for n in ("dead", "me", "b"))
    for job in ("j", "k"):
        dead.append(job, [submitted(), Admitted()])
        dead.append(job, [Running(attempt=1, executor="x")])
    stale_j, stale_k = dead.get("j"), dead.get("k")
    me.append("j", [CancelRequested(reason="from an API node")])  # after the taker read the job
    for lease in poll(lambda: (e := me.leases.expired(0.05)) and len(e) == 2 and e, 10, "both leases to age"):
        holder = me if lease.job_id == "j" else b
        assert holder.leases.take_lease(Expired(**{**lease.model_dump(), "node_id": "dead"}), 0.05)
    b.append("k", [AttemptFailed(kind="interrupted", message="b took it over", attempt=1)])
    b.append("k", [Running(attempt=2, executor="x")])  # and runs it again, live
    journal = Journal(me, EventBus(), retry_s=5)
    async with anyio.create_task_group() as tg:
        await tg.start(journal.writer.run)
        ended = await end_dead_attempt(journal, None, stale_j, "dead stopped")
        assert ended is not None and ended.status == "cancelled"
        assert await end_dead_attempt(journal, None, stale_k, "dead stopped") is None
        journal.writer.close()
    assert [e.type for e in me.events("k")][-2:] == ["attempt_failed", "running"]
    for s in (dead, me, b):
        s.close()


def test_progress_onto_an_attempt_this_process_did_not_start_is_refused_even_under_its_node_id(pg_url):
    """A replacement process joined under node a's id while the old one was frozen, ended its attempt
    and started the next: the old process's progress must not land on the new attempt."""
    old, new = PostgresEventStore(pg_url, node="a"), PostgresEventStore(pg_url, node="a")
    old.append("j", [submitted(steps=4), Admitted()])
    old.append("j", [Running(attempt=1, executor="x")])
    old.append("j", [Progress(step=1, total=4)])
    new.append("j", [AttemptFailed(kind="interrupted", message="a started again", attempt=1)])  # its recovery
    new.append("j", [Running(attempt=2, executor="x")])
    with pytest.raises(LeaseLost, match="attempt 2 was not started or resumed by this process of node a"):
        old.append("j", [Progress(step=3, total=4)])
    new.append("j", [Progress(step=1, total=4)])  # the process that started it reports
    old.append("j", [CancelRequested(reason="anyone may ask")])
    assert [e.type for e in new.events("j")][-3:] == ["running", "progress", "cancel_requested"]
    old.close()
    new.close()


def test_each_event_records_the_node_that_wrote_it(pg_url, pg_server):
    a, plain = PostgresEventStore(pg_url, node="a"), PostgresEventStore(pg_url)
    a.append("j", [submitted(), Admitted()])
    a.append("j", [Running(attempt=1, executor="x")])
    plain.append("j", [CancelRequested(reason="from an API process opened without a node id")])
    assert writers(pg_url, "j") == [
        (1, "submitted", "a"),
        (2, "admitted", "a"),
        (3, "running", "a"),
        (4, "cancel_requested", None),
    ]
    elsewhere = pg_server.fresh_schema()
    copy = PostgresEventStore(elsewhere, node="b")
    assert copy.import_events(a.events("j")) == 4  # events made elsewhere: their writer is not known here
    assert {node for _, _, node in writers(elsewhere, "j")} == {None}
    for s in (a, plain, copy):
        s.close()


@pytest.mark.parametrize("noticed_by", ["progress", "heartbeat"])
async def test_a_node_whose_lease_was_taken_stops_the_attempt_writes_nothing_more_for_it_and_runs_the_retry(
    pg_url, tmp_path, caplog, noticed_by
):
    caplog.set_level(logging.WARNING, "h3core.runner")
    # Attempt 1 steps on (a refused progress event tells it) or hangs (then only its heartbeat can).
    first = FakePlan(step_seconds=0.05) if noticed_by == "progress" else FakePlan(hang_at=2)
    taker = PostgresEventStore(pg_url, node="b")
    async with nodes(pg_url, tmp_path, ["a"], FakePlan(), plans=lambda job: first if job.attempt == 1 else None) as (a,):
        job = (await a.submit(request(steps=40))).job_id
        await until(lambda: a.store.get(job).step, 30, "attempt 1's first step")
        assert taker.leases.take_lease(Expired(job_id=job, attempt=1, node_id="a", age_s=0.0), 0.0)  # as a node taking over
        await until(lambda: job not in a._supervisor.busy, 30, "node a to stop attempt 1")
        assert a.executor.cleanups == 1, "attempt 1's work was stopped"
        # Nothing written by a since: the taker's end goes in at the seq it read (else a conflict fails it).
        seen = taker.get(job)
        assert seen.status == "running" and seen.attempt == 1
        taker.append(job, [AttemptFailed(kind="interrupted", message="b took it over", attempt=1)], expected_seq=seen.last_seq)
        await until(lambda: a.store.get(job).terminal, 30, "node a to run the retry")  # a live attempt writes its end
    state = taker.get(job)
    assert state.status == "done" and runs(taker, job) == [(1, "a"), (2, "a")]
    assert [(t, n) for seq, t, n in writers(pg_url, job) if seq > seen.last_seq][:2] == [
        ("attempt_failed", "b"),
        ("running", "a"),
    ]
    (lost,) = [r.getMessage() for r in caplog.records if "is lost to this node" in r.getMessage()]
    assert f"job {job}: attempt 1 is lost" in lost and "node b" in lost
    if noticed_by == "heartbeat":
        assert "the heartbeat did not renew its lease: node b holds it now" in lost
    assert not [r for r in caplog.records if "failed job" in r.getMessage()]
    taker.close()


def test_a_lease_is_gone_only_where_a_beat_begun_after_the_attempt_began_did_not_renew_it():
    from types import SimpleNamespace

    from h3core.runtime._nodes import NodeHeartbeat, not_renewed

    heartbeat = NodeHeartbeat(SimpleNamespace(node_id="a"), a_info(), 1.0)  # not started: its beats are set here
    began = {"taken": 10.0, "kept": 10.0, "claimed-since": 20.0}  # when each attempt began (time.monotonic)
    assert not_renewed(heartbeat, began) == []  # no beat yet
    heartbeat.last = (15.0, frozenset({"kept"}))
    # "claimed-since" began after that beat: its lease may not have been there to renew.
    assert not_renewed(heartbeat, began) == ["taken"]


async def test_a_drained_node_claims_nothing_while_its_attempt_finishes_and_takes_work_once_cleared(pg_url, tmp_path):
    api = PostgresEventStore(pg_url)  # an operator's store, opened for no node
    async with nodes(pg_url, tmp_path, ["a", "b"], FakePlan(step_seconds=0.05), slots=1) as runners:
        by_name = {r.store.leases.node_id: r for r in runners}
        first = await runners[0].submit(request(steps=20))
        await until(lambda: runs(api, first.job_id), 30, "the first job to start")
        drained = runs(api, first.job_id)[0][1]
        other = ({"a", "b"} - {drained}).pop()
        assert api.leases.set_draining(drained, True, by="ops")
        await until(lambda: by_name[drained].heartbeat.drain is not None, 30, f"node {drained} to read its drain")
        jobs = [await by_name[drained].submit(request(steps=2)) for _ in range(4)]
        await until(lambda: all(api.get(j.job_id).status == "done" for j in [first, *jobs]), 60, "every job to end")
        assert runs(api, first.job_id) == [(1, drained)]  # its attempt went on to the end
        assert {j.job_id: runs(api, j.job_id) for j in jobs} == {j.job_id: [(1, other)] for j in jobs}
        (row,) = [n for n in api.leases.nodes() if n.node_id == drained]
        assert row.drain is not None and row.drain.by == "ops" and row.alive()

        assert api.leases.set_draining(drained, False)
        await until(lambda: by_name[drained].heartbeat.drain is None, 30, f"node {drained} to read the drain cleared")
        more = [await by_name[other].submit(request(steps=20)) for _ in range(4)]
        await until(lambda: all(api.get(j.job_id).status == "done" for j in more), 60, "the next jobs to end")
        assert {runs(api, j.job_id)[0][1] for j in more} == {"a", "b"}  # both nodes took some
    api.close()


async def test_a_node_drained_before_it_restarts_claims_nothing_until_the_drain_is_cleared(pg_url, tmp_path):
    api = PostgresEventStore(pg_url)
    async with nodes(pg_url, tmp_path, ["a"], FakePlan()):
        pass  # node a joined once, and left
    assert api.leases.set_draining("a", True, by="ops")
    queue(api, "waiting")
    async with nodes(pg_url, tmp_path, ["a"], FakePlan()) as (a,):
        assert a.heartbeat is not None and a.heartbeat.drain is not None  # read before its first claim
        beats = a.heartbeat.beats
        await until(lambda: a.heartbeat.beats >= beats + 3, 30, "three beats, each with its claims between")
        assert api.get("waiting").status == "queued"
        api.leases.set_draining("a", False)
        await until(lambda: api.get("waiting").status == "done", 30, "the job to run once the drain is cleared")
    assert runs(api, "waiting") == [(1, "a")]
    api.close()
