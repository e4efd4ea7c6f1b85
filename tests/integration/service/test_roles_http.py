"""The service as two processes on one store: `H3_ROLE=api` takes the requests, `H3_ROLE=runner`
runs the jobs. Real processes, real sockets; the store is all they share."""

from __future__ import annotations

import signal

from tests.integration.service.conftest import CLEAN_EXIT, Servers, event_types, long_job, poll, submit, wait_job
from tests.integration.service.test_jobs_http import stream


def start_runner(servers: Servers, root=None):
    runner = servers.make({"H3_ROLE": "runner", "H3_POLL_INTERVAL": "0.05"}, root=root)
    runner.launch()  # no HTTP: it is up once it says so
    poll(lambda: "ready" in runner.log() or not runner.running, 60, "the runner process to start", runner.log)
    assert runner.running, runner.log()
    return runner


def test_an_api_process_and_a_runner_process_share_one_store(servers: Servers):
    api = servers.make({"H3_ROLE": "api"}).start()
    with api.client() as c:
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "no runner process" in ready.json()["runner"], ready.text
        queued = submit(c)  # accepted with no runner up: it waits in the store

        runner = start_runner(servers, root=api.root)
        poll(lambda: c.get("/readyz").status_code == 200, 10, "/readyz once a runner process is up", api.log)
        assert f"process {runner.proc.pid}" in c.get("/readyz").json()["runner"]
        assert wait_job(c, queued["id"])["status"] == "done"

        # Live: the stream follows what the runner process stores, to the end.
        job = submit(c, steps=6, prompt="a fox [fake step=0.1]")
        events = stream(c, job["id"])
        progress = ["progress"] * 5 + ["checkpointed", "progress"]  # the fake checkpoints after step 5 by default
        assert [t for t, _, _ in events] == ["submitted", "admitted", "running", *progress, "done"]
        assert [i for _, i, _ in events] == list(range(1, 12))
        # /metrics counts what the runner process did, learnt from the store.
        done_twice = 'h3core_job_duration_seconds_count{status="done"} 2.0'
        poll(lambda: done_twice in c.get("/metrics").text, 5, "/metrics to count both jobs", lambda: c.get("/metrics").text)
        video = c.get(f"/v1/jobs/{job['id']}/video")
        assert video.status_code == 200 and video.content[4:8] == b"ftyp"

        # A cancel crosses the processes: the api stores the request, the runner stops the job.
        slow = long_job(c, steps=400, step=0.05)
        wait_job(c, slow["id"], lambda j: (j["step"] or 0) >= 2)
        assert c.post(f"/v1/jobs/{slow['id']}/cancel").status_code == 202
        assert wait_job(c, slow["id"])["status"] == "cancelled"
        # Steps the runner made before it saw the request may follow it in the log: then it stops.
        types = event_types(c, slow["id"])
        assert "cancel_requested" in types and types[-1] == "cancelled" and "done" not in types

        # Restarting the api does not touch a running job: one attempt, done.
        kept = long_job(c, steps=30, step=0.1)
        wait_job(c, kept["id"], lambda j: (j["step"] or 0) >= 1)
    api.stop()
    api.start()
    with api.client() as c:
        assert wait_job(c, kept["id"], timeout=30)["status"] == "done"
        assert event_types(c, kept["id"]).count("running") == 1

    runner.signal(signal.SIGTERM)
    assert runner.wait(30) in CLEAN_EXIT, runner.log()
    api.stop()


def test_a_second_runner_process_is_refused_and_the_api_needs_no_lock(servers: Servers):
    first = start_runner(servers)
    second = servers.make({"H3_ROLE": "runner"}, root=first.root)
    second.launch()
    assert second.wait(30) == 3, second.log()  # EXIT_LOCKED, naming the holder
    assert f"process {first.proc.pid}" in second.log()
    api = servers.make({"H3_ROLE": "api"}, root=first.root).start()  # beside a runner: fine
    with api.client() as c:
        assert c.get("/readyz").status_code == 200
    api.stop()
    first.signal(signal.SIGTERM)
    assert first.wait(30) in CLEAN_EXIT, first.log()
