"""A ComfyUI prompt is stopped for certain: the executor looks again until ComfyUI no longer holds
it, across the moment a pending prompt starts (the race a real server showed 1 time in 40), and
says so when it cannot confirm it. A refused graph is explained once, in ComfyUI's words."""

from __future__ import annotations

import json
import time

import anyio
import httpx
import pytest

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.executors.comfyui.client import ComfyClient
from h3core.executors.comfyui.executor import INTERRUPT_AGAIN, ComfyUIExecutor, ComfyUISettings, _rejection
from h3core.executors.comfyui.templates import builtin_templates

pytestmark = pytest.mark.anyio
URL = "http://comfyui.test"


class Server:
    """A scripted ComfyUI: `queue` is what GET /queue answers next; handlers may change it."""

    def __init__(self, prompt: str, where: str, *, starts_when_deleted: bool = False, ignores_interrupts: bool = False) -> None:
        self.prompt, self.where = prompt, where  # "pending", "running" or "gone"
        self.starts_when_deleted = starts_when_deleted
        self.ignores_interrupts = ignores_interrupts
        self.calls: list[str] = []
        self.interrupted_at: list[float] = []  # time.monotonic() of each interrupt

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append(f"{request.method} {request.url.path}" + (f" {body}" if body else ""))
        if request.url.path == "/interrupt":
            self.interrupted_at.append(time.monotonic())
        if request.url.path == "/queue" and request.method == "GET":
            item = [0, self.prompt, {}, {}, []]
            return httpx.Response(
                200,
                json={
                    "queue_running": [item] if self.where == "running" else [],
                    "queue_pending": [item] if self.where == "pending" else [],
                },
            )
        if request.url.path == "/queue":  # the delete: too late if the worker took the prompt meanwhile
            self.where = "running" if self.starts_when_deleted else "gone"
        elif request.url.path == "/interrupt" and body == {"prompt_id": self.prompt} and not self.ignores_interrupts:
            self.where = "gone"
        return httpx.Response(200)


def executor(tmp_path, server: Server, stop_wait_s: float = 5.0) -> ComfyUIExecutor:
    settings = ComfyUISettings(url=URL, client_id="t", stop_wait_s=stop_wait_s)
    client = ComfyClient(URL, transport=httpx.MockTransport(server))
    return ComfyUIExecutor(
        settings, builtin_templates(), LocalArtifactStore(tmp_path / "a"), lambda u: tmp_path / u, client=client
    )


async def test_a_pending_prompt_that_starts_as_it_is_deleted_is_interrupted_by_id_before_the_stop_is_confirmed(tmp_path):
    server = Server("p1", "pending", starts_when_deleted=True)
    assert await executor(tmp_path, server)._stop("p1") is None
    assert server.calls == [
        "GET /queue",
        "POST /queue {'delete': ['p1']}",  # deleted while pending... but it had started
        "GET /queue",
        "POST /interrupt {'prompt_id': 'p1'}",  # looked again: running, so interrupted by id
        "GET /queue",  # in neither queue: ComfyUI no longer runs it
    ]


async def test_a_pending_prompt_deleted_in_time_is_confirmed_gone_without_an_interrupt(tmp_path):
    server = Server("p1", "pending")
    assert await executor(tmp_path, server)._stop("p1") is None
    assert server.calls == ["GET /queue", "POST /queue {'delete': ['p1']}", "GET /queue"]


async def test_a_prompt_that_keeps_running_is_reported_not_stopped_once_the_wait_is_over(tmp_path):
    server = Server("p1", "running", ignores_interrupts=True)
    with anyio.fail_after(10):
        why = await executor(tmp_path, server, stop_wait_s=2.0)._stop("p1")
    sent = server.calls.count("POST /interrupt {'prompt_id': 'p1'}")
    assert why == f"it was still running after 2s (interrupted by id {sent}x)"
    assert sent >= 2, "interrupted again while it ran"
    assert not [c for c in server.calls if c.startswith("POST /interrupt") and "p1" not in c], "never the global interrupt"


async def test_a_running_prompt_is_interrupted_once_when_that_stops_it(tmp_path):
    server = Server("p1", "running")
    assert await executor(tmp_path, server)._stop("p1") is None
    assert server.calls == ["GET /queue", "POST /interrupt {'prompt_id': 'p1'}", "GET /queue"]


async def test_an_interrupt_is_sent_again_only_on_a_backoff_while_the_prompt_still_runs(tmp_path):
    """The queue is read often (the stop is confirmed as soon as the prompt leaves it), but the
    interrupt is repeated only after INTERRUPT_AGAIN's growing pauses: not at every read."""
    server = Server("p1", "running", ignores_interrupts=True)
    async with anyio.create_task_group() as tg:
        stopped: list[str | None] = []

        async def stop() -> None:
            stopped.append(await executor(tmp_path, server, stop_wait_s=30)._stop("p1"))

        tg.start_soon(stop)
        with anyio.fail_after(20):
            while len(server.interrupted_at) < 3:
                await anyio.sleep(0.01)
        server.where = "gone"  # the third interrupt took: the prompt ends
    assert stopped == [None]
    at = server.interrupted_at
    assert len(at) == 3, "none after the prompt left the queue"
    for i in (1, 2):  # each pause at least the backoff's (less the jitter of a request)
        assert at[i] - at[i - 1] >= INTERRUPT_AGAIN.pause(i) - 0.05, (i, at)
    reads = server.calls.count("GET /queue")
    assert reads > 2 * len(at), "the queue was read between the interrupts; only some reads sent one"


async def test_an_unreachable_comfyui_is_reported_not_stopped(tmp_path):
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    settings = ComfyUISettings(url=URL, client_id="t", stop_wait_s=0.3)
    client = ComfyClient(URL, transport=httpx.MockTransport(refuse))
    ex = ComfyUIExecutor(settings, builtin_templates(), LocalArtifactStore(tmp_path / "a"), lambda u: tmp_path / u, client=client)
    why = await ex._stop("p1")
    assert why is not None and why.startswith("ComfyUI did not answer for 0.3s") and "connection refused" in why


async def test_a_failing_attempt_stops_its_prompt_without_waiting_for_a_comfyui_that_does_not_answer(tmp_path):
    """After the attempt's own failure (ComfyUI unreachable past its bound) the stop is tried once:
    the failure is what is reported, and the runner's slot is not held for another outage."""
    tries = []

    def refuse(request: httpx.Request) -> httpx.Response:
        tries.append(request.url.path)
        raise httpx.ConnectError("connection refused")

    settings = ComfyUISettings(url=URL, client_id="t", stop_wait_s=60)
    client = ComfyClient(URL, transport=httpx.MockTransport(refuse))
    ex = ComfyUIExecutor(settings, builtin_templates(), LocalArtifactStore(tmp_path / "a"), lambda u: tmp_path / u, client=client)
    with anyio.fail_after(10):
        why = await ex._stop("p1", patience_s=0)
    assert why is not None and why.startswith("ComfyUI did not answer") and tries == ["/queue"]


async def test_a_long_stop_reads_the_queue_less_often_and_at_once_when_the_socket_says_the_prompt_ended(tmp_path, monkeypatch):
    """Past its first seconds a stop reads ComfyUI's queue every `poll_max_s` (a prompt may run on
    for minutes until a node checks the interrupt), but the socket's word that the prompt ended
    wakes it: the slot frees as soon as ComfyUI no longer holds the prompt."""
    monkeypatch.setattr("h3core.executors.comfyui.executor.STOP_FAST_S", 0.0)
    server = Server("p1", "running", ignores_interrupts=True)
    settings = ComfyUISettings(url=URL, client_id="t", stop_wait_s=600, poll_max_s=300)
    client = ComfyClient(URL, transport=httpx.MockTransport(server))
    ex = ComfyUIExecutor(settings, builtin_templates(), LocalArtifactStore(tmp_path / "a"), lambda u: tmp_path / u, client=client)
    stopped: list[str | None] = []

    async def stop() -> None:
        stopped.append(await ex._stop("p1"))

    with anyio.fail_after(10):  # far less than the 300 s between reads
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop)
            while "POST /interrupt {'prompt_id': 'p1'}" not in server.calls:
                await anyio.sleep(0.01)
            server.where = "gone"  # ComfyUI noticed the interrupt at its next node...
            ex.feed._dispatch({"type": "execution_interrupted", "data": {"prompt_id": "p1"}})  # ...and says so
    assert stopped == [None]
    assert server.calls == ["GET /queue", "POST /interrupt {'prompt_id': 'p1'}", "GET /queue"]


def test_a_refused_graph_names_the_node_input_and_limit_once():
    # Recorded from a real ComfyUI (PROTOCOL.md §2): details repeat the input's name.
    body = {
        "error": {
            "type": "prompt_outputs_failed_validation",
            "message": "Prompt outputs failed validation",
            "details": "",
            "extra_info": {},
        },
        "node_errors": {
            "1": {
                "errors": [
                    {
                        "type": "value_bigger_than_max",
                        "message": "Value 99999999 bigger than max of 16777215",
                        "details": "color",
                        "extra_info": {
                            "input_name": "color",
                            "input_config": ["INT", {"min": 0, "max": 16777215}],
                            "received_value": 99999999,
                        },
                    }
                ],
                "dependent_outputs": ["7"],
                "class_type": "EmptyImage",
            }
        },
    }
    message = _rejection(body, builtin_templates()["core-nodes-t2va"])
    assert message == (
        "ComfyUI refused the core-nodes-t2va workflow: Prompt outputs failed validation; "
        "node 1 (EmptyImage) input 'color': Value 99999999 bigger than max of 16777215"
    )
    # Details that add something are kept.
    body["node_errors"]["1"]["errors"][0].update(
        details="upscale_method: 'bogus' not in [...]", extra_info={"input_name": "upscale_method"}
    )
    assert message != (other := _rejection(body, builtin_templates()["core-nodes-t2va"])) and other.endswith(
        "(upscale_method: 'bogus' not in [...])"
    )
