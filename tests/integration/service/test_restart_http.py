"""The real service killed, stopped and restarted under a running job: no job is lost, none is
left running, and the process stops promptly and cleanly."""

from __future__ import annotations

import hashlib
import signal
import threading
import time

import pytest
from httpx_sse import connect_sse

from h3core.adapters.store.sqlite import SQLiteEventStore
from tests.integration.service.conftest import long_job, poll, submit, wait_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def progressing(job: dict) -> bool:
    return job["status"] == "running" and (job["step"] or 0) >= 2


def test_a_job_survives_its_server_being_killed(servers):
    first = servers.start()
    with first.client() as c:
        job = submit(c, prompt="a fox that outlives its server [fake step=0.2]", steps=12)
        wait_job(c, job["id"], progressing, what="the job to make progress")
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL

    second = servers.start(root=first.root)  # the same store, artifacts and uploads
    with second.client() as c:
        ended = wait_job(c, job["id"], timeout=30)
        assert ended["status"] == "done", ended
        assert ended["attempt"] == 2
        assert ended["step"] == ended["total_steps"] == 12

        events = c.get(f"/v1/jobs/{job['id']}/events").json()
        bodies = [e["body"] for e in events]
        types = [b["type"] for b in bodies]
        assert [b["attempt"] for b in bodies if b["type"] == "running"] == [1, 2]
        failed = [b for b in bodies if b["type"] == "attempt_failed"]
        assert len(failed) == 1 and failed[0]["kind"] == "interrupted" and failed[0]["attempt"] == 1, failed
        # Recovery wrote `interrupted` before the retry started, and nothing ran after done.
        assert types.index("attempt_failed") < len(types) - 1 - types[::-1].index("running")
        assert types[-1] == "done" and types.count("done") == 1
        second_run = bodies[len(types) - 1 - types[::-1].index("running") :]
        assert [b["step"] for b in second_run if b["type"] == "progress"] == list(range(1, 13))

        video = c.get(ended["artifact"]["url"])
        assert video.status_code == 200
        assert hashlib.sha256(video.content).hexdigest() == ended["artifact"]["sha256"]
        for status in ("queued", "running"):
            assert c.get("/v1/jobs", params={"status": status}).json()["items"] == []
    second.stop()

    store = SQLiteEventStore(second.db)
    try:
        assert store.unfinished() == []
        assert store.get(job["id"]).status == "done"
    finally:
        store.close()


def test_sigterm_under_a_running_job_leaves_nothing_running(servers):
    server = servers.start()
    with server.client() as c:
        job = long_job(c, steps=50)
        wait_job(c, job["id"], progressing, what="the job to make progress")
    server.stop(timeout=10)

    store = SQLiteEventStore(server.db)
    try:
        assert store.counts().get("running", 0) == 0, store.counts()
        state = store.get(job["id"])
        # Handed back by the service's own stop (not a failure), checkpointed where it stopped.
        assert (state.status, state.attempt, state.released, state.attempt_errors) == ("queued", 1, 1, ()), state
        assert [e.type for e in store.events(job["id"])[-2:]] == ["checkpointed", "released"]
    finally:
        store.close()


def test_sigterm_exits_0(servers):
    server = servers.start()
    server.signal(signal.SIGTERM)
    assert server.wait(10) == 0


def test_sigterm_with_an_open_stream_stops_promptly(servers):
    # H3_CANCEL_GRACE=0 makes uvicorn's drain timeout 5 s (instead of 35 s) to keep the test short.
    server = servers.start({"H3_CANCEL_GRACE": "0"})
    seen: list[str] = []

    def follow(job_id: str) -> None:
        try:
            with server.client() as c, connect_sse(c, "GET", f"/v1/jobs/{job_id}/stream") as source:
                for sse in source.iter_sse():
                    seen.append(sse.event)
        except Exception as exc:  # the server going away mid-stream is fine here
            seen.append(f"closed: {type(exc).__name__}")

    with server.client() as c:
        job = long_job(c, steps=50)
    reader = threading.Thread(target=follow, args=(job["id"],), daemon=True)
    reader.start()
    poll(lambda: "progress" in seen, 10, "the stream to carry progress", server.log)

    sent = time.monotonic()
    server.signal(signal.SIGTERM)
    server.wait(20)
    took = time.monotonic() - sent
    reader.join(5)
    assert not reader.is_alive()
    # The server ended the stream itself: uvicorn did not wait out its drain timeout and cancel it.
    assert "Shutting down" in server.log() and "graceful shutdown exceeded" not in server.log(), server.log()
    assert "Traceback" not in server.log()
    print(f"stopped {took:.2f}s after SIGTERM with a stream open")


def test_a_second_server_on_the_same_store_refuses_to_start(servers):
    first = servers.start()
    with first.client() as c:
        job = long_job(c, steps=10)
        wait_job(c, job["id"], progressing, what="the job to make progress")
        second = servers.make(root=first.root)
        second.launch()
        started = second.wait_healthy_or_exit(20)
        second.kill()
        assert not started, "a second `h3core serve` started on a store another one runs"
        assert second.proc.returncode == 3, second.log()
        ended = wait_job(c, job["id"], timeout=10)
        assert ended["status"] == "done" and ended["attempt"] == 1, ended
    first.stop()
