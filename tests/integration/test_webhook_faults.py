"""Webhook delivery under faults, on a PostgreSQL server of the module's own: two runner nodes'
delivering processes (`DeliveryProcess`, as each node starts one) share one store and its
delivery turn. A frozen holder loses the turn to the other node within its lease and, thawed,
sends nothing more and exits; a server restart and ended sessions lose no terminal event; after
a kill -9 of the delivering process, the node that goes on from the saved place sends no job's
progress after that job's end. The jobs' events are written straight to the store (no runner)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager

import anyio
import pytest

from h3core.adapters.store.postgres import PostgresEventStore
from h3core.domain.events import Body, Progress, Submitted
from h3core.domain.webhooks import WebhookTarget, parse_endpoint
from h3core.runtime.delivery_process import DeliveryConfig, DeliveryProcess
from h3core.testing.factories import done_log
from tests.pgserver import PgServer, running_server
from tests.receiver import Receiver, receiver
from tests.waiting import until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
LEASE_S = 2.0  # the delivery turn's lease here (5 s by default): a takeover takes about 4/3 of it
WAIT_S = 60.0  # a bound on a loaded machine, not a measure


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    with running_server() as s:
        yield s


def _config(url: str, endpoints: Sequence[str] = (), lease_s: float = LEASE_S) -> DeliveryConfig:
    return DeliveryConfig(
        db=url,
        endpoints=[parse_endpoint(e) for e in endpoints],
        allow=["127.0.0.1"],
        resync_s=0.05,
        turn_lease_s=lease_s,
        store_retry_s=30,
    )


@asynccontextmanager
async def _node(config: DeliveryConfig) -> AsyncIterator[DeliveryProcess]:
    """A node's delivering process (and the children it starts again), for the block."""
    delivery = DeliveryProcess(config, [SECRET], restart_s=0.2)
    async with anyio.create_task_group() as tg:
        await tg.start(delivery.run)
        try:
            yield delivery
        finally:
            if delivery.pid is not None:  # a frozen child would not see its stdin end
                _signal(delivery.pid, signal.SIGCONT)
            tg.cancel_scope.cancel()


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _job(hook: str | None = None, events: Sequence[str] = ("start", "progress", "completed")) -> list[Body]:
    """A whole job's bodies (submitted to done, 5 steps), asking for webhooks to `hook` if given."""
    first, *rest = done_log(steps=5)
    assert isinstance(first, Submitted)
    webhook = WebhookTarget(url=hook, events=tuple(events)) if hook else None
    return [first.model_copy(update={"webhook": webhook}), *rest]


def _write(url: str, jobs: dict[str, list[Body]], *, step_by_step: bool = False) -> None:
    """Store the jobs' events, on a store of its own (one opened before a fault would meet it too);
    `step_by_step`: each progress and the end in an append of its own, as a runner writes them."""
    store = PostgresEventStore(url, pool_size=1)
    try:
        for job_id, bodies in jobs.items():
            if not step_by_step:
                store.append(job_id, bodies)
                continue
            head = [b for b in bodies if not isinstance(b, Progress)][:-1]
            store.append(job_id, head)
            for body in bodies[len(head) :]:
                store.append(job_id, [body])
    finally:
        store.close()


def _done(rec: Receiver) -> set[str]:
    """The jobs whose end the receiver answered."""
    return {_job_of(r.headers["webhook-id"]) for r in rec.answered() if r.payload["type"] in ("job.done", "video.completed")}


def _tried_ends(rec: Receiver) -> set[str]:
    """The jobs whose end the receiver was sent, answered or not."""
    return {_job_of(r.headers["webhook-id"]) for r in rec.got() if r.payload["type"] == "job.done"}


def _job_of(webhook_id: str) -> str:
    return webhook_id.removeprefix("msg_").rsplit("_", 1)[0]


async def _delivering(*nodes: DeliveryProcess) -> DeliveryProcess:
    await until(lambda: any(n.delivering for n in nodes), WAIT_S, "a node to deliver")
    return next(n for n in nodes if n.delivering)


async def test_a_frozen_delivering_process_loses_the_turn_and_sends_nothing_once_it_thaws(server):
    """Node a is frozen (SIGSTOP) between two tries of a job's end (its receiver failing): node b
    takes the turn over within about 4/3 of its lease and delivers from the saved place; node a,
    thawed with that try overdue, sends it no more (the turn is checked first) and its process exits."""
    url = server.fresh_schema()
    # Each node sends every job's events to a receiver of its own: what a receiver got, its node sent.
    with receiver() as at_a, receiver() as at_b:
        async with _node(_config(url, [f"jobs={at_a.url}"])) as a:
            await until(lambda: a.delivering, WAIT_S, "node a to deliver")
            async with _node(_config(url, [f"jobs={at_b.url}"])) as b:
                await until(lambda: b.delivering is False, WAIT_S, "node b to stand by")
                at_a.down = True
                _write(url, {"j1": _job()})
                await until(lambda: "j1" in _tried_ends(at_a), WAIT_S, "node a's first try of j1's end")
                frozen = a.pid
                assert frozen is not None
                os.kill(frozen, signal.SIGSTOP)
                stopped = time.monotonic()
                sent_by_a = len(at_a.got())
                at_a.down = False  # what node a sends now is answered: it would count as delivered
                try:
                    _write(url, {"j2": _job()})
                    await until(lambda: _done(at_b) == {"j1", "j2"}, WAIT_S, "node b to take over and send j1's and j2's ends")
                    took_over_s = time.monotonic() - stopped
                finally:
                    os.kill(frozen, signal.SIGCONT)
                await until(lambda: a.starts == 2, WAIT_S, "the thawed process to exit (and another to start)")
                await until(lambda: a.delivering is False, WAIT_S, "node a's next process to stand by")
                _write(url, {"j3": _job()})
                await until(lambda: _done(at_b) == {"j1", "j2", "j3"}, WAIT_S, "j3's webhooks, from node b")
                assert b.starts == 1
    assert len(at_a.got()) == sent_by_a, f"node a sent after its freeze: {[r.headers['webhook-id'] for r in at_a.got()]}"
    assert _done(at_a) == set()
    print(f"takeover after SIGSTOP: {took_over_s:.2f}s with a {LEASE_S:g}s lease")


async def test_every_terminal_event_is_delivered_across_a_server_restart_and_ended_sessions(server):
    """The delivering process (and the one standing by) rides out the faults: its reads and writes
    are tried again on fresh connections, its turn renewed within its lease (long here: a loaded
    machine's restart may take seconds), so neither process ends and nothing waits for a restart."""
    url = server.fresh_schema()
    expected: set[str] = set()
    with receiver() as rec:
        async with _node(_config(url, lease_s=30)) as a, _node(_config(url, lease_s=30)) as b:
            await _delivering(a, b)
            for n, fault in enumerate((lambda: None, lambda: server.restart("fast"), server.terminate_backends)):
                began = time.monotonic()
                await anyio.to_thread.run_sync(fault)
                print(f"fault {n}: {time.monotonic() - began:.2f}s")
                jobs = {f"j{n}-{i}": _job(rec.url, events=("start", "completed")) for i in range(3)}
                _write(url, jobs)
                expected |= set(jobs)
                await until(lambda want=set(expected): _done(rec) >= want, WAIT_S, f"every terminal event after fault {n}")
            await _delivering(a, b)  # a node delivers still
            assert (a.starts, b.starts) == (1, 1), "a delivering process ended on a store fault"
    assert _done(rec) == expected


async def test_after_kill_9_of_the_delivering_process_no_job_gets_progress_after_its_end(server):
    url = server.fresh_schema()
    with receiver() as rec, receiver() as dead:
        dead.down = True  # the blocker's end is retried, and holds the saved place before it
        async with _node(_config(url)) as a, _node(_config(url)) as b:
            holder = await _delivering(a, b)
            _write(url, {"blocker": _job(dead.url, events=("completed",))})
            first = {f"j{i}": _job(rec.url) for i in range(4)}
            _write(url, first, step_by_step=True)
            await until(lambda: _done(rec) >= set(first), WAIT_S, "the first jobs' ends")
            assert holder.pid is not None
            os.kill(holder.pid, signal.SIGKILL)
            later = {f"k{i}": _job(rec.url) for i in range(4)}
            _write(url, later, step_by_step=True)
            await until(lambda: _done(rec) >= set(first) | set(later), WAIT_S, "every job's end, after the takeover")
    late: list[str] = []
    for job_id in [*first, *later]:
        got = [r for r in rec.answered() if _job_of(r.headers["webhook-id"]) == job_id]
        kinds = [r.payload["type"] for r in got]
        end = kinds.index("job.done")
        seen = {r.headers["webhook-id"] for r in got[:end]}
        for r in got[end + 1 :]:  # after the end: repeats of what came before it (same id), never a progress
            kind = r.payload["type"]
            if kind == "job.progress" or (kind != "job.done" and r.headers["webhook-id"] not in seen):
                late.append(f"{job_id}: {kind} ({r.headers['webhook-id']})")
    assert late == [], f"deliveries after their job's end: {late}"
    assert a.starts + b.starts >= 3  # the killed child was started again
