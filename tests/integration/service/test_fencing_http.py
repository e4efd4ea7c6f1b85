"""Fencing with real processes: two `h3core serve` runner nodes (one slot each) on one PostgreSQL
store. The node running a job is frozen (SIGSTOP) past its lease; the other node takes the attempt
over (the job is queued again) and thaws it (SIGCONT) with attempt 1 still running in it, while
the job waits queued: the window where a thawed node used to end someone else's job
`failed(executor_error)`. The job ends `done` through the retry, run by the node that took it over
from the checkpoint attempt 1 logged before the freeze, and the thawed node writes nothing onto
it, no progress and no checkpoint: every event from the takeover on was written by the other node
(the store records each event's writer, `events.node`).

The job stays queued at the thaw because the other node's slot is taken (a blocker job); the
thawed node, its attempt lost, claims the queue's head (a second blocker, of higher priority)
rather than the job, which the other node runs once its blocker is cancelled. No step waits on a
clock: each polls the store or a log for the condition it needs, with deadlines far past what a
loaded machine takes.
"""

from __future__ import annotations

import signal

import psycopg
import pytest

from h3core.adapters.store.postgres import PostgresEventStore
from h3core.domain.events import AttemptFailed, Restored, Running
from tests.integration.service.conftest import poll, submit

pytestmark = pytest.mark.timeout(300)

LEASE_S = "2"  # beats every 2/3 s; a node frozen longer than 2 s is taken over
STEPS = 30  # 0.1 s each: attempt 1 is still running in the frozen node when it thaws
SLOW = "a slow fox [fake step=0.1]"
BLOCKER = "a fox that waits [fake hang_at=2]"  # takes a slot until cancelled (its step 1 stored)


def writers(url: str, job_id: str) -> list[tuple[int, str, str | None]]:
    """(seq, type, writing node) of the job's events, as the store recorded them."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT seq, type, node FROM events WHERE job_id = %s ORDER BY seq", (job_id,)).fetchall()


def test_a_node_frozen_past_its_lease_never_writes_onto_the_job_again(servers, pg_url):
    nodes = servers.nodes(pg_url, ("a", "b"), {"H3_LEASE": LEASE_S, "H3_POLL_INTERVAL": "0.05"})  # a slot each
    store = PostgresEventStore(pg_url)

    def on_node(job_id: str) -> str | None:  # the node running the job, once it has stored a step
        state = store.get(job_id)
        return state.info.get("node") if state.status == "running" and state.step else None

    try:
        with nodes["a"].client() as api:
            job = submit(api, prompt=SLOW, steps=STEPS)["id"]
        frozen_name = poll(lambda: on_node(job), 60, "attempt 1 to start and store a step")
        frozen = nodes[frozen_name]
        other_name = "b" if frozen_name == "a" else "a"
        with nodes[other_name].client() as other:
            blocker = submit(other, prompt=BLOCKER, steps=4)["id"]  # takes the other node's slot
            poll(lambda: on_node(blocker) == other_name, 60, f"node {other_name} to run the blocker")
            poll(lambda: store.get(job).checkpoints, 60, "attempt 1 to log a checkpoint")  # every 5 steps (the default)
            frozen.signal(signal.SIGSTOP)
            try:
                requeued = lambda: store.get(job).status == "queued"  # noqa: E731 - by the takeover: the other node is busy
                poll(requeued, 90, f"node {other_name} to take attempt 1 over", lambda: str(store.get(job)))
                # The head of the queue once the frozen node thaws and its slot frees: not the job.
                head = submit(other, prompt=BLOCKER, steps=4, priority=10)["id"]
            finally:
                frozen.signal(signal.SIGCONT)  # thaws with attempt 1 still running in it, the job queued
            lost = f"job {job}: attempt 1 is lost to this node"
            poll(lambda: lost in frozen.log(), 60, "the thawed node to find attempt 1 lost", frozen.log)
            poll(lambda: on_node(head) == frozen_name, 60, f"node {frozen_name} to run the queue's head")
            assert store.get(job).status == "queued"  # nothing the thawed node did ended it
            assert other.post(f"/v1/jobs/{blocker}/cancel").status_code == 202
            poll(lambda: store.get(job).terminal, 90, "the retry to end the job", lambda: str(store.get(job)))
            assert other.post(f"/v1/jobs/{head}/cancel").status_code == 202
        for node in nodes.values():  # whatever either would still write is written once it has stopped
            node.stop(timeout=60)
        state, events = store.get(job), store.events(job)
    finally:
        store.close()

    assert state.status == "done" and state.attempt == 2, state
    (takeover,) = [e for e in events if isinstance(e.body, AttemptFailed)]
    assert f"node {frozen_name} stopped heartbeating" in takeover.body.message
    assert f"ended by node {other_name}" in takeover.body.message
    assert [(e.body.attempt, e.body.info["node"]) for e in events if isinstance(e.body, Running)] == [
        (1, frozen_name),
        (2, other_name),
    ]
    rows = writers(pg_url, job)
    assert [node for seq, _, node in rows if seq < takeover.seq] == ["a", "a"] + [frozen_name] * (takeover.seq - 3)
    after = [(t, node) for seq, t, node in rows if seq >= takeover.seq]
    assert {node for _, node in after} == {other_name}, "an event from the takeover on was not written by the taker"
    # The retry continued from attempt 1's newest checkpoint logged before the freeze, and is all
    # that follows: nothing of attempt 1's.
    (restored,) = [e for e in events if isinstance(e.body, Restored)]
    assert restored.body.checkpoint.attempt == 1 and restored.body.attempt == 2
    assert [t for t, _ in after[:3]] == ["attempt_failed", "running", "restored"] and after[-1][0] == "done"
    later = [e for e in events if e.seq > takeover.seq]
    assert [e.body.step for e in later if e.type == "progress"] == list(range(restored.body.checkpoint.step + 1, STEPS + 1))
    assert all(e.body.checkpoint.attempt == 2 for e in later if e.type == "checkpointed")
    log = frozen.log()
    assert "failed job" not in log and f"job {job} failed" not in log, "the thawed node blamed the executor"
