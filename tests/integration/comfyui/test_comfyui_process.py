"""`h3core serve --executor comfyui` as a real process against the fake ComfyUI: end to end, and
killed with SIGKILL mid-job, after which the restarted service re-attaches to its prompt (the
prompt id is ours) instead of failing it and running it again."""

from __future__ import annotations

import pytest

from tests.fakes.comfyui import FakeComfyUI
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
        server.stop()
    finally:
        servers.kill_all()


def test_h3core_killed_mid_job_reattaches_to_its_running_prompt(tmp_path, comfy):
    servers = Servers(tmp_path)
    try:
        first = servers.start(_env(comfy))
        with first.client() as api:
            job = api.post("/v1/jobs", json=JOB).json()
            poll(lambda: (api.get(f"/v1/jobs/{job['id']}").json()["step"] or 0) >= 3, 30, "a few steps", first.log)
        first.kill()  # SIGKILL: no cleanup, no interruption recorded
        prompt = comfy.running_prompt_id
        assert prompt is not None, "the prompt runs on in ComfyUI while h3core is down"

        second = servers.make(_env(comfy), root=first.root).start()
        with second.client() as api:
            poll(lambda: api.get(f"/v1/jobs/{job['id']}").json()["status"] == "done", 60, "the job to finish", second.log)
            events = api.get(f"/v1/jobs/{job['id']}/events").json()
        second.stop()
    finally:
        servers.kill_all()
    types = [e["body"]["type"] for e in events]
    assert types.count("running") == 1 and "attempt_failed" not in types, types
    assert events[2]["body"]["executor_ref"] == prompt
    steps = [e["body"]["step"] for e in events if e["body"]["type"] == "progress"]
    assert steps == sorted(set(steps)) and steps[-1] == 30
    assert list(comfy.history) == [prompt], "the prompt ran once: re-attached, not re-run"
