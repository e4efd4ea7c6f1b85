"""Webhooks across kill -9: the real service killed while terminal events wait for delivery (the
receiver down, tries failing), ten times over on one store; every terminal event reaches the
receiver after a restart, none is lost, and a repeat always carries the id (and body) it had."""

from __future__ import annotations

import json

import pytest

from tests.integration.service.conftest import poll, submit, wait_job
from tests.receiver import Receiver, receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TRIALS = 3  # both ways a kill lands, each more than once; bench/crash/webhooks.py runs 10 and more


def delivered(rec: Receiver) -> set[str]:
    return {r.headers["webhook-id"] for r in rec.answered()}


def tried(rec: Receiver) -> set[str]:
    """The jobs whose deliveries were tried, answered or not (webhook-id: msg_<job>_<seq>)."""
    return {r.headers["webhook-id"].removeprefix("msg_").rsplit("_", 1)[0] for r in rec.got()}


def test_kill_9_with_deliveries_pending_loses_no_terminal_event(servers):
    env = {"H3_WEBHOOK_SECRET": SECRET, "H3_WEBHOOKS_ALLOW": "127.0.0.1", "H3_POLL_INTERVAL": "0.1"}
    expected: set[str] = set()  # the webhook-id of every job's terminal event
    root = None
    with receiver() as rec:
        for trial in range(TRIALS):
            rec.down = False  # the restart delivers what the last process left: it must all arrive
            server = servers.make(env, root=root).start()
            root = server.root
            poll(lambda: expected <= delivered(rec), 60, "the deliveries a kill left", server.log)
            rec.down = True
            with server.client() as c:
                jobs = [
                    submit(c, prompt=f"trial {trial} [fake step=0]", webhook=rec.url, webhook_events_filter=["completed"])["id"]
                    for _ in range(2)
                ]
                for job_id in jobs:
                    wait_job(c, job_id)
                    expected.add(f"msg_{job_id}_{c.get(f'/v1/jobs/{job_id}/events').json()[-1]['seq']}")
            if trial % 2:  # half the trials are killed mid-backoff, after a failed try of each
                poll(lambda jobs=jobs: set(jobs) <= tried(rec), 30, "a try of each job's delivery", server.log)
            server.kill()
        rec.down = False
        last = servers.make(env, root=root).start()
        poll(lambda: expected <= delivered(rec), 60, "every terminal event", last.log)
        last.stop()
    assert len(expected) == 2 * TRIALS
    got = rec.got()
    assert {r.headers["webhook-id"] for r in got} == expected  # nothing but terminal events, each heard of
    bodies: dict[str, set[str]] = {}
    for r in got:
        bodies.setdefault(r.headers["webhook-id"], set()).add(json.dumps(json.loads(r.body), sort_keys=True))
    assert all(len(b) == 1 for b in bodies.values()), "a repeat differs from the first send of its id"
