"""The ComfyUI executor against a real ComfyUI, with the model-free template (core nodes only).

Runs when a real server is given, and skips otherwise (CI: the fake ComfyUI covers the same
behaviour there):

    H3_TEST_COMFYUI_URL=http://127.0.0.1:8188     a running stock ComfyUI (--cpu will do)
    H3_TEST_COMFYUI_CMD='/venv/bin/python /src/ComfyUI/main.py --cpu --listen 127.0.0.1 --port {port}'
                                                  or one the suite starts itself: then the test
                                                  that kills ComfyUI mid-job runs too

    H3_TEST_COMFYUI_URL=http://127.0.0.1:8188 .venv/bin/python -m pytest tests/integration/comfyui/test_real_comfyui.py

`bench/studies/comfyui.py` runs the long loops (200 cancels) against the same kind of server.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import av
import httpx
import pytest

from h3core import NotCancellable
from h3core.domain.request import GenerationRequest
from h3core.executors.comfyui.executor import prompt_id_for
from h3core.executors.comfyui.templates import builtin_templates
from tests.integration.comfyui.conftest import ended, until
from tests.integration.conftest import poll
from tests.integration.service.conftest import Servers, free_port

URL = os.environ.get("H3_TEST_COMFYUI_URL", "")
CMD = os.environ.get("H3_TEST_COMFYUI_CMD", "")
TEMPLATES = {"t2va": "core-nodes-t2va"}

pytestmark = [
    pytest.mark.skipif(
        not URL and not CMD,
        reason="no real ComfyUI: set H3_TEST_COMFYUI_URL to a running stock ComfyUI "
        "(or H3_TEST_COMFYUI_CMD to one the suite starts); the fake ComfyUI covers this in CI",
    ),
    pytest.mark.anyio,
    pytest.mark.timeout(600),
]
_sizes = itertools.count(20)  # every job a different frame count: ComfyUI caches a graph it has run


def req(frames: int | None = None, **kw) -> GenerationRequest:
    return GenerationRequest(
        **{"prompt": "a blurred colour", "width": 256, "height": 160, "frames": frames or next(_sizes), **kw}
    )


@dataclass
class RealComfyUI:
    """The server under test; `kill` and `start` only when the suite started it (`H3_TEST_COMFYUI_CMD`)."""

    url: str
    cmd: list[str] | None = None
    log: Path | None = None
    proc: subprocess.Popen | None = None
    log_path: Path | None = None  # no Raylight log: the websocket is the progress source

    def start(self, timeout: float = 180) -> None:
        assert self.cmd is not None and self.log is not None
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        poll(self.answers, timeout, f"ComfyUI at {self.url} to answer", lambda: self.log.read_text()[-3000:])

    def answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/system_stats", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        if self.proc is None:
            pytest.skip("killing ComfyUI needs H3_TEST_COMFYUI_CMD (the suite then starts and kills its own)")
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None

    def queue(self) -> tuple[set[str], set[str]]:
        data = httpx.get(f"{self.url}/queue", timeout=10).json()
        return {i[1] for i in data["queue_running"]}, {i[1] for i in data["queue_pending"]}

    def history(self, prompt_id: str) -> dict | None:
        return httpx.get(f"{self.url}/history/{prompt_id}", timeout=10).json().get(prompt_id)

    def wait_idle(self, timeout: float = 600) -> None:
        """Until ComfyUI's queue is empty: each test starts on an idle server."""
        poll(lambda: not any(self.queue()), timeout, f"ComfyUI at {self.url} to finish what it runs")

    def ended_as(self, prompt_id: str) -> str | None:
        """The last status message of a finished prompt ("execution_success", "execution_interrupted")."""
        entry = self.history(prompt_id)
        return entry["status"]["messages"][-1][0] if entry else None

    async def foreign_prompt(self, frames: int) -> str:
        """Another client's prompt (the same model-free graph), to keep ComfyUI busy."""
        graph = builtin_templates()["core-nodes-t2va"].build(req(frames=frames), {})
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as http:
            answer = await http.post("/prompt", json={"prompt": graph, "client_id": "someone-else"})
        assert answer.status_code == 200, answer.text
        return answer.json()["prompt_id"]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    if CMD:
        port = free_port()
        server = RealComfyUI(
            f"http://127.0.0.1:{port}", shlex.split(CMD.format(port=port)), tmp_path_factory.mktemp("comfyui") / "log"
        )
        server.start()
        yield server
        if server.proc is not None:
            os.killpg(server.proc.pid, signal.SIGTERM)
            server.proc.wait(30)
    else:
        yield RealComfyUI(URL.rstrip("/"))


@pytest.fixture
def comfy(real):
    """The server `make_runner` (conftest) drives: the real one here, idle."""
    real.wait_idle()
    return real


def ours(job_ids, attempts=(1, 2)) -> set[str]:
    return {prompt_id_for(j, a) for j in job_ids for a in attempts}


async def test_a_job_is_done_with_the_frames_it_asked_for_and_the_socket_reported_its_prompt(make_runner, real):
    async with make_runner(comfyui={"templates": TEMPLATES}) as runner:
        await until(lambda: runner.executor.capabilities().mode("t2va").runnable, 30)
        seen: list[str] = []
        job_id = "real-happy-" + os.urandom(4).hex()

        async def listen() -> None:
            async with runner.executor.feed.follow(prompt_id_for(job_id, 1)) as hints:
                async for message in hints:
                    seen.append(message["type"])
                    if message["type"] == "execution_success":
                        return

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            job = await runner.submit(req(frames=37), job_id=job_id)
            state = await ended(runner, job.job_id, 120)
    assert state.status == "done", state.error
    path = runner.executor.artifacts.resolve(state.artifact.path)
    with av.open(str(path)) as container:
        decoded = sum(1 for _ in container.decode(video=0))
    assert decoded == 37 == state.artifact.frames
    assert {"execution_start", "executing", "execution_success"} <= set(seen), seen
    assert real.ended_as(state.executor_ref) == "execution_success"
    assert runner.store.events(job.job_id)[2].body.info["ignores"] == "prompt,seed,steps"
    assert not runner.executor.capabilities().mode("fl2va").served, "a stock ComfyUI lacks MiniMax-H3's nodes"


async def test_cancels_of_pending_prompts_leave_none_running(make_runner, real):
    rng = random.Random(15)
    leaks = []
    async with make_runner(comfyui={"templates": TEMPLATES}) as runner:
        await until(lambda: runner.executor.capabilities().mode("t2va").runnable, 30)
        for _ in range(int(os.environ.get("H3_TEST_COMFYUI_TRIALS", "20"))):
            await anyio.to_thread.run_sync(real.wait_idle)
            await real.foreign_prompt(frames=next(_sizes))  # busy for about a second: ours waits pending
            job = await runner.submit(req())
            await anyio.sleep(rng.uniform(0.0, 1.5))  # sometimes while pending, sometimes as it starts
            with contextlib.suppress(NotCancellable):  # it may have finished already
                await runner.cancel(job.job_id)
            state = await ended(runner, job.job_id, 60)
            running, pending = real.queue()
            if state.status == "cancelled" and state.executor_ref in running | pending:
                leaks.append(state.executor_ref)
            assert state.status in ("cancelled", "done"), state.error  # done: it finished before the cancel
    assert leaks == [], "a job recorded cancelled whose prompt ComfyUI still held"


async def test_cancels_of_running_prompts_interrupt_them(make_runner, real):
    async with make_runner(comfyui={"templates": TEMPLATES}) as runner:
        await until(lambda: runner.executor.capabilities().mode("t2va").runnable, 30)
        for _ in range(3):
            job = await runner.submit(req(frames=next(_sizes) + 100))  # several seconds on a CPU
            ref = prompt_id_for(job.job_id, 1)
            await until(lambda ref=ref: ref in real.queue()[0], 60)
            await runner.cancel(job.job_id)
            state = await ended(runner, job.job_id, 60)
            assert state.status == "cancelled"
            assert ref not in set().union(*real.queue()) and real.ended_as(ref) == "execution_interrupted"


async def test_with_four_slots_comfyui_never_holds_more_than_one_of_h3cores_prompts(make_runner, real):
    async with make_runner(slots=4, comfyui={"templates": TEMPLATES}) as runner:
        await until(lambda: runner.executor.capabilities().mode("t2va").runnable, 30)
        jobs = [(await runner.submit(req())).job_id for _ in range(6)]
        most = 0
        with anyio.fail_after(300):
            while not all(runner.store.get(j).terminal for j in jobs):
                running, pending = await anyio.to_thread.run_sync(real.queue)
                most = max(most, len((running | pending) & ours(jobs)))
                await anyio.sleep(0.02)
    assert most == 1 and all(runner.store.get(j).status == "done" for j in jobs)


async def test_comfyui_killed_mid_job_fails_the_attempt_and_the_retry_runs_when_it_is_back(make_runner, real):
    if real.proc is None:
        real.kill()  # skips, saying why
    async with make_runner(comfyui={"templates": TEMPLATES, "unreachable_after_s": 5.0}) as runner:
        await until(lambda: runner.executor.capabilities().mode("t2va").runnable, 30)
        job = await runner.submit(req(frames=next(_sizes) + 100))
        await until(lambda: prompt_id_for(job.job_id, 1) in real.queue()[0], 60)
        real.kill()
        await until(lambda: runner.store.get(job.job_id).attempt_errors, 60)
        assert runner.store.get(job.job_id).status == "queued", "the retry waits for ComfyUI"
        await anyio.to_thread.run_sync(real.start)
        state = await ended(runner, job.job_id, 300)
    assert state.status == "done" and state.attempt == 2
    assert state.attempt_errors[0].kind == "executor_lost"


@pytest.mark.parametrize("on_stop", ["detach", "interrupt"])
def test_sigterm_of_h3core_mid_job_then_a_restart_finishes_the_job(tmp_path, comfy, on_stop):
    real = comfy
    env = {
        "H3_EXECUTOR": "comfyui",
        "H3_COMFYUI_URL": real.url,
        "H3_COMFYUI_TEMPLATE": "t2va=core-nodes-t2va",
        "H3_COMFYUI_ON_STOP": on_stop,
        "H3_STALL_TIMEOUT": "120",
    }
    job = {"prompt": "a blurred colour", "width": 256, "height": 160, "frames": next(_sizes) + 150}
    servers = Servers(tmp_path)
    try:
        first = servers.start(env)
        with first.client() as api:
            poll(lambda: api.get("/readyz").status_code == 200, 60, "ComfyUI to be ready", first.log)
            created = api.post("/v1/jobs", json=job).json()
            ref = prompt_id_for(created["id"], 1)
            poll(lambda: ref in real.queue()[0], 60, "the prompt to run", first.log)
        stopped_at = time.monotonic()
        first.stop()  # SIGTERM
        assert (ref in real.queue()[0]) == (on_stop == "detach") or real.ended_as(ref) == "execution_success"
        second = servers.make(env, root=first.root).start()
        with second.client() as api:
            poll(lambda: api.get(f"/v1/jobs/{created['id']}").json()["status"] == "done", 300, "the job", second.log)
            view = api.get(f"/v1/jobs/{created['id']}").json()
            events = [e["body"] for e in api.get(f"/v1/jobs/{created['id']}/events").json()]
        second.stop()
    finally:
        servers.kill_all()
    types = [e["type"] for e in events]
    if on_stop == "detach":
        resumed = [e for e in events if e["type"] == "resumed"]
        assert view["attempt"] == 1 and len(resumed) == 1 and resumed[0]["executor_ref"] == ref, types
        assert resumed[0]["after_s"] <= time.monotonic() - stopped_at + 60
        assert real.ended_as(ref) == "execution_success"
    else:
        assert view["attempt"] == 2 and "resumed" not in types and events[types.index("attempt_failed")]["kind"] == "interrupted"
        assert real.ended_as(ref) == "execution_interrupted"
