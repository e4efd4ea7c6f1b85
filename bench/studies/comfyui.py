"""The ComfyUI executor against a real ComfyUI, with the model-free template `core-nodes-t2va`.

    python main.py --cpu --listen 127.0.0.1 --port 8188     # a stock ComfyUI, from its own checkout and venv
    python -m bench.studies.comfyui --url http://127.0.0.1:8188 [--trials 200] [--slots 4] [--jobs 8]

Every job runs `core-nodes-t2va` (core nodes only: EmptyImage -> ImageBlur x4 -> CreateVideo ->
SaveVideo) at 256x160 and 20-59 frames, so a stock ComfyUI runs it on a CPU (each job's frame count
differs from the one before: ComfyUI reuses the outputs of the last prompt it ran). The same
behaviours are the integration suite tests/integration/comfyui/test_real_comfyui.py, which runs when
`H3_TEST_COMFYUI_URL` or `H3_TEST_COMFYUI_CMD` is set. The smoke test runs this against
h3core.testing.comfyui.FakeComfyUI, which exercises the bench, not ComfyUI.

Three measurements, each printed as a markdown table:

1. cancel while pending, `--trials` times: another client's prompt keeps ComfyUI busy for about a
   second, a job is submitted behind it and cancelled after a random delay (0-1.5 s: while its
   prompt waits, as it starts, or while it runs); counted: jobs recorded `cancelled` whose prompt
   ComfyUI still held right after, and prompts that reached `execution_success` after their job
   was recorded `cancelled`;
2. dispatch with `--slots` slots and concurrency 1: the most of h3core's prompts ever in
   ComfyUI's queue (running + pending), and the most jobs h3core showed `running`;
3. SIGTERM of `h3core serve` mid-job, then a restart: the job's status, its attempt and its
   `resumed` event.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx

from bench.common import parse, print_load_at_end, print_machine, show, table
from h3core import LocalArtifactStore, NotCancellable, Runner, RunnerConfig, SQLiteEventStore
from h3core.domain.request import GenerationRequest
from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings, prompt_id_for
from h3core.executors.comfyui.templates import builtin_templates

TEMPLATES = {"t2va": "core-nodes-t2va"}


class Comfy:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=30)
        # Frame counts in turn: a graph differs from the one before it (ComfyUI reuses the outputs
        # of the last prompt it ran) and every job stays about as short as the first.
        self.sizes = itertools.cycle(range(20, 60))

    def queue(self) -> set[str]:
        data = self.http.get("/queue").json()
        return {i[1] for i in data["queue_running"] + data["queue_pending"]}

    def wait_idle(self) -> None:
        while self.queue():
            time.sleep(0.05)

    def ended(self, prompt_id: str) -> tuple[str | None, float | None]:
        """How a prompt ended (its last status message) and when (epoch seconds); (None, None): not in history."""
        entry = self.http.get(f"/history/{prompt_id}").json().get(prompt_id)
        if not entry:
            return None, None
        name, data = entry["status"]["messages"][-1]
        return name, data.get("timestamp", 0) / 1000

    def foreign(self) -> None:
        graph = builtin_templates()["core-nodes-t2va"].build(self.request(), {})
        self.http.post("/prompt", json={"prompt": graph, "client_id": "someone-else"}).raise_for_status()

    def request(self, extra_frames: int = 0) -> GenerationRequest:
        return GenerationRequest(prompt="a blurred colour", width=256, height=160, frames=next(self.sizes) + extra_frames)


def runner_for(comfy: Comfy, workdir: Path, slots: int) -> Runner:
    settings = ComfyUISettings(
        url=comfy.url, client_id=f"h3bench-{os.getpid()}", templates=TEMPLATES, poll_min_s=0.1, poll_max_s=1.0
    )
    executor = ComfyUIExecutor(settings, builtin_templates(), LocalArtifactStore(workdir / "artifacts"), lambda u: workdir / u)
    store = SQLiteEventStore(workdir / f"h3-{slots}-{time.monotonic_ns()}.db", durable=False)
    return Runner(store, executor, RunnerConfig(slots=slots, poll_interval_s=0.05, cancel_grace_s=30))


async def until(predicate, timeout: float = 600) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


async def cancels(comfy: Comfy, workdir: Path, trials: int) -> None:
    rng = random.Random(15)
    outcomes: dict[str, int] = {}
    held, late_success = [], []
    runner = runner_for(comfy, workdir, 1)
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        await until(lambda: runner.executor.capabilities().mode("t2va").runnable, 60)
        for _ in range(trials):
            await anyio.to_thread.run_sync(comfy.wait_idle)
            await anyio.to_thread.run_sync(comfy.foreign)
            job = await runner.submit(comfy.request())
            await anyio.sleep(rng.uniform(0.0, 1.5))
            with contextlib.suppress(NotCancellable):  # it may have finished already
                await runner.cancel(job.job_id)
            await until(lambda j=job.job_id: runner.store.get(j).terminal)
            state = runner.store.get(job.job_id)
            ref = prompt_id_for(job.job_id, 1)
            still = ref in await anyio.to_thread.run_sync(comfy.queue)
            if state.status == "cancelled" and still:
                held.append(ref)
            await anyio.to_thread.run_sync(comfy.wait_idle)
            how, at = await anyio.to_thread.run_sync(comfy.ended, ref)
            if state.status == "cancelled" and how == "execution_success" and at and at > state.finished_at.timestamp():
                late_success.append(ref)
            key = f"{state.status}: prompt {'never ran (deleted while pending)' if how is None else how}"
            outcomes[key] = outcomes.get(key, 0) + 1
        tg.cancel_scope.cancel()
    t = table(
        f"Cancel while pending: {trials} trials",
        ["outcome", "trials"],
        caption="Each trial: another client's prompt (~1 s) runs, the job's prompt waits behind it, and the job is "
        "cancelled 0-1.5 s after its submission. `done`: the prompt had finished before the cancel arrived.",
    )
    for key, n in sorted(outcomes.items()):
        t.add_row(key, str(n))
    t.add_row("jobs `cancelled` whose prompt ComfyUI still held right after", str(len(held)))
    t.add_row("prompts that succeeded after their job was `cancelled`", str(len(late_success)))
    show(t)


async def dispatch(comfy: Comfy, workdir: Path, slots: int, jobs: int) -> None:
    runner = runner_for(comfy, workdir, slots)
    async with anyio.create_task_group() as tg:
        await tg.start(runner.run)
        await until(lambda: runner.executor.capabilities().mode("t2va").runnable, 60)
        await anyio.to_thread.run_sync(comfy.wait_idle)
        ids = [(await runner.submit(comfy.request())).job_id for _ in range(jobs)]
        ours = {prompt_id_for(j, a) for j in ids for a in (1, 2)}
        most_in_comfy = most_running = samples = 0
        started = time.monotonic()
        while not all(runner.store.get(j).terminal for j in ids):
            in_comfy = len(await anyio.to_thread.run_sync(comfy.queue) & ours)
            running = sum(runner.store.get(j).status == "running" for j in ids)
            most_in_comfy, most_running, samples = max(most_in_comfy, in_comfy), max(most_running, running), samples + 1
            await anyio.sleep(0.01)
        took = time.monotonic() - started
        done = sum(runner.store.get(j).status == "done" for j in ids)
        tg.cancel_scope.cancel()
    t = table(f"Dispatch: {jobs} jobs, {slots} slots, ComfyUI concurrency 1", ["figure", "value"])
    t.add_row("runner slots used (min of slots and concurrency)", str(runner.slot_count()))
    t.add_row("most of h3core's prompts in ComfyUI's queue at once", str(most_in_comfy))
    t.add_row("most jobs `running` in h3core at once", str(most_running))
    t.add_row("queue samples taken", str(samples))
    t.add_row("jobs done", f"{done} of {jobs} in {took:.1f} s")
    show(t)


def sigterm_restart(comfy: Comfy, workdir: Path) -> None:
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("H3_")},
        "H3_EXECUTOR": "comfyui",
        "H3_COMFYUI_URL": comfy.url,
        "H3_COMFYUI_TEMPLATE": "t2va=core-nodes-t2va",
        "H3_PORT": str(port),
        "H3_DB": str(workdir / "serve.db"),
        "H3_ARTIFACTS": str(workdir / "serve-artifacts"),
        "H3_UPLOADS": str(workdir / "serve-uploads"),
    }
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=15)
    comfy.wait_idle()
    first = _serve(env, workdir / "serve-1.log", api)
    r = comfy.request(extra_frames=150)
    job = api.post("/v1/jobs", json={"prompt": r.prompt, "width": r.width, "height": r.height, "frames": r.frames}).json()
    ref = prompt_id_for(job["id"], 1)
    _poll(lambda: ref in comfy.queue(), 120)
    t0 = time.monotonic()
    first.send_signal(signal.SIGTERM)
    rc = first.wait(60)
    stop_s = time.monotonic() - t0
    running_after_stop = ref in comfy.queue()
    second = _serve(env, workdir / "serve-2.log", api)
    _poll(lambda: api.get(f"/v1/jobs/{job['id']}").json()["status"] in ("done", "failed", "cancelled"), 600)
    view = api.get(f"/v1/jobs/{job['id']}").json()
    events = [e["body"] for e in api.get(f"/v1/jobs/{job['id']}/events").json()]
    second.send_signal(signal.SIGTERM)
    second.wait(60)
    resumed = [e for e in events if e["type"] == "resumed"]
    t = table("SIGTERM of h3core serve mid-job, then a restart (--comfyui-on-stop detach, the default)", ["figure", "value"])
    t.add_row("h3core's exit after SIGTERM", f"status {rc} in {stop_s:.2f} s")
    t.add_row("the prompt still running in ComfyUI while h3core was down", str(running_after_stop))
    t.add_row("the job after the restart", f"{view['status']} on attempt {view['attempt']}")
    t.add_row("resumed events", "; ".join(f"prompt {e['executor_ref']} after {e['after_s']:.1f} s" for e in resumed) or "none")
    t.add_row("how the prompt ended in ComfyUI", str(comfy.ended(ref)[0]))
    t.add_row("events", " ".join(e["type"] for e in events if e["type"] != "progress"))
    show(t)


def _serve(env: dict[str, str], log: Path, api: httpx.Client) -> subprocess.Popen:
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "h3core.cli", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT)
    _poll(lambda: _ready(api), 120)
    return proc


def _ready(api: httpx.Client) -> bool:
    try:
        return api.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def _poll(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:g}s")
        time.sleep(0.05)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("H3_TEST_COMFYUI_URL", "http://127.0.0.1:8188"))
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--skip", default="", help="comma-separated: cancels, dispatch, restart")
    args = parse(ap, argv, __spec__.name)
    skip = set(filter(None, args.skip.split(",")))
    comfy = Comfy(args.url)
    stats = comfy.http.get("/system_stats").json()["system"]
    with tempfile.TemporaryDirectory(prefix="h3-comfyui-bench-") as tmp:
        workdir = Path(tmp)
        print_machine(workdir, f"ComfyUI {stats['comfyui_version']} at {comfy.url}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
        if "cancels" not in skip:
            anyio.run(cancels, comfy, workdir, args.trials)
        if "dispatch" not in skip:
            anyio.run(dispatch, comfy, workdir, args.slots, args.jobs)
        if "restart" not in skip:
            sigterm_restart(comfy, workdir)
    print_load_at_end()


if __name__ == "__main__":
    main()
