"""How jobs fail on the real service, and that a failure never takes the service down with it:
retries, a missing result, a stall, and a prompt the fake executor cannot parse."""

from __future__ import annotations

import pytest

from tests.integration.service.conftest import TERMINAL, event_types, poll, submit, wait_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_retried_failure_ends_done_on_the_second_attempt(api):
    job = submit(api, prompt="a lucky fox [fake fail_at=2 kind=executor_lost fail_attempts=1]", steps=3)
    ended = wait_job(api, job["id"])
    assert ended["status"] == "done", ended
    assert ended["attempt"] == 2 and ended["error"] is None
    events = api.get(f"/v1/jobs/{job['id']}/events").json()
    failed = [e["body"] for e in events if e["body"]["type"] == "attempt_failed"]
    assert [(f["attempt"], f["kind"]) for f in failed] == [(1, "executor_lost")]
    assert event_types(api, job["id"]).count("running") == 2


def test_an_executor_without_a_result_fails_the_job(api):
    job = submit(api, prompt="an empty-handed fox [fake no_result]", steps=2)
    ended = wait_job(api, job["id"])
    assert ended["status"] == "failed", ended
    assert ended["error"]["kind"] == "executor_error"
    assert "without a result" in ended["error"]["message"]
    assert ended["step"] == 2 and ended["artifact"] is None


def test_a_stalled_job_fails_stalled(servers):
    server = servers.start({"H3_STALL_TIMEOUT": "1"})
    with server.client() as c:
        job = submit(c, prompt="a frozen fox [fake hang_at=2]", steps=4)
        ended = wait_job(c, job["id"], timeout=15)
        assert ended["status"] == "failed", ended
        assert ended["error"]["kind"] == "stalled"
        assert ended["step"] == 1
        # The slot is free again: the next job runs.
        after = submit(c, prompt="the next fox", steps=1)
        assert wait_job(c, after["id"])["status"] == "done"
        r = c.get("/metrics")
        assert 'h3core_executor_failures_total{kind="stalled"} 1.0' in r.text
    server.stop()


def test_a_prompt_with_a_bad_fake_directive_does_not_stop_the_service(servers):
    server = servers.start()
    with server.client() as c:
        r = c.post(
            "/v1/jobs", json={"prompt": "an oil painting [fake vintage]", "width": 448, "height": 256, "frames": 24, "steps": 2}
        )
        # Refusing it up front (422) or failing the job are both fine; stopping the runner is not.
        assert r.status_code in (201, 422), r.text
        if r.status_code == 201:
            job_id = r.json()["id"]

            def settled():  # the job has ended, or the service has stopped being ready
                if c.get("/readyz").status_code != 200:
                    return "not ready"
                return c.get(f"/v1/jobs/{job_id}").json()["status"] in TERMINAL and "ended"

            assert poll(settled, 10, "the job to end or the service to stop", server.log) == "ended", server.log()
            assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "failed"
        after = c.post("/v1/jobs", json={"prompt": "a plain fox", "width": 448, "height": 256, "frames": 24, "steps": 1})
        assert after.status_code == 201, after.text
        assert wait_job(c, after.json()["id"], timeout=10)["status"] == "done"
        poll(lambda: c.get("/readyz").status_code == 200, 5, "/readyz to answer 200", server.log)
    server.stop()
