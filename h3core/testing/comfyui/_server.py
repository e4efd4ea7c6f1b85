"""`FakeComfyUI`: one fake ComfyUI process, composed of its parts, and the lifetime a test drives.

A process's memory (queue and history, the worker's caches, the websocket sessions) is made anew
at each (re)start; the folders under `root`, the log and the port outlive it, as on a real machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from ._files import Files
from ._http import make_app
from ._log import ComfyLog
from ._queue import PromptQueue
from ._registry import object_info
from ._sockets import Sockets
from ._switches import Switches
from ._validation import PromptValidator, Verdict
from ._worker import Worker

T = TypeVar("T")


class FakeComfyUI(Switches):
    """One fake ComfyUI process serving `root` (input/, output/, temp/, comfyui.log) on 127.0.0.1.

    Knobs (plain attributes, changeable at any time, also while a prompt runs):
      step_seconds      time per sampler step (and per image of SaveImageWebsocket's progress bar)
      node_seconds      time per call of every other node (per list item when fed a list)
      hold_node         a node id: its call waits, past its interrupt check, for as long as this names it
                        (a node that notices no interrupt for as long as a test needs, then runs)
      send_progress     False: samplers send no per-step `progress`/`progress_state` (as on Raylight);
                        the node's start/finish `progress_state` is still sent
      sampler_checks_interrupt  None (default): a sampler notices an interrupt at its progress ticks only
                        when it sends them, otherwise at the next node boundary; True/False force it
      log_progress      tqdm lines per sampler step in comfyui.log (Raylight samplers: one
                        "(RayWorker pid=N) rank: ...| i/n [...]" line per GPU, with ANSI colours; others a
                        \\r-redrawn bar), and a "Loading workers: ...| g/g" bar at start-up and whenever
                        RayInitializer runs
      oom_at_step       the sampler fails at that step (steps before it are reported) with
                        torch.OutOfMemoryError "CUDA out of memory. Tried to allocate 2.00 GiB. ..."; stays set
      error_at_step     same with RuntimeError("boom")
      drop_sockets_at_step  close every websocket (server side) when a sampler reaches that step, once
                        (then it is reset to None); the prompt keeps running
      http_delay        seconds to sleep before answering any HTTP request (the websocket upgrade included)
      caching           False: nothing is cached between prompts (like --cache-none)
      model_files       {"diffusion_models"|"text_encoders"|"vae"|"checkpoints": [names]}: validate model
                        names against these; None (default) accepts any name
      missing_nodes     node classes the server lacks: left out of /object_info, refused in a prompt
      video_size, max_video_frames  what SaveVideo writes (64x64, at most 240 frames)
    For assertions: `history` (live dict), `queue_pending`, `queue_running`, `running_prompt_id`,
    `current_node`, `current_step`, `sockets`, `uploads`, `received` [(method, path?query, JSON or None)],
    `interrupts` [(time.monotonic() when received, prompt_id or None for the global one)].
    Lifetime: `start`/`stop` (or `async with`), `restart(down_for=0)`, `go_down`/`come_up` (a crash and
    a fresh process), `pause_listening`/`resume_listening` (unreachable, state and prompt kept).
    """

    def __init__(self, root: Path, *, gpus: int = 1) -> None:
        self.root = Path(root)
        super().__init__(gpus)  # the fault switches and knobs, with their defaults
        # -- for assertions
        self.received: list[tuple[str, str, Any]] = []  # (method, path with query, JSON body or None)
        self.interrupts: list[tuple[float, str | None]] = []  # (monotonic time, prompt id) of each POST /interrupt
        self.uploads: list[dict[str, Any]] = []  # what /upload/image answered, plus "path" and "bytes"
        # -- what outlives a process: its folders, its log and its port
        self._files = Files(self.root)
        self._log = ComfyLog(self.root / "comfyui.log")
        self._port = 0
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._reset_state()

    # -- public surface ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def ws_url(self, client_id: str | None = None) -> str:
        return f"ws://127.0.0.1:{self._port}/ws" + (f"?clientId={client_id}" if client_id else "")

    @property
    def listening(self) -> bool:
        return self._runner is not None

    @property
    def log_path(self) -> Path:
        return self.root / "comfyui.log"

    @property
    def history(self) -> dict[str, dict[str, Any]]:
        return self._queue.history

    @property
    def queue_pending(self) -> list[list[Any]]:
        """As GET /queue shows them (heap order)."""
        return self._queue.pending_view()

    @property
    def queue_running(self) -> list[list[Any]]:
        return self._queue.running_view()

    @property
    def running_prompt_id(self) -> str | None:
        run = self._worker.run
        return run.prompt_id if run else None

    @property
    def current_node(self) -> str | None:
        run = self._worker.run
        return run.node if run else None

    @property
    def current_step(self) -> int:
        """The sampler step last completed by the running prompt (0 if none)."""
        run = self._worker.run
        return run.step if run else 0

    @property
    def sockets(self) -> dict[str, web.WebSocketResponse]:
        return dict(self._sockets.by_sid)

    async def __aenter__(self) -> FakeComfyUI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._files.make()
        await self._boot()

    async def stop(self) -> None:
        await self._stop_listening()
        await self._kill()
        self._reset_state()

    async def restart(self, down_for: float = 0.0) -> None:
        """A ComfyUI process restart: sockets closed; queue, running prompt, history, caches and the
        `number` counter lost; files kept (temp/ is wiped, as ComfyUI does at start-up); same port."""
        await self.go_down()
        if down_for:
            await asyncio.sleep(down_for)
        await self.come_up()

    async def go_down(self) -> None:
        """The process died: the port is closed and everything in memory is gone."""
        await self._stop_listening()
        await self._kill()
        self._reset_state()

    async def come_up(self) -> None:
        """A fresh process on the same port (after `go_down`)."""
        await self._boot()

    async def pause_listening(self) -> None:
        """Unreachable (port closed, connections dropped) while the prompt keeps running; state kept."""
        await self._stop_listening()

    async def resume_listening(self) -> None:
        if self._runner is None:
            await self._listen()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not met in time")
            await asyncio.sleep(0.005)

    async def wait_idle(self, timeout: float = 10.0) -> None:
        await self.wait_for(lambda: not self._queue.pending and not self._queue.running, timeout)

    @contextlib.contextmanager
    def running_in_thread(self) -> Iterator[FakeComfyUI]:
        """Serve from a background thread with its own event loop (for synchronous tests)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fake-comfyui", daemon=True)
        thread.start()
        self._thread_loop = loop
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(30)
            yield self
        finally:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.stop(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
            self._thread_loop = None

    def call(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        """Run one of the coroutine methods on the server's thread (see `running_in_thread`)."""
        assert self._thread_loop is not None, "call() is for running_in_thread()"
        return asyncio.run_coroutine_threadsafe(coro, self._thread_loop).result(timeout)  # type: ignore[arg-type]

    # -- process lifetime --------------------------------------------------------------------------------

    def _reset_state(self) -> None:
        """A fresh process's memory: no queue, history, caches or sockets."""
        self._sockets = Sockets(queue_info=lambda: self._queue.info())
        self._queue = PromptQueue(changed=self._sockets.queue_updated)
        self._worker = Worker(self, self._queue, self._sockets, self._log, self._files, self._info)

    async def _boot(self) -> None:
        self._files.wipe_temp()
        self._tasks = [asyncio.create_task(self._worker.serve()), asyncio.create_task(self._sockets.publish())]
        await self._listen()
        self._log.line(f"Starting server\n\nTo see the GUI go to: {self.url}")
        if self.log_progress:
            self._log.workers_bar(self.gpus)

    async def _kill(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def _listen(self) -> None:
        runner = web.AppRunner(make_app(self), access_log=None, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self._port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        if not self._port:
            self._port = runner.addresses[0][1]
        self._runner = runner

    async def _stop_listening(self) -> None:
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        await self._sockets.drop_all()
        await runner.cleanup()

    # -- the registry and validation as this server has them now (also used by tests directly) -------------

    def _info(self, class_type: str) -> dict[str, Any]:
        """A class's /object_info entry, with the file and model lists of now."""
        return object_info(class_type, self._files.input_files, self.model_files)

    def _validate_prompt(self, prompt: Any, partial: list[str] | None) -> Verdict:
        validator = PromptValidator(self._info, self.missing_nodes, self.model_files is None, self._files.exists_annotated)
        return validator.validate(prompt, partial)
