"""The ComfyUI executor through the runner, against a protocol-faithful fake ComfyUI on loopback.

Each old failure of docs/design.md §2 has its test here: completion from one socket message
(socket dropped), a restart of ComfyUI (prompt vanished), OOM classification, the global
interrupt, and a restart of h3core (re-attach instead of re-run: tests/integration/comfyui/
test_comfyui_process.py, with a real process killed by SIGKILL).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import anyio
import av
import pytest

from h3core import Refused, RetryPolicy, SQLiteEventStore
from h3core.domain.events import CancelRequested
from h3core.domain.request import GenerationRequest
from h3core.executors.comfyui.executor import prompt_id_for
from h3core.executors.comfyui.templates import builtin_templates
from tests.integration.comfyui.conftest import ended, png_path, types, until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def foreign_prompt(comfy, steps: int) -> str:
    """A prompt another client of the same ComfyUI queues (the t2va graph, with its own id)."""
    import httpx

    from h3core.executors.comfyui.templates import builtin_templates

    graph = builtin_templates()["minimax-h3-t2va-single-gpu"].build(req(steps=steps, seed=99), {})
    async with httpx.AsyncClient(base_url=comfy.url) as http:
        answer = await http.post("/prompt", json={"prompt": graph, "client_id": "someone-else"})
    assert answer.status_code == 200, answer.text
    return answer.json()["prompt_id"]


@pytest.fixture
def store(tmp_path):
    store = SQLiteEventStore(tmp_path / "h3-restarts.db", durable=False)
    yield store
    store.close()


def req(**kw) -> GenerationRequest:
    return GenerationRequest(**{"prompt": "a red fox in snow", "width": 448, "height": 256, "frames": 24, "steps": 6, **kw})


async def test_a_job_completes_with_one_progress_event_per_step_and_its_video(make_runner, comfy):
    async with make_runner() as runner:
        job = await runner.submit(req(steps=6))
        state = await ended(runner, job.job_id)
    assert state.status == "done", state.error
    assert types(runner, job.job_id) == ["submitted", "admitted", "running"] + ["progress"] * 6 + ["done"]
    running = runner.store.events(job.job_id)[2].body
    assert running.executor == "comfyui" and running.executor_ref in comfy.history  # our own prompt id
    path = runner.executor.artifacts.resolve(state.artifact.path)
    with av.open(str(path)) as c:
        assert c.streams.video and c.streams.audio
    # What ComfyUI was asked to run: the t2va template with the request's values bound.
    graph = comfy.history[running.executor_ref]["prompt"][2]
    assert graph["5"]["inputs"]["prompt"] == "a red fox in snow" and graph["9"]["inputs"]["steps"] == 6


async def test_the_devices_memory_is_what_comfyui_reports_and_a_server_away_raises(make_runner, comfy):
    from h3core.executors.comfyui.client import Unreachable
    from h3core.executors.reports import DeviceMemory

    async with make_runner() as runner:
        (device,) = await runner.executor.device_memory()
        total = 150_754_820_096  # the recorded H200's: torch in ComfyUI holds nothing before a prompt
        assert device == DeviceMemory("cuda:0 NVIDIA H200 : cudaMallocAsync", total, total - 2**30, 0)
        await comfy.stop()
        with pytest.raises(Unreachable):
            await runner.executor.device_memory()


async def test_a_dropped_socket_loses_hints_not_the_job(make_runner, comfy, caplog):
    caplog.set_level(logging.INFO, logger="h3core.executors.comfyui")
    comfy.drop_sockets_at_step = 3
    async with make_runner() as runner:
        job = await runner.submit(req(steps=10))
        state = await ended(runner, job.job_id)
        assert runner.executor.feed.connects >= 2, "the socket came back"
    assert state.status == "done"
    said = [(r.levelname, r.getMessage().split(" (")[0], r.url) for r in caplog.records if r.name == "h3core.executors.comfyui"]
    url = runner.executor.feed.url
    assert said[:3] == [
        ("INFO", "ComfyUI websocket connected", url),
        ("WARNING", "ComfyUI websocket dropped", url),
        ("INFO", "ComfyUI websocket reconnected", url),
    ]
    steps = [e.body.step for e in runner.store.events(job.job_id) if e.type == "progress"]
    assert steps == sorted(set(steps)) and steps[-1] == 10


async def test_comfyui_restarted_mid_run_fails_the_attempt_as_executor_lost(make_runner, comfy):
    comfy.step_seconds = 0.1
    async with make_runner() as runner:
        job = await runner.submit(
            req(steps=50),
        )
        await until(lambda: (runner.store.get(job.job_id).step or 0) >= 2)
        await comfy.restart()
        await until(lambda: runner.store.get(job.job_id).attempt_errors or runner.store.get(job.job_id).terminal)
        state = runner.store.get(job.job_id)
        first = state.attempt_errors[0] if state.attempt_errors else state.error
        assert first.kind == "executor_lost" and "neither ComfyUI's queue nor its history" in first.message
        # The default policy retries executor_lost once: the second attempt runs on the restarted server.
        comfy.step_seconds = 0.01
        state = await ended(runner, job.job_id)
    assert state.status == "done" and state.attempt == 2


async def test_an_out_of_memory_error_is_classified_oom(make_runner, comfy):
    comfy.oom_at_step = 2
    async with make_runner() as runner:
        job = await runner.submit(req(steps=6))
        state = await ended(runner, job.job_id)
    assert state.status == "failed" and state.error.kind == "oom"
    assert "CUDA out of memory" in state.error.message and "SamplerCustomAdvanced node 10" in state.error.message


async def test_another_exception_is_an_executor_error_with_its_type(make_runner, comfy):
    comfy.error_at_step = 1
    async with make_runner() as runner:
        job = await runner.submit(req())
        state = await ended(runner, job.job_id)
    assert state.error.kind == "executor_error" and "RuntimeError" in state.error.message


async def test_a_graph_comfyui_refuses_fails_as_invalid_naming_the_node(make_runner, comfy):
    comfy.model_files = {"diffusion_models": ["some_other_model.safetensors"]}
    async with make_runner() as runner:
        job = await runner.submit(req())
        state = await ended(runner, job.job_id)
    assert state.status == "failed" and state.error.kind == "invalid"
    assert "node 1 (UNETLoader) input 'unet_name'" in state.error.message


async def test_cancel_of_a_pending_prompt_deletes_it_from_the_queue(make_runner, comfy):
    comfy.step_seconds = 0.1
    async with make_runner() as runner:
        await until(lambda: runner.executor.capabilities().ready)
        other = await foreign_prompt(comfy, steps=60)  # someone else's prompt keeps ComfyUI busy
        job = await runner.submit(req(steps=5, seed=2))
        await until(lambda: len(comfy.queue_pending) == 1)
        ref = runner.store.get(job.job_id).executor_ref
        await runner.cancel(job.job_id)
        state = await ended(runner, job.job_id)
        assert state.status == "cancelled"
        assert ("POST", "/queue", {"delete": [ref]}) in comfy.received
        assert ref not in comfy.history and comfy.running_prompt_id == other, "deleted, never run; the other runs on"


async def test_with_four_slots_comfyui_holds_one_prompt_of_h3core_at_a_time_the_rest_wait_queued(make_runner, comfy):
    comfy.step_seconds = 0.02
    async with make_runner(slots=4) as runner:
        assert runner.slot_count() == 1, "ComfyUI's concurrency (1) bounds the runner's 4 slots"
        jobs = [await runner.submit(req(steps=5, seed=i), priority=i) for i in range(4)]
        seen = []
        with anyio.fail_after(30):
            while not all(runner.store.get(j.job_id).terminal for j in jobs):
                seen.append(
                    (len(comfy.queue_running) + len(comfy.queue_pending), [runner.store.get(j.job_id).status for j in jobs])
                )
                await anyio.sleep(0.005)
    assert max(n for n, _ in seen) == 1, "never more than one of h3core's prompts in ComfyUI's queue"
    assert max(statuses.count("running") for _, statuses in seen) == 1
    assert all(runner.store.get(j.job_id).status == "done" for j in jobs)
    started = sorted(jobs, key=lambda j: runner.store.get(j.job_id).started_at)
    assert [j.priority for j in started] == [3, 2, 1, 0], "h3core's priorities decide the order"


async def test_cancel_of_a_running_prompt_interrupts_that_prompt_only(make_runner, comfy):
    comfy.step_seconds = 0.1
    async with make_runner() as runner:
        job = await runner.submit(req(steps=60))
        await until(lambda: (runner.store.get(job.job_id).step or 0) >= 2)
        ref = runner.store.get(job.job_id).executor_ref
        await runner.cancel(job.job_id)
        state = await ended(runner, job.job_id)
    assert state.status == "cancelled"
    interrupts = [body for method, path, body in comfy.received if path == "/interrupt"]
    assert interrupts and all(i == {"prompt_id": ref} for i in interrupts), "that prompt only: never the global interrupt"
    assert comfy.history[ref]["status"]["messages"][-1][0] == "execution_interrupted"
    steps_after = [
        e
        for e in runner.store.events(job.job_id)
        if e.type == "progress" and e.seq > next(x.seq for x in runner.store.events(job.job_id) if x.type == "cancel_requested")
    ]
    assert len(steps_after) <= 2


async def test_a_cancel_comfyui_does_not_honour_in_time_fails_the_job_stop_unconfirmed_not_cancelled(make_runner, comfy):
    comfy.step_seconds, comfy.sampler_checks_interrupt = 0.1, False  # the interrupt lands only after the sampler
    async with make_runner(comfyui={"stop_wait_s": 0.5}) as runner:
        job = await runner.submit(req(steps=60))
        await until(lambda: (runner.store.get(job.job_id).step or 0) >= 2)
        await runner.cancel(job.job_id)
        state = await ended(runner, job.job_id)
        assert state.status == "failed" and state.error.kind == "stop_unconfirmed"
        assert state.error.message.startswith(f"cancelled by request, but ComfyUI may still run prompt {state.executor_ref}")
        assert comfy.running_prompt_id == state.executor_ref, "it was indeed still running"
        await comfy.wait_for(lambda: state.executor_ref in comfy.history, 15)  # ends at the sampler's end


async def test_keyframes_are_uploaded_and_bound(make_runner, comfy, tmp_path):
    async with make_runner() as runner:

        async def chunks():
            yield png_path(tmp_path).read_bytes()

        upload = await runner.uploads.put("image/png", chunks())
        job = await runner.submit(req(mode="fl2va", keyframes={"first": upload.id}))
        state = await ended(runner, job.job_id)
    assert state.status == "done", state.error
    graph = comfy.history[state.executor_ref]["prompt"][2]
    assert graph["20"]["inputs"]["image"] == f"h3-{upload.id}" and "last_frame" not in graph["5"]["inputs"]
    assert any(u["name"] == f"h3-{upload.id}" for u in comfy.uploads)


async def test_raylight_progress_comes_from_the_log_trusting_only_the_requests_steps(make_runner, comfy, tmp_path):
    comfy.send_progress = False  # sampling in Ray workers: nothing on the socket
    comfy.log_progress = True
    from h3core.executors.comfyui.templates import builtin_templates

    async with make_runner() as runner:
        runner.executor.settings = runner.executor.settings.__class__(
            **{**runner.executor.settings.__dict__, "topology": "raylight"}
        )
        comfy.step_seconds = 0.05
        job = await runner.submit(req(steps=12))
        state = await ended(runner, job.job_id)
    assert state.status == "done", state.error
    assert "raylight" in builtin_templates()[runner.store.events(job.job_id)[2].body.info["template"]].name
    steps = [e.body.step for e in runner.store.events(job.job_id) if e.type == "progress"]
    assert steps and steps[-1] == 12 and all(0 < s <= 12 for s in steps) and len(steps) > 2


async def test_a_prompt_whose_sampler_reports_no_progress_gets_none_made_up_from_its_history(make_runner, comfy):
    comfy.send_progress = False  # nothing on the socket, and no log to read
    async with make_runner() as runner:
        job = await runner.submit(req(steps=6))
        state = await ended(runner, job.job_id)
    assert state.status == "done", state.error
    assert [e.body for e in runner.store.events(job.job_id) if e.type == "progress"] == []


async def test_comfyui_unreachable_mid_job_fails_the_attempt_within_the_bound_and_the_retry_waits_for_it(
    make_runner, comfy, caplog
):
    caplog.set_level(logging.INFO, logger="h3core")
    comfy.step_seconds = 0.1
    async with make_runner() as runner:
        await until(lambda: runner.executor.capabilities().ready)
        job = await runner.submit(req(steps=10))
        await until(lambda: (runner.store.get(job.job_id).step or 0) >= 1)
        await comfy.pause_listening()
        with anyio.fail_after(15):
            while not (runner.store.get(job.job_id).attempt_errors or runner.store.get(job.job_id).terminal):
                await anyio.sleep(0.05)
        state = runner.store.get(job.job_id)
        err = state.attempt_errors[0] if state.attempt_errors else state.error
        assert err.kind == "executor_lost" and "unreachable" in err.message
        assert state.status == "queued", "the retry waits for ComfyUI instead of spending its attempt"
        await comfy.resume_listening()
        state = await ended(runner, job.job_id)
    assert state.status == "done" and state.attempt == 2
    unreachable = [r for r in caplog.records if r.getMessage().startswith("ComfyUI unreachable while following")]
    assert [(r.levelname, r.job_id, r.attempt) for r in unreachable] == [("WARNING", job.job_id, 1)], "once, not per poll"
    lost = [r for r in caplog.records if r.name == "h3core.runner" and getattr(r, "event", None) == "attempt_failed"]
    assert [(r.job_id, r.kind) for r in lost] == [(job.job_id, "executor_lost")]
    drops = [r.getMessage() for r in caplog.records if r.name == "h3core.executors.comfyui" and r.levelname == "WARNING"]
    assert any(m.startswith("ComfyUI websocket dropped") for m in drops)


async def test_raylights_start_up_bar_is_not_taken_for_sampling_progress(make_runner, comfy):
    # RayInitializer prints a "Loading workers: 4/4" bar; with steps == GPUs it has the right total.
    comfy.send_progress, comfy.log_progress, comfy.gpus, comfy.step_seconds = False, True, 4, 0.3
    comfy.node_seconds = 0.2  # so the bar comes after the executor starts reading the log
    async with make_runner() as runner:
        runner.executor.settings = runner.executor.settings.__class__(
            **{**runner.executor.settings.__dict__, "topology": "raylight"}
        )
        job = await runner.submit(req(steps=4))
        state = await ended(runner, job.job_id)
    assert state.status == "done", state.error
    steps = [e.body.step for e in runner.store.events(job.job_id) if e.type == "progress"]
    assert len(steps) >= 3 and steps[0] < 4, steps


async def test_a_mode_whose_template_needs_a_node_the_server_lacks_is_not_served_and_the_others_are(make_runner, comfy):
    from h3core.executors.comfyui.templates import builtin_templates

    async with make_runner() as runner:
        await until(lambda: runner.executor.capabilities().runnable_modes == ("t2va", "fl2va", "ref2va"))
        broken = builtin_templates()["minimax-h3-t2va-single-gpu"]
        graph = {**broken.graph, "8": {"class_type": "KSamplerSelectPro", "inputs": {"sampler_name": "euler"}}}
        runner.executor.templates = {**runner.executor.templates, broken.name: broken.model_copy(update={"graph": graph})}
        await comfy.restart()  # the socket reconnects: the nodes are checked again
        await until(lambda: not runner.executor.capabilities().mode("t2va").served)
        caps = runner.executor.capabilities()
        assert "node class KSamplerSelectPro is not installed on the server" in caps.mode("t2va").reason
        await until(lambda: runner.executor.capabilities().runnable_modes == ("fl2va", "ref2va"))
        with pytest.raises(Refused) as refused:
            await runner.submit(req(steps=4))
        assert refused.value.decision.reason == "mode_unavailable" and "KSamplerSelectPro" in refused.value.decision.detail


async def test_with_comfyui_down_a_job_waits_queued_without_using_an_attempt_and_runs_when_it_is_back(make_runner, comfy):
    async with make_runner() as runner:
        await until(lambda: runner.executor.capabilities().ready)
        await comfy.go_down()
        await until(lambda: not runner.executor.capabilities().ready)
        job = await runner.submit(req(steps=4))
        assert "no connection to ComfyUI" in runner.executor.capabilities().waiting_reason("t2va")
        await comfy.come_up()
        state = await ended(runner, job.job_id)
    assert state.status == "done" and state.attempt == 1, state
    assert types(runner, job.job_id)[:3] == ["submitted", "admitted", "running"]


async def test_a_comfyui_lacking_the_fl2va_nodes_still_serves_t2va_and_refuses_fl2va_at_submit(make_runner, comfy):
    comfy.missing_nodes = {"LoadImage"}  # the keyframe and reference graphs load images; text to video does not
    async with make_runner() as runner:
        await until(lambda: runner.executor.capabilities().runnable_modes == ("t2va",))
        caps = runner.executor.capabilities()
        assert not caps.mode("fl2va").served and "node class LoadImage is not installed" in caps.mode("fl2va").reason
        with pytest.raises(Refused) as refused:
            await runner.submit(req(mode="fl2va", keyframes={"first": "k1"}))
        job = await runner.submit(req(steps=4))
        state = await ended(runner, job.job_id)
    assert refused.value.decision.reason == "mode_unavailable" and refused.value.decision.ceiling.max_frames == 0
    assert state.status == "done"
    assert runner.store.job_ids() == [job.job_id]


# -- a stop of h3core: the prompt runs on, the next start resumes it ------------------------------


async def stopped_mid_job(make_runner, comfy, store, *, steps: int, at_step: int, comfyui: dict | None = None) -> str:
    """Run a job until it reached `at_step`, then stop the runner (as SIGTERM does); its job id."""
    comfy.step_seconds = 0.05
    async with make_runner(store, comfyui=comfyui) as runner:
        job = await runner.submit(req(steps=steps))
        await until(lambda: (store.get(job.job_id).step or 0) >= at_step)
    return job.job_id


async def test_a_stop_of_h3core_leaves_its_prompt_running_and_the_next_start_resumes_it_on_attempt_1(make_runner, comfy, store):
    job_id = await stopped_mid_job(make_runner, comfy, store, steps=40, at_step=3)
    stopped = store.get(job_id)
    assert stopped.status == "running", "a detached attempt is not ended"
    assert store.events(job_id)[-1].type == "detached"
    assert comfy.running_prompt_id == stopped.executor_ref, "the prompt runs on in ComfyUI"
    assert not [path for method, path, _ in comfy.received if method == "POST" and path in ("/interrupt", "/queue")]

    async with make_runner(store) as runner:
        state = await ended(runner, job_id)
    assert state.status == "done" and state.attempt == 1, state.error
    events = store.events(job_id)
    resumed = [e for e in events if e.type == "resumed"]
    assert len(resumed) == 1 and resumed[0].body.executor_ref == stopped.executor_ref and resumed[0].body.attempt == 1
    assert resumed[0].seq == stopped.last_seq + 1 and resumed[0].body.after_s >= 0
    steps = [e.body.step for e in events if e.type == "progress"]
    assert steps == sorted(set(steps)) and steps[-1] == 40
    assert list(comfy.history) == [stopped.executor_ref], "resumed, not run again"


async def test_a_stop_of_h3core_before_the_prompt_is_sent_hands_the_attempt_back_instead_of_leaving_it(
    make_runner, comfy, store, tmp_path
):
    """Nothing runs on in ComfyUI (its keyframe was still being uploaded; a long video between two
    segments alike): the next start runs it, not looks for a prompt that was never sent."""
    async with make_runner(store) as runner:

        async def chunks():
            yield png_path(tmp_path).read_bytes()

        upload = await runner.uploads.put("image/png", chunks())
        comfy.http_delay = 1.0  # the keyframe's upload is under way when h3core stops
        job = await runner.submit(req(mode="fl2va", keyframes={"first": upload.id}))
        await until(lambda: store.get(job.job_id).status == "running")
    assert types(runner, job.job_id)[-1] == "released" and not comfy.history and not comfy.queue_pending
    comfy.http_delay = 0.0
    async with make_runner(store) as runner:
        state = await ended(runner, job.job_id)
    assert state.status == "done" and "resumed" not in types(runner, job.job_id), state.error


async def test_with_on_stop_interrupt_a_stop_interrupts_the_prompt_and_hands_the_attempt_back(make_runner, comfy, store):
    job_id = await stopped_mid_job(make_runner, comfy, store, steps=40, at_step=3, comfyui={"on_stop": "interrupt"})
    state = store.get(job_id)
    ref = store.events(job_id)[2].body.executor_ref
    # h3core's own stop: handed back (run again at the next start), no failure, no checkpoint (ComfyUI owns its loop).
    assert (state.status, state.released, state.attempt_errors, state.checkpoints) == ("queued", 1, (), ())
    assert ("POST", "/interrupt", {"prompt_id": ref}) in comfy.received
    assert comfy.history[ref]["status"]["messages"][-1][0] == "execution_interrupted"


async def test_a_cancel_stored_while_h3core_is_down_is_honoured_by_the_resumed_attempt(make_runner, comfy, store):
    job_id = await stopped_mid_job(make_runner, comfy, store, steps=200, at_step=2)
    before = store.get(job_id)
    store.append(job_id, [CancelRequested(reason="asked while h3core was down")], expected_seq=before.last_seq)
    async with make_runner(store) as runner:
        state = await ended(runner, job_id)
    assert state.status == "cancelled"
    assert types(runner, job_id)[-3:] == ["cancel_requested", "resumed", "cancelled"]
    assert comfy.history[before.executor_ref]["status"]["messages"][-1][0] == "execution_interrupted"
    assert comfy.running_prompt_id is None


async def test_a_prompt_gone_when_h3core_comes_back_fails_the_resumed_attempt_executor_lost_and_the_retry_runs(
    make_runner, comfy, store
):
    job_id = await stopped_mid_job(make_runner, comfy, store, steps=100, at_step=2)
    await comfy.restart()  # ComfyUI restarted while h3core was down: the prompt and its history are gone
    comfy.step_seconds = 0.01
    async with make_runner(store) as runner:
        state = await ended(runner, job_id)
    assert state.status == "done" and state.attempt == 2
    assert state.attempt_errors[0].kind == "executor_lost"
    kinds = types(runner, job_id)
    assert kinds[kinds.index("resumed") :][:3] == ["resumed", "attempt_failed", "running"] and kinds.count("resumed") == 1


async def test_resumed_after_counts_from_when_h3core_stopped_not_from_the_jobs_last_event(make_runner, comfy, store):
    comfy.step_seconds = 0.05
    async with make_runner(store) as runner:
        job = await runner.submit(req(steps=40))
        await until(lambda: (store.get(job.job_id).step or 0) >= 3)
        comfy.step_seconds = 3.0  # the prompt goes quiet (a long step): no event for a while before the stop
        await until(lambda: (datetime.now(UTC) - store.get(job.job_id).updated_at).total_seconds() >= 1.0)
    stopped = store.events(job.job_id)
    assert stopped[-1].type == "detached" and stopped[-1].body.executor_ref == stopped[2].body.executor_ref
    progress = [e for e in stopped if e.type == "progress"][-1]
    comfy.step_seconds = 0.01
    async with make_runner(store) as runner:
        state = await ended(runner, job.job_id)
    assert state.status == "done" and state.attempt == 1
    resumed = next(e for e in store.events(job.job_id) if e.type == "resumed")
    unfollowed = (resumed.at - stopped[-1].at).total_seconds()
    assert 0 <= resumed.body.after_s <= unfollowed + 0.001, "from the stop (detached) to the resume"
    assert resumed.body.after_s < (resumed.at - progress.at).total_seconds() - 0.9, "not from the job's last step"


async def test_after_a_crash_among_nodes_resumed_counts_from_this_nodes_last_beat_not_other_nodes_writes(make_runner, comfy):
    """On a store shared by runner nodes, the others write on while a crashed node is down: its
    resumed attempt counts from its own last heartbeat, not from another node's newest write."""
    from h3core.adapters.store.memory_leases import MemoryNodeLeases, MemoryNodesEventStore
    from h3core.adapters.store.nodes import NodeInfo
    from h3core.domain.events import Admitted, Running, Submitted

    shared = MemoryNodesEventStore(MemoryNodeLeases("a"))
    import os
    import socket

    # The crashed process as this one (a node restarted in place takes its id back at once).
    info = {"host": socket.gethostname(), "pid": os.getpid(), "role": "runner", "slots": 1, "executor": "comfyui"}
    shared.leases.join(NodeInfo(node_id="a", modes=["t2va"], **info), lease_s=30)
    shared.append("j", [Submitted(request=req(steps=4)), Admitted()], expected_seq=0)
    shared.append("j", [Running(attempt=1, executor="comfyui", executor_ref="gone")], expected_seq=2)
    crashed = shared.leases.nodes()[0].beat_at  # its last beat: the crash follows
    other = shared.as_node("b")
    other.leases.join(NodeInfo(node_id="b", modes=["t2va"], **info), lease_s=30)
    for i in range(3):  # node b runs on, writing, while a is down
        await anyio.sleep(0.5)
        job = f"b{i}"
        other.append(job, [Submitted(request=req()), Admitted(), Running(attempt=1, executor="fake")], expected_seq=0)
    async with make_runner(shared) as runner:
        state = await ended(runner, "j")
    resumed = next(e for e in shared.events("j") if e.type == "resumed")
    assert state.status == "done" and state.attempt == 2, "the prompt was gone: the retry made the video"
    assert resumed.body.after_s >= 1.5 - 0.01, "at least the time node b wrote on"
    assert resumed.body.after_s <= (resumed.at - crashed).total_seconds() + 0.001, "from node a's last beat"


async def test_a_prompt_slow_to_stop_is_interrupted_once_then_again_only_on_a_backoff(make_runner, comfy):
    from h3core.executors.comfyui.executor import INTERRUPT_AGAIN

    comfy.step_seconds, comfy.sampler_checks_interrupt = 0.1, False  # the interrupt lands only after the sampler
    async with make_runner() as runner:
        job = await runner.submit(req(steps=25))
        await until(lambda: (runner.store.get(job.job_id).step or 0) >= 2)
        await runner.cancel(job.job_id)
        state = await ended(runner, job.job_id)
    assert state.status == "cancelled"
    at = [t for t, prompt in comfy.interrupts if prompt == state.executor_ref]
    assert len(at) >= 2, "sent again while the prompt ran on"
    assert len(at) == len(comfy.interrupts), "never another prompt's, never the global one"
    for i in range(1, len(at)):  # the old executor sent one every 0.1 s (17 per prompt)
        assert at[i] - at[i - 1] >= INTERRUPT_AGAIN.pause(i) - 0.05, at


async def test_a_cancel_that_loses_the_race_to_a_finishing_prompt_ends_done_with_its_video_and_says_too_late(make_runner, comfy):
    """ComfyUI checks for an interrupt before each node: one that lands while the output node
    writes the video is never seen, and the prompt succeeds as it is being stopped."""
    comfy.step_seconds = 0.02
    async with make_runner() as runner:
        job = await runner.submit(req(steps=4))
        output = builtin_templates()["minimax-h3-t2va-single-gpu"].output
        await until(lambda: comfy.current_node == "10")  # sampling: from here every node takes a while
        comfy.node_seconds = 0.5
        await until(lambda: comfy.current_node == output)
        ref = runner.store.get(job.job_id).executor_ref
        await runner.cancel(job.job_id)
        state = await ended(runner, job.job_id)
    assert comfy.history[ref]["status"]["status_str"] == "success", "ComfyUI finished it"
    assert ("POST", "/interrupt", {"prompt_id": ref}) in comfy.received, "it was being stopped"
    assert state.status == "done" and state.artifact is not None, state.error
    assert runner.executor.artifacts.resolve(state.artifact.path).stat().st_size == state.artifact.bytes
    events = runner.store.events(job.job_id)
    assert [e.type for e in events][-2:] == ["cancel_requested", "done"] and events[-1].body.cancel_too_late


# -- a stop ComfyUI confirms only after the grace: the job keeps its slot and ends as the prompt did --


T2VA = builtin_templates()["minimax-h3-t2va-single-gpu"]


def interrupts_of(comfy, ref: str) -> int:
    return sum(1 for _, prompt in comfy.interrupts if prompt == ref)


async def watch_overlap(runner, comfy, ref: str, other: str, seen: list[bool]) -> None:
    """While ComfyUI runs prompt `ref`: whether job `other` had started, in h3core or in ComfyUI's queue."""
    while True:
        if comfy.running_prompt_id == ref:
            seen.append(runner.store.get(other).status != "queued" or bool(comfy.queue_pending))
        await anyio.sleep(0.005)


async def stopped_late(make_runner, comfy, stop: str, hold: str):
    """Run a job until ComfyUI holds it at node `hold` (its interrupt check passed), stop it (a cancel,
    or its deadline), and follow it past the runner's grace while another job waits; then let the
    node run. The runner, the two jobs' ids, the stopped prompt's id, and whether the other job had
    started while ComfyUI ran that prompt (each look)."""
    comfy.hold_node = hold
    config = {"attempt_deadline_s": 3.0} if stop == "deadline" else {}
    seen: list[bool] = []
    async with make_runner(comfyui={"stop_wait_s": 60.0}, cancel_grace_s=0.2, **config) as runner:
        try:
            job = await runner.submit(req(steps=4))
            await until(lambda: comfy.current_node == hold)
            nxt = await runner.submit(req(steps=4, seed=2))  # the slot's next job (ComfyUI's concurrency is 1)
            ref = runner.store.get(job.job_id).executor_ref
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_overlap, runner, comfy, ref, nxt.job_id, seen)
                if stop == "cancel":
                    await runner.cancel(job.job_id)
                # Interrupted three times: at least 1.5 s after the stop began, far past the grace (0.2 s).
                await until(lambda: interrupts_of(comfy, ref) >= 3)
                assert runner.store.get(job.job_id).status == "running", "not ended at the grace: its prompt runs on"
                comfy.hold_node = None
                await ended(runner, job.job_id)
                await ended(runner, nxt.job_id)
                tg.cancel_scope.cancel()
        finally:
            comfy.hold_node = None  # a failed assertion must not leave the runner's stop following the prompt
    assert seen and not any(seen), "no other job started while ComfyUI ran the stopped prompt"
    return runner, job.job_id, nxt.job_id, ref


@pytest.mark.parametrize("stop", ["cancel", "deadline"])
async def test_a_stopped_prompt_that_succeeds_after_the_grace_keeps_its_video_and_its_slot_until_then(make_runner, comfy, stop):
    """ComfyUI notices an interrupt only before a node (or at a sampler's steps): one sent while the
    output node writes the video is never seen, however long that takes. The executor follows the
    prompt past the runner's grace, the job keeping its slot, and the video it makes is kept."""
    runner, job_id, nxt_id, ref = await stopped_late(make_runner, comfy, stop, hold=T2VA.output)
    assert comfy.history[ref]["status"]["status_str"] == "success", "ComfyUI finished it"
    state = runner.store.get(job_id)
    assert state.status == "done" and state.artifact is not None, state.error
    path = runner.executor.artifacts.resolve(state.artifact.path)
    assert path.stat().st_size == state.artifact.bytes
    with av.open(str(path)) as c:
        assert c.streams.video
    done = runner.store.events(job_id)[-1]
    assert done.type == "done" and done.body.cancel_too_late == (stop == "cancel")
    assert runner.store.get(nxt_id).status == "done"


@pytest.mark.parametrize("stop", ["cancel", "deadline"])
async def test_a_stopped_prompt_that_notices_the_interrupt_after_the_grace_ends_the_job_as_the_stop_asked(
    make_runner, comfy, stop
):
    """Held before its sampler's first step, the prompt notices the interrupt only once it samples:
    the stop is confirmed after the grace, and the job ends as the stop asked, not `stop_unconfirmed`."""
    runner, job_id, nxt_id, ref = await stopped_late(make_runner, comfy, stop, hold=T2VA.sampler)
    assert comfy.history[ref]["status"]["messages"][-1][0] == "execution_interrupted"
    state = runner.store.get(job_id)
    if stop == "cancel":
        assert state.status == "cancelled", state.error
    else:
        assert state.status == "failed" and state.error.kind == "deadline", state.error
    assert state.artifact is None
    assert runner.store.get(nxt_id).status == "done"


async def test_a_stopped_prompt_still_running_past_the_stop_wait_fails_the_job_stop_unconfirmed_and_frees_its_slot(
    make_runner, comfy
):
    comfy.hold_node = T2VA.output
    async with make_runner(comfyui={"stop_wait_s": 1.0}, cancel_grace_s=5.0) as runner:
        try:
            job = await runner.submit(req(steps=4))
            await until(lambda: comfy.current_node == T2VA.output)
            nxt = await runner.submit(req(steps=4, seed=2))
            ref = runner.store.get(job.job_id).executor_ref
            await runner.cancel(job.job_id)
            state = await ended(runner, job.job_id)
            assert state.status == "failed" and state.error.kind == "stop_unconfirmed"
            assert state.error.message.startswith(
                f"cancelled by request, but ComfyUI may still run prompt {ref}: it was still running after 1s"
            ), "the executor's word, within the runner's bound"
            assert comfy.running_prompt_id == ref, "it was indeed still running"
            # The slot is free: the next job's prompt is sent, and waits in ComfyUI's queue behind it.
            await until(lambda: [item[1] for item in comfy.queue_pending] == [runner.store.get(nxt.job_id).executor_ref])
        finally:
            comfy.hold_node = None
        assert (await ended(runner, nxt.job_id)).status == "done"


async def test_a_graph_that_counts_no_steps_and_makes_the_frames_asked_reports_no_progress_and_no_snap(make_runner, comfy):
    async with make_runner(comfyui={"templates": {"t2va": "core-nodes-t2va"}}) as runner:
        await until(lambda: runner.executor.capabilities().ready)
        job = await runner.submit(req(steps=30, frames=48))
        state = await ended(runner, job.job_id)
    assert state.status == "done", state.error
    assert types(runner, job.job_id) == ["submitted", "admitted", "running", "done"], "no made-up step 30/30"
    assert state.step is None
    assert job.warnings == () and state.artifact.frames == 48, "48 asked, 48 made: nothing snapped to 56"


async def test_a_job_sent_to_a_comfyui_gone_down_unnoticed_is_not_started_and_keeps_its_attempts(make_runner, comfy):
    """ComfyUI went away just as the job started, before h3core noticed: its prompt could not be
    sent. The attempt ends at once (`not_started`, costing the job no attempt), the job waits
    queued while ComfyUI is down, and runs when it is back."""
    import httpx

    from h3core.executors.comfyui.client import ComfyClient

    class RefusesPrompts(httpx.AsyncHTTPTransport):
        refusing, refused = True, 0

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if self.refusing and request.method == "POST" and request.url.path == "/prompt":
                self.refused += 1
                raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
            return await super().handle_async_request(request)

    async with make_runner(retry=RetryPolicy(max_attempts=1, retry_on=())) as runner:
        await until(lambda: runner.executor.capabilities().ready)
        transport = RefusesPrompts()
        old, runner.executor.client = runner.executor.client, ComfyClient(comfy.url, transport=transport)
        await old.aclose()
        job = await runner.submit(req(steps=4))
        await until(lambda: transport.refused >= 1)  # refused while its socket still looked up
        await comfy.go_down()  # ...and now h3core sees ComfyUI down
        await until(lambda: runner.store.get(job.job_id).status == "queued")
        waiting = runner.store.get(job.job_id)
        assert [e.kind for e in waiting.attempt_errors] == ["not_started"] and waiting.attempt == 1
        transport.refusing = False
        await comfy.come_up()
        state = await ended(runner, job.job_id)
    assert state.status == "done" and state.attempt == 2, state.error


# -- a long video as segments: a prompt each, fl2va from the frame the one before kept last -------


@pytest.fixture
def small_window(monkeypatch):
    """The server's MiniMax-H3 nodes take at most 48 frames a call: a 5 s video is three segments."""
    from h3core.testing.comfyui._registry import NODE_INFO

    for cls in ("MiniMaxH3ImageToVideo", "MiniMaxH3ReferenceToVideo"):
        monkeypatch.setitem(NODE_INFO[cls]["input"]["required"]["length"][1], "max", 48)


async def long_job(runner, **kw):
    await until(lambda: runner.executor.capabilities().ready and runner.executor.capabilities().window is not None)
    assert runner.executor.capabilities().window.max_frames == 48
    return await runner.submit(req(frames=120, steps=3, **kw))


def made_as_segments(runner, state, job_id: str) -> list[str]:
    """The job's video holds exactly the frames and the sound asked; its segments' prompt ids, in order."""
    assert state.status == "done", state.error
    assert state.plan is not None and len(state.plan.segments) == 3 == len(state.segments)
    with av.open(str(runner.executor.artifacts.resolve(state.artifact.path))) as c:
        frames = sum(1 for _ in c.decode(video=0))
    with av.open(str(runner.executor.artifacts.resolve(state.artifact.path))) as c:
        seconds = sum(f.samples for f in c.decode(audio=0)) / c.streams.audio[0].rate
    assert frames == 120 == state.artifact.frames and abs(seconds - 5.0) < 0.05
    return [prompt_id_for(job_id, state.attempt, i) for i in range(3)]


async def test_a_long_video_is_made_as_a_prompt_per_segment_each_continuing_from_the_last_frame(make_runner, comfy, small_window):
    async with make_runner(segments=True) as runner:
        job = await long_job(runner)
        state = await ended(runner, job.job_id)
    prompts = made_as_segments(runner, state, job.job_id)
    assert list(comfy.history) == prompts, "one prompt per segment, ours, each run once"
    graphs = [comfy.history[p]["prompt"][2] for p in prompts]
    assert [g["5"]["inputs"]["length"] for g in graphs] == [s.frames for s in state.plan.segments]
    assert "20" not in graphs[0], "the first segment is text to video"
    firsts = [g["20"]["inputs"]["image"] for g in graphs[1:]]
    assert len(set(firsts)) == 2 and all(f.startswith("h3-") for f in firsts), "fl2va from the frame kept last"
    assert "21" not in graphs[2], "no last keyframe was asked"
    assert not list((runner.executor.artifacts.root / job.job_id).glob("*.comfyui.*")), "ComfyUI's videos removed"


async def test_a_stop_of_h3core_in_the_second_segment_leaves_its_prompt_running_and_the_next_start_resumes_it(
    make_runner, comfy, store, small_window
):
    comfy.step_seconds = 0.1
    async with make_runner(store, segments=True) as runner:
        job = await long_job(runner, seed=7)
        second = prompt_id_for(job.job_id, 1, 1)
        await until(lambda: comfy.running_prompt_id == second and (store.get(job.job_id).step or 0) >= 1)
    assert store.events(job.job_id)[-1].type == "detached" and comfy.running_prompt_id == second, "left running"
    comfy.step_seconds = 0.01
    async with make_runner(store, segments=True) as runner:
        state = await ended(runner, job.job_id)
    assert state.attempt == 1 and types(runner, job.job_id).count("resumed") == 1
    assert list(comfy.history) == made_as_segments(runner, state, job.job_id), "the second followed, not run again"


async def test_a_segment_comfyui_made_short_fails_the_job_naming_the_counts(make_runner, comfy, small_window):
    comfy.max_video_frames = 30  # SaveVideo writes fewer frames than the graph asked for
    async with make_runner(segments=True, retry=RetryPolicy(max_attempts=1)) as runner:
        job = await long_job(runner)
        state = await ended(runner, job.job_id)
    assert (state.status, state.error.kind) == ("failed", "executor_error")
    assert state.error.message == "segment 1 of 3: ComfyUI made 30 frames, 41 asked", state.error
    assert not list((runner.executor.artifacts.root / job.job_id).glob("*.mp4*")), "nothing of it left behind"
