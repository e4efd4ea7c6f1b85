"""`h3core serve --executor comfyui` as a real process against the fake ComfyUI: end to end, and
killed with SIGKILL or stopped with SIGTERM mid-job, after which the restarted service
re-attaches to its prompt (the prompt id is ours) instead of failing it and running it again."""

from __future__ import annotations

import pytest

from h3core.testing.comfyui import FakeComfyUI
from tests.integration.conftest import poll
from tests.integration.service.conftest import Servers

pytestmark = pytest.mark.timeout(120)

JOB = {"prompt": "a red fox in snow", "width": 448, "height": 256, "frames": 24, "steps": 30}


@pytest.fixture
def comfy(tmp_path):
    with FakeComfyUI(tmp_path / "comfyui").running_in_thread() as fake:
        fake.step_seconds = 0.1
        yield fake


def _env(comfy) -> dict[str, str]:
    return {"H3_EXECUTOR": "comfyui", "H3_COMFYUI_URL": comfy.url, "H3_STALL_TIMEOUT": "30"}


def test_serve_runs_jobs_on_comfyui_end_to_end(tmp_path, comfy):
    comfy.step_seconds = 0.01
    servers = Servers(tmp_path)
    try:
        server = servers.start(_env(comfy))
        with server.client() as api:
            job = api.post("/v1/jobs", json={**JOB, "steps": 8}).json()
            poll(lambda: api.get(f"/v1/jobs/{job['id']}").json()["status"] == "done", 30, "the job to finish", server.log)
            view = api.get(f"/v1/jobs/{job['id']}").json()
            video = api.get(view["artifact"]["url"])
            assert video.status_code == 200 and len(video.content) == view["artifact"]["bytes"]
            ready = api.get("/readyz").json()
            assert ready["executor"] == "ready for t2va, fl2va, ref2va" and ready["problems"] == []
            # The box page shows the devices ComfyUI reports (the recorded H200's answer).
            box = api.get("/console/box").text
            assert "<td>cuda:0 NVIDIA H200 : cudaMallocAsync</td><td>140.4 GiB</td><td>139.4 GiB</td><td>1.0 GiB (1%)</td>" in box
            comfy.call(comfy.stop())  # ComfyUI goes away: the page says so, and still answers
            box = api.get("/console/box")
            assert box.status_code == 200 and 'Device memory</h2>\n  <p class="problems">not read: GET' in box.text, box.text
        server.stop()
    finally:
        servers.kill_all()


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_h3core_killed_or_stopped_mid_job_resumes_its_running_prompt_on_attempt_1(tmp_path, comfy, how):
    servers = Servers(tmp_path)
    try:
        first = servers.start(_env(comfy))
        with first.client() as api:
            job = api.post("/v1/jobs", json=JOB).json()
            poll(lambda: (api.get(f"/v1/jobs/{job['id']}").json()["step"] or 0) >= 3, 30, "a few steps", first.log)
        # SIGKILL: no cleanup at all; SIGTERM: a graceful stop, which detaches the prompt by default.
        first.kill() if how == "SIGKILL" else first.stop()
        prompt = comfy.running_prompt_id
        assert prompt is not None, "the prompt runs on in ComfyUI while h3core is down"

        second = servers.make(_env(comfy), root=first.root).start()
        with second.client() as api:
            poll(lambda: api.get(f"/v1/jobs/{job['id']}").json()["status"] == "done", 60, "the job to finish", second.log)
            view = api.get(f"/v1/jobs/{job['id']}").json()
            events = api.get(f"/v1/jobs/{job['id']}/events").json()
        second.stop()
    finally:
        servers.kill_all()
    types = [e["body"]["type"] for e in events]
    assert view["attempt"] == 1 and types.count("running") == 1 and "attempt_failed" not in types, types
    assert events[2]["body"]["executor_ref"] == prompt
    resumed = [e["body"] for e in events if e["body"]["type"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["executor_ref"] == prompt and resumed[0]["attempt"] == 1
    steps = [e["body"]["step"] for e in events if e["body"]["type"] == "progress"]
    assert steps == sorted(set(steps)) and steps[-1] == 30
    assert ("POST", "/interrupt", {"prompt_id": prompt}) not in comfy.received
    assert list(comfy.history) == [prompt], "the prompt ran once: re-attached, not re-run"
