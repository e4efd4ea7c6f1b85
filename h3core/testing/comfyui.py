"""A protocol-faithful fake ComfyUI server (aiohttp, like ComfyUI itself), for tests of a ComfyUI client.

Needs aiohttp (the `test` extra), and numpy and PyAV for `SaveVideo` (the `service` extra);
`import h3core` imports none of them.

It reproduces what `h3core/testing/comfyui_protocol/PROTOCOL.md` records of ComfyUI 0.3.64: the same
routes (also under `/api`), the same JSON shapes and status codes, prompt validation against a node
registry (`comfyui_nodes.py`), one worker that runs prompts one at a time in `number` order, the
websocket message sequences (who gets what, in which order), node output caching across prompts,
interrupts, the queue, history, uploads and `/view`. Nodes do no real work: they sleep, count
progress and pass opaque values along; output nodes write real files (PNG, and a real H.264/AAC mp4
for `SaveVideo`). Faults are switched on with plain attributes, at any time, also mid-prompt.

    async with FakeComfyUI(tmp_path) as comfy:           # listens on 127.0.0.1, a free port
        comfy.step_seconds = 0.02
        comfy.oom_at_step = 3                            # the sampler fails at its third step
        ... a client talks to comfy.url ...
        assert comfy.history[prompt_id]["status"]["status_str"] == "error"
        await comfy.restart()                            # same port, history and queue forgotten

From synchronous code: `with FakeComfyUI(root).running_in_thread() as comfy: comfy.call(comfy.restart())`.

Where it knowingly differs from the real server (see also the test module):
- node outputs are tokens, not tensors; images are written small (at most 256 px a side, previews
  at most 64 px) and videos at `video_size` (64x64), whatever size the graph asks for;
- `current_inputs` of an error leave out hidden inputs (`prompt`, `extra_pnginfo`), and tracebacks
  are canned look-alikes of ComfyUI's frames;
- `/view?preview=...` and `channel=rgb|a` serve the file unchanged (no Pillow here);
- `%date%`-style variables in `filename_prefix` are not expanded;
- the node registry is the 37 classes of `comfyui_nodes.py`, not 478;
- model-name combos (`unet_name`, `clip_name`, `vae_name`, `ckpt_name`) accept any value unless
  `model_files` is set (a real server lists the files in its models folders);
- when the fake itself drops sockets (`drop_sockets_at_step`, `pause_listening`, restarts), the
  dropped socket's handler does not unregister a newer socket of the same clientId; a socket the
  *client* closes after being replaced does (ComfyUI's `sockets.pop(sid)` quirk, reproduced).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import heapq
import json
import math
import mimetypes
import os
import random
import struct
import sys
import threading
import time
import urllib.parse
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import WSCloseCode, WSMsgType, web

from .comfyui_nodes import FILE_INPUTS, MODEL_INPUTS, NODE_INFO, node_info

# What the fake reproduces: PROTOCOL.md and the recorded samples/ of a real ComfyUI 0.3.64.
PROTOCOL = Path(__file__).parent / "comfyui_protocol"

T = TypeVar("T")

SERVER_FEATURES = {"supports_preview_metadata": True, "max_upload_size": 104857600}
RAM_TOTAL = 25276063744  # the recorded server's; EmptyImage bigger than this fails like it did
SAMPLERS = frozenset({"KSampler", "KSamplerAdvanced", "SamplerCustomAdvanced", "XFuserSamplerCustomAdvanced"})
SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")
MAXIMUM_HISTORY_SIZE = 10000
MODEL_FOLDERS = [
    "checkpoints",
    "configs",
    "loras",
    "vae",
    "text_encoders",
    "diffusion_models",
    "clip_vision",
    "style_models",
    "embeddings",
    "diffusers",
    "vae_approx",
    "controlnet",
    "gligen",
    "upscale_models",
    "custom_nodes",
    "hypernetworks",
    "photomaker",
    "classifiers",
    "model_patches",
    "audio_encoders",
]
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 22.00 GiB of which 1.02 GiB "
    "is free. Including non-PyTorch memory, this process has 20.96 GiB memory in use. Of the allocated memory "
    "18.71 GiB is allocated by PyTorch, and 1.80 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
OOM_TIPS = (
    "This error means you ran out of memory on your GPU.\n\nTIPS: If the workflow worked before you might have "
    "accidentally set the batch_size to a large number."
)
_ROOT = "/opt/ComfyUI"
_EXEC_FRAMES = [
    f'  File "{_ROOT}/execution.py", line 496, in execute\n    output_data, output_ui, has_subgraph, '
    "has_pending_tasks = await get_output_data(prompt_id, unique_id, obj, input_data_all, "
    "execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, hidden_inputs=hidden_inputs)\n",
    f'  File "{_ROOT}/execution.py", line 315, in get_output_data\n    return_values = await '
    "_async_map_node_over_list(prompt_id, unique_id, obj, input_data_all, obj.FUNCTION, allow_interrupt=True, "
    "execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, hidden_inputs=hidden_inputs)\n",
    f'  File "{_ROOT}/execution.py", line 289, in _async_map_node_over_list\n    await process_inputs(input_dict, i)\n',
    f'  File "{_ROOT}/execution.py", line 277, in process_inputs\n    result = f(**inputs)\n             ^^^^^^^^^^^\n',
]
_VALIDATION_FRAMES = [
    f'  File "{_ROOT}/execution.py", line 1010, in validate_prompt\n    m = await validate_inputs(prompt_id, prompt, o, '
    "validated)\n        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
    f"  File \"{_ROOT}/execution.py\", line 788, in validate_inputs\n    o_class_type = prompt[o_id]['class_type']\n"
    "                   ~~~~~~^^^^^^\n",
]
# A 1x1 lossless WebP: SaveAnimatedWEBP writes this (there is no encoder here).
_WEBP = bytes.fromhex("524946461a000000574542505650384c0d0000002f00000010071011118888fe0700")


# -- values flowing between nodes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Images:
    n: int
    width: int
    height: int
    color: int = 0x808080

    def __str__(self) -> str:
        return f"tensor(<{self.n}x{self.height}x{self.width}x3 float32 image>)"


@dataclass(frozen=True)
class Latent:
    frames: int
    width: int
    height: int

    def __str__(self) -> str:
        return f"{{'samples': tensor(<latent {self.frames} frames {self.width}x{self.height}>)}}"


@dataclass(frozen=True)
class Sigmas:
    steps: int

    def __str__(self) -> str:
        return f"tensor(<{self.steps + 1} sigmas>)"


@dataclass(frozen=True)
class Audio:
    seconds: float
    sample_rate: int = 44100

    def __str__(self) -> str:
        return f"{{'waveform': tensor(<2 x {int(self.seconds * self.sample_rate)}>), 'sample_rate': {self.sample_rate}}}"


@dataclass(frozen=True)
class Video:
    frames: int
    width: int
    height: int
    fps: float
    audio: Audio | None

    def __str__(self) -> str:
        return f"<VideoFromComponents {self.frames} frames {self.width}x{self.height} @ {self.fps}>"


@dataclass(frozen=True)
class Token:
    """Any other node output (MODEL, CLIP, CONDITIONING, ...)."""

    type: str
    node: str

    def __str__(self) -> str:
        return f"<{self.type} from node {self.node}>"


class _Interrupted(Exception):
    pass


class NodeFailure(Exception):
    """Raised inside a fake node: becomes an `execution_error` with these fields."""

    def __init__(self, exception_type: str, message: str, traceback: list[str] | None = None) -> None:
        super().__init__(message)
        self.exception_type = exception_type
        self.message = message
        self.traceback = traceback if traceback is not None else list(_EXEC_FRAMES)


def _ms() -> int:
    return int(time.time() * 1000)


def _full_type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _format_value(x: Any) -> Any:
    if x is None or isinstance(x, int | float | bool | str):
        return x
    return str(x)


def _is_link(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], int)


def png_bytes(width: int, height: int, color: int = 0x808080) -> bytes:
    """A valid solid-colour RGB PNG."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    rgb = bytes([(color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF])
    rows = (b"\x00" + rgb * width) * height
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _png_size(path: Path) -> tuple[int, int]:
    try:
        with open(path, "rb") as f:
            head = f.read(24)
        if head[:8] == b"\x89PNG\r\n\x1a\n":
            w, h = struct.unpack(">II", head[16:24])
            return int(w), int(h)
    except OSError:
        pass
    return 64, 64


def _tqdm(i: int, n: int, elapsed: float) -> str:
    frac = i / n if n else 1.0
    whole, part = divmod(int(frac * 10 * 8), 8)
    bar = "█" * whole + ("▏▎▍▌▋▊▉"[part - 1] if part and whole < 10 else "")
    bar = bar.ljust(10)
    rate = i / elapsed if elapsed > 0 else 0.0
    remaining = (n - i) / rate if rate > 0 else 0.0

    def hms(s: float) -> str:
        m, s = divmod(int(s), 60)
        return f"{m:02d}:{s:02d}"

    return f"{int(frac * 100):3d}%|{bar}| {i}/{n} [{hms(elapsed)}<{hms(remaining)}, {rate:5.2f}it/s]"


@dataclass
class _Run:
    """One prompt being executed."""

    number: float
    prompt_id: str
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    outputs_to_execute: list[str]
    client_id: str | None
    messages: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sigs: dict[str, str] = field(default_factory=dict)
    values: dict[str, list[list[Any]]] = field(default_factory=dict)  # node -> per socket, per list item
    ui: dict[str, dict[str, Any]] = field(default_factory=dict)  # used when caching is off
    executed: list[str] = field(default_factory=list)
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    node: str | None = None
    step: int = 0
    success: bool = False


class FakeComfyUI:
    """One fake ComfyUI process serving `root` (input/, output/, temp/, comfyui.log) on 127.0.0.1.

    Knobs (plain attributes, changeable at any time, also while a prompt runs):
      step_seconds      time per sampler step (and per image of SaveImageWebsocket's progress bar)
      node_seconds      time per call of every other node (per list item when fed a list)
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
    `current_node`, `current_step`, `sockets`, `uploads`, `received` [(method, path?query, JSON or None)].
    Lifetime: `start`/`stop` (or `async with`), `restart(down_for=0)`, `go_down`/`come_up` (a crash and
    a fresh process), `pause_listening`/`resume_listening` (unreachable, state and prompt kept).
    """

    def __init__(self, root: Path, *, gpus: int = 1) -> None:
        self.root = Path(root)
        self.gpus = gpus
        # -- fault switches and knobs
        self.step_seconds: float = 0.01  # per progress tick of a sampler (and of SaveImageWebsocket)
        self.node_seconds: float = 0.0  # per call of every other node
        self.send_progress: bool = True  # False: samplers send no progress/progress_state ticks (Raylight)
        self.sampler_checks_interrupt: bool | None = None  # None: only where it reports progress
        self.log_progress: bool = False  # tqdm lines in root/comfyui.log
        self.oom_at_step: int | None = None
        self.error_at_step: int | None = None
        self.drop_sockets_at_step: int | None = None  # fires once, then resets to None
        self.http_delay: float = 0.0
        self.caching: bool = True  # False: like --cache-none
        self.model_files: dict[str, list[str]] | None = None  # folder -> names; None: any name is accepted
        self.missing_nodes: set[str] = set()  # node classes this server lacks (as without a custom node pack)
        self.video_size: tuple[int, int] = (64, 64)
        self.max_video_frames: int = 240
        # -- for assertions
        self.received: list[tuple[str, str, Any]] = []  # (method, path with query, JSON body or None)
        self.uploads: list[dict[str, Any]] = []  # what /upload/image answered, plus "path" and "bytes"
        # -- server
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
        return self._history

    @property
    def queue_pending(self) -> list[list[Any]]:
        """As GET /queue shows them (heap order)."""
        return [list(i[:5]) for i in self._queue]

    @property
    def queue_running(self) -> list[list[Any]]:
        return [list(i[:5]) for i in self._running.values()]

    @property
    def running_prompt_id(self) -> str | None:
        return self._run.prompt_id if self._run else None

    @property
    def current_node(self) -> str | None:
        return self._run.node if self._run else None

    @property
    def current_step(self) -> int:
        """The sampler step last completed by the running prompt (0 if none)."""
        return self._run.step if self._run else 0

    @property
    def sockets(self) -> dict[str, web.WebSocketResponse]:
        return dict(self._sockets)

    async def __aenter__(self) -> FakeComfyUI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        for sub in ("input", "output", "temp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
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
        await self.wait_for(lambda: not self._queue and not self._running, timeout)

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
        self._number = 0
        self._queue: list[tuple[Any, ...]] = []
        self._running: dict[int, tuple[Any, ...]] = {}
        self._task_counter = 0
        self._history: dict[str, dict[str, Any]] = {}
        self._interrupt = False
        self._client_id: str | None = None
        self._last_node_id: str | None = None
        self._run: _Run | None = None
        self._out_cache: dict[str, list[list[Any]]] = {}
        self._ui_cache: dict[str, dict[str, Any]] = {}
        self._objects: dict[tuple[str, str], str] = {}  # (node, class) -> PreviewImage's random prefix
        self._sockets: dict[str, web.WebSocketResponse] = {}
        self._sockets_meta: dict[str, dict[str, Any]] = {}
        self._all_ws: set[web.WebSocketResponse] = set()
        self._dropped: set[web.WebSocketResponse] = set()
        self._outbox: asyncio.Queue[tuple[Any, Any, str | None]] | None = None
        self._wakeup: asyncio.Event | None = None

    async def _boot(self) -> None:
        shutil_rmtree_contents(self.root / "temp")
        self._outbox = asyncio.Queue()
        self._wakeup = asyncio.Event()
        self._tasks = [asyncio.create_task(self._worker()), asyncio.create_task(self._publisher())]
        await self._listen()
        self._log(f"Starting server\n\nTo see the GUI go to: {self.url}")
        if self.log_progress:
            self._log_workers_bar()

    async def _kill(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def _listen(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=SERVER_FEATURES["max_upload_size"])
        routes = self._routes()
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
            app.router.add_route(method, "/api" + path, handler)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
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
        await self._drop_sockets()
        await runner.cleanup()

    async def _drop_sockets(self) -> None:
        sockets = list(self._all_ws)
        self._dropped.update(sockets)
        self._sockets.clear()
        self._sockets_meta.clear()
        await asyncio.gather(*(self._close_ws(ws) for ws in sockets), return_exceptions=True)

    @staticmethod
    async def _close_ws(ws: web.WebSocketResponse) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=WSCloseCode.GOING_AWAY, message=b"server closed"), 1.0)

    # -- log ---------------------------------------------------------------------------------------------

    def _write_log(self, text: str) -> None:
        with contextlib.suppress(OSError):
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(text)

    def _log(self, line: str) -> None:
        self._write_log(line + "\n")

    def _log_workers_bar(self) -> None:
        g = max(1, self.gpus)
        self._write_log("".join(f"\rLoading workers: {_tqdm(i, g, 1.25 * i)}" for i in range(g + 1)) + "\n")

    # -- websocket -----------------------------------------------------------------------------------------

    def _queue_info(self) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": len(self._queue) + len(self._running)}}

    def _emit(self, event: str | int, data: Any, sid: str | None) -> None:
        """Like ComfyUI's send_sync: queued, then sent in order by the publisher."""
        if self._outbox is not None:
            self._outbox.put_nowait((event, data, sid))

    def _queue_updated(self) -> None:
        self._emit("status", {"status": self._queue_info()}, None)

    def _supports_preview_metadata(self, sid: str | None) -> bool:
        if sid is None or sid not in self._sockets_meta:
            return False
        return self._sockets_meta[sid]["feature_flags"].get("supports_preview_metadata", False) is True

    async def _publisher(self) -> None:
        assert self._outbox is not None
        while True:
            event, data, sid = await self._outbox.get()
            if event == "__drop__":
                await self._drop_sockets()
                continue
            await self._send(event, data, sid)

    async def _send(self, event: str | int, data: Any, sid: str | None) -> None:
        if isinstance(event, int):
            payload: str | bytes = struct.pack(">I", event) + data
        else:
            payload = json.dumps({"type": event, "data": data})
        targets = list(self._sockets.values()) if sid is None else [self._sockets[sid]] if sid in self._sockets else []
        for ws in targets:
            with contextlib.suppress(Exception):
                if isinstance(payload, bytes):
                    await ws.send_bytes(payload)
                else:
                    await ws.send_str(payload)

    async def _ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(timeout=2.0)
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId", "")
        if sid:
            self._sockets.pop(sid, None)  # reusing the session: the old socket gets nothing more
        else:
            sid = uuid.uuid4().hex
        self._sockets[sid] = ws
        self._sockets_meta[sid] = {"feature_flags": {}}
        self._all_ws.add(ws)
        try:
            await self._send("status", {"status": self._queue_info(), "sid": sid}, sid)
            if self._client_id == sid and self._last_node_id is not None:
                await self._send("executing", {"node": self._last_node_id}, sid)
            first_message = True
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    try:
                        data = json.loads(msg.data)
                    except json.JSONDecodeError:
                        continue
                    if first_message and isinstance(data, dict) and data.get("type") == "feature_flags":
                        if sid in self._sockets_meta:
                            self._sockets_meta[sid]["feature_flags"] = data.get("data", {})
                        await self._send("feature_flags", SERVER_FEATURES, sid)
                    first_message = False
        finally:
            self._all_ws.discard(ws)
            if ws not in self._dropped:
                # ComfyUI pops by sid, even when a newer socket of that clientId has replaced this one.
                self._sockets.pop(sid, None)
                self._sockets_meta.pop(sid, None)
            self._dropped.discard(ws)
        return ws

    # -- HTTP ----------------------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        body = None
        if request.can_read_body and not request.content_type.startswith("multipart/"):
            raw = await request.read()
            with contextlib.suppress(ValueError):
                body = json.loads(raw)
        self.received.append((request.method, request.path_qs, body))
        if self.http_delay > 0:
            await asyncio.sleep(self.http_delay)
        # ComfyUI's origin check: a loopback Host with a different Origin is refused.
        host, origin = request.headers.get("Host"), request.headers.get("Origin")
        if host and origin:
            o = urllib.parse.urlparse(origin)
            h = urllib.parse.urlsplit("//" + host.lower())
            host_domain = host.lower() if o.port is not None else h.hostname
            origin_domain = o.netloc.lower() if h.port is not None else o.hostname
            if h.hostname in ("localhost", "127.0.0.1", "::1") and host_domain and origin_domain:
                if host_domain != origin_domain:
                    return web.Response(status=403)
        if request.method == "OPTIONS":
            return web.Response()
        return await handler(request)

    def _routes(self) -> list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]]:
        return [
            ("GET", "/ws", self._ws_handler),
            ("GET", "/", self._index),
            ("GET", "/prompt", self._get_prompt),
            ("POST", "/prompt", self._post_prompt),
            ("GET", "/queue", self._get_queue),
            ("POST", "/queue", self._post_queue),
            ("POST", "/interrupt", self._post_interrupt),
            ("GET", "/history", self._get_history),
            ("GET", "/history/{prompt_id}", self._get_history_id),
            ("POST", "/history", self._post_history),
            ("GET", "/object_info", self._object_info),
            ("GET", "/object_info/{node_class}", self._object_info_one),
            ("POST", "/upload/image", self._upload_image),
            ("GET", "/view", self._view),
            ("GET", "/system_stats", self._system_stats),
            ("GET", "/features", self._features),
            ("GET", "/embeddings", self._empty_list),
            ("GET", "/extensions", self._empty_list),
            ("GET", "/models", self._models),
            ("GET", "/models/{folder}", self._models_folder),
            ("POST", "/free", self._ok),
        ]

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(
            text="<!DOCTYPE html><html><head><title>ComfyUI</title></head><body></body></html>", content_type="text/html"
        )

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _empty_list(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def _features(self, request: web.Request) -> web.Response:
        return web.json_response(SERVER_FEATURES)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(MODEL_FOLDERS)

    async def _models_folder(self, request: web.Request) -> web.Response:
        folder = request.match_info["folder"]
        if folder not in MODEL_FOLDERS:
            return web.Response(status=404)
        return web.json_response(sorted((self.model_files or {}).get(folder, [])))

    async def _system_stats(self, request: web.Request) -> web.Response:
        vram = 150_754_820_096
        return web.json_response(
            {
                "system": {
                    "os": "posix",
                    "ram_total": RAM_TOTAL,
                    "ram_free": 24194351104,
                    "comfyui_version": "0.3.64",
                    "required_frontend_version": "1.27.10",
                    "installed_templates_version": "0.1.95",
                    "required_templates_version": "0.1.95",
                    "python_version": sys.version,
                    "pytorch_version": "2.14.1+cu130",
                    "embedded_python": False,
                    "argv": ["main.py", "--listen", "127.0.0.1", "--port", str(self._port)],
                },
                "devices": [
                    {
                        "name": "cuda:0 NVIDIA H200 : cudaMallocAsync",
                        "type": "cuda",
                        "index": 0,
                        "vram_total": vram,
                        "vram_free": vram - 2**30,
                        "torch_vram_total": 0,
                        "torch_vram_free": 0,
                    }
                ],
            }
        )

    async def _get_prompt(self, request: web.Request) -> web.Response:
        return web.json_response(self._queue_info())

    async def _post_prompt(self, request: web.Request) -> web.Response:
        self._log("got prompt")
        json_data = await request.json()  # not JSON: aiohttp's own 500, as ComfyUI answers
        if "number" in json_data:
            number: float = float(json_data["number"])
        else:
            number = self._number
            if "front" in json_data and json_data["front"]:
                number = -number
            self._number += 1
        if "prompt" not in json_data:
            error = {"type": "no_prompt", "message": "No prompt provided", "details": "No prompt provided", "extra_info": {}}
            return web.json_response({"error": error, "node_errors": {}}, status=400)
        prompt = json_data["prompt"]
        prompt_id = str(json_data.get("prompt_id", uuid.uuid4()))
        partial = json_data.get("partial_execution_targets")
        valid = self._validate_prompt(prompt, partial)
        extra_data = json_data["extra_data"] if "extra_data" in json_data else {}
        if "client_id" in json_data:
            extra_data["client_id"] = json_data["client_id"]
        if not valid[0]:
            self._log(f"invalid prompt: {valid[1]}")
            return web.json_response({"error": valid[1], "node_errors": valid[3]}, status=400)
        sensitive = {k: extra_data.pop(k) for k in SENSITIVE_EXTRA_DATA_KEYS if k in extra_data}
        heapq.heappush(self._queue, (number, prompt_id, prompt, extra_data, valid[2], sensitive))
        self._queue_updated()
        assert self._wakeup is not None
        self._wakeup.set()
        return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": valid[3]})

    async def _get_queue(self, request: web.Request) -> web.Response:
        return web.json_response({"queue_running": self.queue_running, "queue_pending": self.queue_pending})

    async def _post_queue(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:
            self._queue.clear()
            self._queue_updated()
        if "delete" in json_data:
            for id_to_delete in json_data["delete"]:
                for i, item in enumerate(self._queue):
                    if item[1] == id_to_delete:
                        self._queue.pop(i)
                        heapq.heapify(self._queue)
                        self._queue_updated()
                        break
        return web.Response(status=200)

    async def _post_interrupt(self, request: web.Request) -> web.Response:
        try:
            json_data = await request.json()
        except json.JSONDecodeError:
            json_data = {}
        prompt_id = json_data.get("prompt_id")
        if prompt_id:
            if any(item[1] == prompt_id for item in self._running.values()):
                self._log(f"Interrupting prompt {prompt_id}")
                self._interrupt = True
            else:
                self._log(f"Prompt {prompt_id} is not currently running, skipping interrupt")
        else:
            self._log("Global interrupt (no prompt_id specified)")
            self._interrupt = True
        return web.Response(status=200)

    async def _get_history(self, request: web.Request) -> web.Response:
        q = request.rel_url.query
        max_items = int(q["max_items"]) if "max_items" in q else None
        offset = int(q["offset"]) if "offset" in q else -1
        if offset < 0 and max_items is not None:
            offset = len(self._history) - max_items
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(self._history.items()):
            if i >= offset:
                out[k] = v
                if max_items is not None and len(out) >= max_items:
                    break
        return web.json_response(copy.deepcopy(out))

    async def _get_history_id(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        if prompt_id in self._history:
            return web.json_response({prompt_id: copy.deepcopy(self._history[prompt_id])})
        return web.json_response({})

    async def _post_history(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:
            self._history.clear()
        for prompt_id in json_data.get("delete", []):
            self._history.pop(prompt_id, None)
        return web.Response(status=200)

    async def _object_info(self, request: web.Request) -> web.Response:
        return web.json_response({name: self._info(name) for name in NODE_INFO if name not in self.missing_nodes})

    async def _object_info_one(self, request: web.Request) -> web.Response:
        name = request.match_info["node_class"]
        return web.json_response({name: self._info(name)} if name in NODE_INFO and name not in self.missing_nodes else {})

    # -- files ---------------------------------------------------------------------------------------------

    def _dir(self, kind: str | None) -> Path | None:
        return {"input": self.root / "input", "output": self.root / "output", "temp": self.root / "temp"}.get(kind or "")

    def _input_files(self, kinds: tuple[str, ...]) -> list[str]:
        folder = self.root / "input"
        names = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        return [n for n in names if (mimetypes.guess_type(n)[0] or "").split("/")[0] in kinds]

    def _annotated(self, name: str) -> tuple[str, Path]:
        for kind in ("input", "output", "temp"):
            if name.endswith(f" [{kind}]"):
                return name[: -len(kind) - 3], self._dir(kind)  # type: ignore[return-value]
        return name, self.root / "input"

    def _exists_annotated(self, name: Any) -> bool:
        if not isinstance(name, str):
            return False
        name, base = self._annotated(name)
        return (base / name).exists()

    async def _upload_image(self, request: web.Request) -> web.Response:
        post = await request.post()
        image = post.get("image")
        overwrite = post.get("overwrite")
        upload_type = post.get("type") or "input"
        if upload_type not in ("input", "temp", "output"):
            raise UnboundLocalError("cannot access local variable 'type_dir'")  # what ComfyUI trips over: a 500
        upload_dir = str(self._dir(str(upload_type)))
        if not (isinstance(image, web.FileField) and image.file):
            return web.Response(status=400)
        filename = image.filename
        if not filename:
            return web.Response(status=400)
        subfolder = str(post.get("subfolder", ""))
        full_folder = os.path.join(upload_dir, os.path.normpath(subfolder))
        filepath = os.path.abspath(os.path.join(full_folder, filename))
        if os.path.commonpath((upload_dir, filepath)) != upload_dir:
            return web.Response(status=400)
        os.makedirs(full_folder, exist_ok=True)
        data = image.file.read()
        base, ext = os.path.splitext(filename)
        duplicate = False
        if not (overwrite is not None and overwrite in ("true", "1")):
            i = 1
            while os.path.exists(filepath):
                with open(filepath, "rb") as f:
                    if hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest():
                        duplicate = True
                        break
                filename = f"{base} ({i}){ext}"
                filepath = os.path.join(full_folder, filename)
                i += 1
        if not duplicate:
            with open(filepath, "wb") as f:
                f.write(data)
        answer = {"name": filename, "subfolder": subfolder, "type": upload_type}
        self.uploads.append({**answer, "path": Path(filepath), "bytes": len(data), "duplicate": duplicate})
        return web.json_response(answer)

    async def _view(self, request: web.Request) -> web.StreamResponse:
        q = request.rel_url.query
        if "filename" in q:
            filename, output_dir = q["filename"], None
            for kind in ("input", "output", "temp"):
                if filename.endswith(f" [{kind}]"):
                    filename, output_dir = filename[: -len(kind) - 3], str(self._dir(kind))
            if not filename:
                return web.Response(status=400)
            if filename[0] == "/" or ".." in filename:
                return web.Response(status=400)
            if output_dir is None:
                d = self._dir(q.get("type", "output"))
                output_dir = str(d) if d is not None else None
            if output_dir is None:
                return web.Response(status=400)
            if "subfolder" in q:
                full = os.path.join(output_dir, q["subfolder"])
                if os.path.commonpath((os.path.abspath(full), output_dir)) != output_dir:
                    return web.Response(status=403)
                output_dir = full
            filename = os.path.basename(filename)
            file = os.path.join(output_dir, filename)
            if os.path.isfile(file):
                content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
                if content_type in {"text/html", "text/html-sandboxed", "application/xhtml+xml", "text/javascript", "text/css"}:
                    content_type = "application/octet-stream"
                headers = {"Content-Disposition": f'filename="{filename}"', "Content-Type": content_type}
                return web.FileResponse(file, headers=headers)
        return web.Response(status=404)

    # -- node registry ---------------------------------------------------------------------------------------

    def _info(self, class_type: str) -> dict[str, Any]:
        """A class's /object_info entry, with the file and model lists of now."""
        info = node_info(class_type)
        for (cls, name), (kinds, _) in FILE_INPUTS.items():
            if cls == class_type:
                spec = info["input"]["required"][name]
                if spec[0] == "COMBO":
                    spec[1]["options"] = self._input_files(kinds)
                else:
                    spec[0] = self._input_files(kinds)
        for (cls, name), folder in MODEL_INPUTS.items():
            if cls == class_type:
                spec = info["input"]["required"][name]
                names = sorted((self.model_files or {}).get(folder, []))
                spec[0] = names + (["pixel_space"] if folder == "vae" else [])
        return info

    # -- validation (execution.validate_prompt / validate_inputs) ------------------------------------------------

    def _validate_prompt(self, prompt: Any, partial: list[str] | None) -> tuple[bool, Any, list[str], dict[str, Any]]:
        outputs: list[str] = []
        for x in prompt:
            if "class_type" not in prompt[x]:
                error = {
                    "type": "invalid_prompt",
                    "message": "Cannot execute because a node is missing the class_type property.",
                    "details": f"Node ID '#{x}'",
                    "extra_info": {},
                }
                return (False, error, [], {})
            class_type = prompt[x]["class_type"]
            if class_type not in NODE_INFO or class_type in self.missing_nodes:
                error = {
                    "type": "invalid_prompt",
                    "message": f"Cannot execute because node {class_type} does not exist.",
                    "details": f"Node ID '#{x}'",
                    "extra_info": {},
                }
                return (False, error, [], {})
            if NODE_INFO[class_type]["output_node"] is True and (partial is None or x in partial):
                outputs.append(x)
        if not outputs:
            error = {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": "", "extra_info": {}}
            return (False, error, [], {})

        good: list[str] = []
        errors: list[tuple[str, list[dict[str, Any]]]] = []
        node_errors: dict[str, Any] = {}
        validated: dict[str, tuple[bool, list[dict[str, Any]], str]] = {}
        for o in outputs:
            try:
                valid, reasons, _ = self._validate_inputs(prompt, o, validated)
            except Exception as ex:
                valid = False
                reasons = [
                    {
                        "type": "exception_during_validation",
                        "message": "Exception when validating node",
                        "details": str(ex),
                        "extra_info": {"exception_type": _full_type_name(ex), "traceback": list(_VALIDATION_FRAMES)},
                    }
                ]
                validated[o] = (False, reasons, o)
            if valid is True:
                good.append(o)
                continue
            errors.append((o, reasons))
            for node_id, result in validated.items():
                # Every failed node seen so far is charged with this output, as ComfyUI does.
                if result[0] is not True and len(result[1]) > 0:
                    if node_id not in node_errors:
                        node_errors[node_id] = {
                            "errors": result[1],
                            "dependent_outputs": [],
                            "class_type": prompt[node_id]["class_type"],
                        }
                    node_errors[node_id]["dependent_outputs"].append(o)
        if not good:
            details = "\n".join(f"{e['message']}: {e['details']}" for _, errs in errors for e in errs)
            error = {
                "type": "prompt_outputs_failed_validation",
                "message": "Prompt outputs failed validation",
                "details": details,
                "extra_info": {},
            }
            return (False, error, [], node_errors)
        return (True, None, good, node_errors)

    def _validate_inputs(self, prompt: dict[str, Any], uid: str, validated: dict[str, Any]) -> tuple[bool, list[Any], str]:
        if uid in validated:
            return validated[uid]
        inputs = prompt[uid]["inputs"]
        class_type = prompt[uid]["class_type"]
        class_inputs = self._info(class_type)["input"]
        specs: dict[str, tuple[Any, dict[str, Any], str]] = {}
        for category in ("required", "optional"):
            for name, spec in class_inputs.get(category, {}).items():
                specs.setdefault(name, (spec[0], spec[1] if len(spec) > 1 else {}, category))
        custom = [name for (cls, name) in FILE_INPUTS if cls == class_type]
        errors: list[dict[str, Any]] = []
        valid = True
        for x, (input_type, extra_info, category) in specs.items():
            if x not in inputs:
                if category == "required":
                    errors.append(
                        {
                            "type": "required_input_missing",
                            "message": "Required input is missing",
                            "details": f"{x}",
                            "extra_info": {"input_name": x},
                        }
                    )
                continue
            val = inputs[x]
            info = [input_type, extra_info]
            if isinstance(val, list):
                if len(val) != 2:
                    errors.append(
                        {
                            "type": "bad_linked_input",
                            "message": "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                            "details": f"{x}",
                            "extra_info": {"input_name": x, "input_config": info, "received_value": val},
                        }
                    )
                    continue
                o_id = val[0]
                o_class_type = prompt[o_id]["class_type"]
                received_type = tuple(NODE_INFO[o_class_type]["output"])[val[1]]
                if not _types_match(received_type, input_type):
                    details = f"{x}, received_type({received_type}) mismatch input_type({input_type})"
                    errors.append(
                        {
                            "type": "return_type_mismatch",
                            "message": "Return type mismatch between linked nodes",
                            "details": details,
                            "extra_info": {
                                "input_name": x,
                                "input_config": info,
                                "received_type": received_type,
                                "linked_node": val,
                            },
                        }
                    )
                    continue
                try:
                    r = self._validate_inputs(prompt, o_id, validated)
                    if r[0] is False:
                        valid = False
                        continue
                except Exception as ex:
                    valid = False
                    reasons = [
                        {
                            "type": "exception_during_inner_validation",
                            "message": "Exception when validating inner node",
                            "details": str(ex),
                            "extra_info": {
                                "input_name": x,
                                "input_config": info,
                                "exception_message": str(ex),
                                "exception_type": _full_type_name(ex),
                                "traceback": list(_VALIDATION_FRAMES),
                                "linked_node": val,
                            },
                        }
                    ]
                    validated[o_id] = (False, reasons, o_id)
                    continue
            else:
                try:
                    if isinstance(val, dict) and "__value__" in val:
                        val = inputs[x] = val["__value__"]
                    if input_type == "INT":
                        val = inputs[x] = int(val)
                    if input_type == "FLOAT":
                        val = inputs[x] = float(val)
                    if input_type == "STRING":
                        val = inputs[x] = str(val)
                    if input_type == "BOOLEAN":
                        val = inputs[x] = bool(val)
                except Exception as ex:
                    errors.append(
                        {
                            "type": "invalid_input_type",
                            "message": f"Failed to convert an input value to a {input_type} value",
                            "details": f"{x}, {val}, {ex}",
                            "extra_info": {
                                "input_name": x,
                                "input_config": info,
                                "received_value": val,
                                "exception_message": str(ex),
                            },
                        }
                    )
                    continue
                if x in custom:
                    continue
                if "min" in extra_info and val < extra_info["min"]:
                    errors.append(
                        {
                            "type": "value_smaller_than_min",
                            "message": "Value {} smaller than min of {}".format(val, extra_info["min"]),
                            "details": f"{x}",
                            "extra_info": {"input_name": x, "input_config": info, "received_value": val},
                        }
                    )
                    continue
                if "max" in extra_info and val > extra_info["max"]:
                    errors.append(
                        {
                            "type": "value_bigger_than_max",
                            "message": "Value {} bigger than max of {}".format(val, extra_info["max"]),
                            "details": f"{x}",
                            "extra_info": {"input_name": x, "input_config": info, "received_value": val},
                        }
                    )
                    continue
                if isinstance(input_type, list) or input_type == "COMBO":
                    if (class_type, x) in MODEL_INPUTS and self.model_files is None:
                        continue
                    options = extra_info.get("options", []) if input_type == "COMBO" else input_type
                    if val not in options:
                        input_config: Any = info
                        if len(options) > 20:
                            list_info = f"(list of length {len(options)})"
                            input_config = None
                        else:
                            list_info = str(options)
                        errors.append(
                            {
                                "type": "value_not_in_list",
                                "message": "Value not in list",
                                "details": f"{x}: '{val}' not in {list_info}",
                                "extra_info": {"input_name": x, "input_config": input_config, "received_value": val},
                            }
                        )
                        continue
        for x in custom:
            if x in inputs and not isinstance(inputs[x], list):
                _, message = FILE_INPUTS[(class_type, x)]
                if not self._exists_annotated(inputs[x]):
                    errors.append(
                        {
                            "type": "custom_validation_failed",
                            "message": "Custom validation failed for node",
                            "details": f"{x} - {message.format(inputs[x])}",
                            "extra_info": {"input_name": x},
                        }
                    )
        result = (False, errors, uid) if errors or valid is not True else (True, [], uid)
        validated[uid] = result
        return result

    # -- the worker ----------------------------------------------------------------------------------------

    async def _worker(self) -> None:
        assert self._wakeup is not None
        while True:
            while not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            item = heapq.heappop(self._queue)
            item_id = self._task_counter
            self._task_counter += 1
            self._running[item_id] = copy.deepcopy(item)
            self._queue_updated()
            started = time.perf_counter()
            run = await self._execute(item)
            prompt = self._running.pop(item_id)
            if len(self._history) > MAXIMUM_HISTORY_SIZE:
                self._history.pop(next(iter(self._history)))
            status = {"status_str": "success" if run.success else "error", "completed": run.success, "messages": run.messages}
            self._history[prompt[1]] = {"prompt": list(prompt[:5]), "outputs": {}, "status": copy.deepcopy(status)}
            self._history[prompt[1]].update(self._history_result(run))
            self._queue_updated()
            if run.client_id is not None:
                self._emit("executing", {"node": None, "prompt_id": run.prompt_id}, run.client_id)
            self._log(f"Prompt executed in {time.perf_counter() - started:.2f} seconds")

    def _history_result(self, run: _Run) -> dict[str, Any]:
        outputs: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        for uid in run.prompt:
            ui = self._ui_of(run, uid)
            if ui is not None:
                outputs[uid] = ui["output"]
                meta[uid] = ui["meta"]
        return {"outputs": outputs, "meta": meta}

    def _ui_of(self, run: _Run, uid: str) -> dict[str, Any] | None:
        if self.caching and uid in run.sigs:
            return self._ui_cache.get(run.sigs[uid])
        return run.ui.get(uid)

    def _add_message(self, run: _Run, event: str, data: dict[str, Any], broadcast: bool) -> None:
        data = {**data, "timestamp": _ms()}
        run.messages.append((event, data))
        if run.client_id is not None or broadcast:
            self._emit(event, data, run.client_id)

    async def _execute(self, item: tuple[Any, ...]) -> _Run:
        number, prompt_id, prompt, extra_data, outputs_to_execute, sensitive = item
        self._interrupt = False
        client_id = extra_data.get("client_id")
        run = _Run(number, prompt_id, prompt, {**extra_data, **sensitive}, list(outputs_to_execute), client_id)
        self._run = run
        self._client_id = client_id
        try:
            await self._execute_run(run)
        except Exception as ex:  # a graph the fake cannot run (or a bug here): reported as a node error
            if not any(name in ("execution_error", "execution_interrupted") for name, _ in run.messages):
                self._handle_error(run, run.node or next(iter(run.prompt)), NodeFailure(_full_type_name(ex), str(ex)), {})
            run.success = False
        finally:
            self._last_node_id = None
            self._run = None
        return run

    async def _execute_run(self, run: _Run) -> None:
        prompt = run.prompt
        self._add_message(run, "execution_start", {"prompt_id": run.prompt_id}, broadcast=False)
        if self.caching:
            run.sigs = self._signatures(prompt)
            keep = set(run.sigs.values())
            self._out_cache = {k: v for k, v in self._out_cache.items() if k in keep}
            self._ui_cache = {k: v for k, v in self._ui_cache.items() if k in keep}
        cached = [uid for uid in prompt if self._cached(run, uid)]
        await asyncio.sleep(0)
        self._add_message(run, "execution_cached", {"nodes": cached, "prompt_id": run.prompt_id}, broadcast=False)

        # ExecutionList: a topological dissolve that prefers output nodes (ux_friendly_pick_node).
        pending: dict[str, bool] = {}
        blockers: dict[str, set[str]] = {}
        blocking: dict[str, dict[str, bool]] = {}

        def add_node(start: str) -> None:
            stack, links = [start], []
            while stack:
                uid = stack.pop()
                if uid in pending:
                    continue
                pending[uid], blockers[uid], blocking[uid] = True, set(), {}
                for value in prompt[uid]["inputs"].values():
                    if _is_link(value):
                        if not self._cached(run, value[0]):
                            stack.append(value[0])
                        links.append((value[0], uid))
            for src, dst in links:
                if not self._cached(run, src) or src in pending:
                    add_node(src)
                    blocking[src][dst] = True
                    blockers[dst].add(src)

        for uid in run.outputs_to_execute:
            add_node(uid)

        def is_output(uid: str) -> bool:
            return NODE_INFO[prompt[uid]["class_type"]]["output_node"] is True

        def pick(ready: list[str]) -> str:
            for uid in ready:
                if is_output(uid):
                    return uid
            for uid in ready:
                if any(is_output(b) for b in blocking[uid]):
                    return uid
            for uid in ready:
                for b in blocking[uid]:
                    if b in pending and any(is_output(b1) for b1 in blocking[b]):
                        return uid
            return ready[0]

        while pending:
            ready = [uid for uid in pending if not blockers[uid]]
            if not ready:
                failure = NodeFailure("graph.DependencyCycleError", "Dependency cycle detected", [])
                self._handle_error(run, next(iter(pending)), failure, [])
                return
            uid = pick(ready)
            ok = await self._execute_node(run, uid)
            if not ok:
                return
            del pending[uid]
            for blocked in blocking.pop(uid):
                blockers[blocked].discard(uid)
            blockers.pop(uid)
        run.success = True
        self._add_message(run, "execution_success", {"prompt_id": run.prompt_id}, broadcast=False)

    # -- caching (CacheKeySetInputSignature, classic cache) ------------------------------------------------------

    def _cached(self, run: _Run, uid: str) -> bool:
        return self.caching and uid in run.sigs and run.sigs[uid] in self._out_cache

    def _signatures(self, prompt: dict[str, Any]) -> dict[str, str]:
        sigs: dict[str, str] = {}
        visiting: set[str] = set()

        def sig(uid: str) -> str:
            if uid in sigs:
                return sigs[uid]
            if uid in visiting or uid not in prompt:
                return uuid.uuid4().hex  # a cycle or a dangling link: never cached
            visiting.add(uid)
            node = prompt[uid]
            parts: list[Any] = [node["class_type"], self._is_changed(node)]
            for key in sorted(node["inputs"]):
                value = node["inputs"][key]
                parts.append([key, ["ANCESTOR", sig(value[0]), value[1]] if _is_link(value) else value])
            visiting.discard(uid)
            sigs[uid] = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()
            return sigs[uid]

        for uid in prompt:
            sig(uid)
        return sigs

    def _is_changed(self, node: dict[str, Any]) -> Any:
        class_type = node["class_type"]
        if class_type == "SaveImageWebsocket":
            return uuid.uuid4().hex  # IS_CHANGED returns time.time(): never cached
        for (cls, name), _ in FILE_INPUTS.items():
            if cls == class_type and isinstance(node["inputs"].get(name), str):
                name_, base = self._annotated(node["inputs"][name])
                try:
                    return hashlib.sha256((base / name_).read_bytes()).hexdigest()
                except OSError:
                    return None
        return ""

    # -- running one node (execution.execute) --------------------------------------------------------------------

    def _progress_entry(self, run: _Run, uid: str) -> dict[str, Any]:
        return run.progress.setdefault(uid, {"state": "pending", "value": 0, "max": 1})

    def _send_progress_state(self, run: _Run) -> None:
        nodes = {
            uid: {
                "value": e["value"],
                "max": e["max"],
                "state": e["state"],
                "node_id": uid,
                "prompt_id": run.prompt_id,
                "display_node_id": uid,
                "parent_node_id": None,
                "real_node_id": uid,
            }
            for uid, e in run.progress.items()
            if e["state"] != "pending"
        }
        self._emit("progress_state", {"prompt_id": run.prompt_id, "nodes": nodes}, run.client_id)

    def _start_progress(self, run: _Run, uid: str) -> None:
        self._progress_entry(run, uid).update(state="running", value=0.0, max=1.0)
        self._send_progress_state(run)

    def _finish_progress(self, run: _Run, uid: str) -> None:
        e = self._progress_entry(run, uid)
        e.update(state="finished", value=e["max"])
        self._send_progress_state(run)

    def _check_interrupt(self) -> None:
        if self._interrupt:
            self._interrupt = False
            raise _Interrupted()

    async def _progress(
        self, run: _Run, uid: str, value: int, total: int, preview: bytes | None = None, *, check: bool = True
    ) -> None:
        """ComfyUI's progress hook: interrupt check, progress_state, (preview), progress, (legacy preview)."""
        if check:
            self._check_interrupt()
        self._progress_entry(run, uid).update(state="running", value=value, max=total)
        self._send_progress_state(run)
        modern = self._supports_preview_metadata(run.client_id)
        if preview is not None and modern:
            meta = {
                "node_id": uid,
                "prompt_id": run.prompt_id,
                "display_node_id": uid,
                "parent_node_id": None,
                "real_node_id": uid,
                "image_type": "image/png",
            }
            meta_json = json.dumps(meta).encode()
            self._emit(4, struct.pack(">I", len(meta_json)) + meta_json + preview, run.client_id)
        self._emit("progress", {"value": value, "max": total, "prompt_id": run.prompt_id, "node": uid}, run.client_id)
        if preview is not None and not modern:
            self._emit(1, struct.pack(">I", 2) + preview, run.client_id)

    def _value_of(self, run: _Run, uid: str) -> list[list[Any]]:
        if uid in run.values:
            return run.values[uid]
        return self._out_cache[run.sigs[uid]]

    async def _execute_node(self, run: _Run, uid: str) -> bool:
        node = run.prompt[uid]
        class_type = node["class_type"]
        if self._cached(run, uid):
            if run.client_id is not None:
                ui = self._ui_of(run, uid) or {}
                self._emit(
                    "executed",
                    {"node": uid, "display_node": uid, "output": ui.get("output"), "prompt_id": run.prompt_id},
                    run.client_id,
                )
            self._finish_progress(run, uid)
            return True
        self._start_progress(run, uid)
        run.node = uid
        input_data: dict[str, list[Any]] | None = None
        try:
            input_data = self._input_data(run, uid)
            if run.client_id is not None:
                self._last_node_id = uid
                self._emit("executing", {"node": uid, "display_node": uid, "prompt_id": run.prompt_id}, run.client_id)
            outputs, ui = await self._map_over_list(run, uid, class_type, input_data)
        except _Interrupted:
            self._log("Processing interrupted")
            self._handle_interrupt(run, uid)
            return False
        except Exception as ex:
            failure = ex if isinstance(ex, NodeFailure) else NodeFailure(_full_type_name(ex), str(ex))
            formatted = {k: [_format_value(v) for v in vs] for k, vs in (input_data or {}).items()}
            self._log(f"!!! Exception during processing !!! {failure.message}")
            self._handle_error(run, uid, failure, formatted)
            return False
        if ui:
            entry = {"meta": {"node_id": uid, "display_node": uid, "parent_node": None, "real_node_id": uid}, "output": ui}
            if self.caching:
                self._ui_cache[run.sigs[uid]] = entry
            run.ui[uid] = entry
            if run.client_id is not None:
                self._emit(
                    "executed", {"node": uid, "display_node": uid, "output": ui, "prompt_id": run.prompt_id}, run.client_id
                )
        run.values[uid] = outputs
        if self.caching:
            self._out_cache[run.sigs[uid]] = outputs
        self._finish_progress(run, uid)
        run.executed.append(uid)
        return True

    def _input_data(self, run: _Run, uid: str) -> dict[str, list[Any]]:
        node = run.prompt[uid]
        spec = self._info(node["class_type"])["input"]
        declared = set(spec.get("required", {})) | set(spec.get("optional", {}))
        data: dict[str, list[Any]] = {}
        for name, value in node["inputs"].items():
            if _is_link(value):
                data[name] = list(self._value_of(run, value[0])[value[1]])
            elif name in declared:
                data[name] = [value]
        return data

    async def _map_over_list(
        self, run: _Run, uid: str, class_type: str, input_data: dict[str, list[Any]]
    ) -> tuple[list[list[Any]], dict[str, list[Any]]]:
        info = NODE_INFO[class_type]
        behaviour = getattr(self, f"_n_{class_type}", None)
        calls: list[dict[str, Any]]
        if class_type == "RebatchImages":  # INPUT_IS_LIST
            calls = [input_data]
        elif not input_data:
            calls = [{}]
        else:
            n = max(len(v) for v in input_data.values())
            calls = [{k: v[i if len(v) > i else -1] for k, v in input_data.items()} for i in range(n)]
        results: list[tuple[Any, ...]] = []
        uis: list[dict[str, list[Any]]] = []
        for kwargs in calls:
            self._check_interrupt()  # nodes.before_node_execution()
            if class_type not in SAMPLERS and class_type != "SaveImageWebsocket" and self.node_seconds > 0:
                await asyncio.sleep(self.node_seconds)
            if behaviour is not None:
                out, ui = await behaviour(run, uid, kwargs)
            else:
                out, ui = tuple(Token(t, uid) for t in info["output"]), None
            results.append(out)
            if ui:
                uis.append(ui)
        outputs: list[list[Any]] = []
        for i, is_list in enumerate(info["output_is_list"]):
            outputs.append([x for r in results for x in r[i]] if is_list else [r[i] for r in results])
        merged = {k: [y for u in uis for y in u[k]] for k in uis[0]} if uis else {}
        return outputs, merged

    def _handle_interrupt(self, run: _Run, uid: str) -> None:
        mes = {
            "prompt_id": run.prompt_id,
            "node_id": uid,
            "node_type": run.prompt[uid]["class_type"],
            "executed": list(run.executed),
        }
        self._add_message(run, "execution_interrupted", mes, broadcast=True)

    def _handle_error(self, run: _Run, uid: str, failure: NodeFailure, current_inputs: Any) -> None:
        message = failure.message
        if failure.exception_type in ("torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"):
            message = f"{message}\n{OOM_TIPS}"
        elif failure.exception_type != "graph.DependencyCycleError":
            message = f"{message}\n"
        mes = {
            "prompt_id": run.prompt_id,
            "node_id": uid,
            "node_type": run.prompt[uid]["class_type"],
            "executed": list(run.executed),
            "exception_message": message,
            "exception_type": failure.exception_type,
            "traceback": failure.traceback,
            "current_inputs": current_inputs,
            "current_outputs": list(run.prompt),
        }
        self._add_message(run, "execution_error", mes, broadcast=False)

    # -- fake nodes: async (run, node id, one call's inputs) -> (outputs, ui or None) -----------------------------

    async def _sample(self, run: _Run, uid: str, class_type: str, steps: int) -> None:
        ray = class_type == "XFuserSamplerCustomAdvanced"
        checks = self.send_progress if self.sampler_checks_interrupt is None else self.sampler_checks_interrupt
        started = time.monotonic()
        logged = False
        try:
            for i in range(1, steps + 1):
                await asyncio.sleep(self.step_seconds)
                if self.drop_sockets_at_step == i:
                    self.drop_sockets_at_step = None
                    self._emit("__drop__", None, None)
                if self.oom_at_step == i:
                    raise NodeFailure("torch.OutOfMemoryError", OOM_MESSAGE, _EXEC_FRAMES + [_sampler_frame(class_type)])
                if self.error_at_step == i:
                    raise NodeFailure("RuntimeError", "boom", _EXEC_FRAMES + [_sampler_frame(class_type)])
                if self.log_progress:
                    bar = _tqdm(i, steps, time.monotonic() - started)
                    if ray:
                        self._write_log(
                            "".join(f"\x1b[36m(RayWorker pid={4100 + r})\x1b[0m {r}: {bar}\n" for r in range(max(1, self.gpus)))
                        )
                    else:
                        self._write_log(f"\r{bar}")
                        logged = True
                run.step = i
                if self.send_progress:
                    await self._progress(run, uid, i, steps, check=checks)
                elif checks:
                    self._check_interrupt()
        finally:
            if logged:
                self._write_log("\n")

    async def _n_KSampler(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        await self._sample(run, uid, "KSampler", int(kw.get("steps", 0)))
        return (kw.get("latent_image"),), None

    async def _n_KSamplerAdvanced(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        await self._sample(run, uid, "KSamplerAdvanced", int(kw.get("steps", 0)))
        return (kw.get("latent_image"),), None

    async def _n_SamplerCustomAdvanced(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        sigmas = kw.get("sigmas")
        await self._sample(run, uid, "SamplerCustomAdvanced", sigmas.steps if isinstance(sigmas, Sigmas) else 0)
        return (kw.get("latent_image"), kw.get("latent_image")), None

    async def _n_XFuserSamplerCustomAdvanced(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        sigmas = kw.get("sigmas")
        await self._sample(run, uid, "XFuserSamplerCustomAdvanced", sigmas.steps if isinstance(sigmas, Sigmas) else 0)
        return (kw.get("latent_image"), kw.get("latent_image"), Token("RAY_ACTORS", uid)), None

    async def _n_BasicScheduler(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        return (Sigmas(int(kw["steps"]) if float(kw.get("denoise", 1.0)) > 0 else 0),), None

    _n_RayBasicScheduler = _n_BasicScheduler

    async def _n_RayInitializer(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        if self.log_progress:
            self._log_workers_bar()
        return (Token("RAY_ACTORS_INIT", uid),), None

    async def _n_EmptyImage(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        w, h, b = int(kw["width"]), int(kw["height"]), int(kw["batch_size"])
        if w * h * b * 4 > RAM_TOTAL:
            raise NodeFailure(
                "RuntimeError",
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                f"to allocate {w * h * b * 4} bytes. Error code 12 (Cannot allocate memory)",
                _EXEC_FRAMES
                + [
                    f'  File "{_ROOT}/nodes.py", line 1877, in generate\n    r = torch.full([batch_size, height, '
                    "width, 1], ((color >> 16) & 0xFF) / 0xFF)\n"
                ],
            )
        return (Images(b, w, h, int(kw.get("color", 0))),), None

    async def _n_EmptyLatentImage(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        return (Latent(int(kw["batch_size"]), int(kw["width"]), int(kw["height"])),), None

    async def _n_ImageScale(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        img = kw["image"]
        return (Images(img.n, int(kw["width"]) or img.width, int(kw["height"]) or img.height, img.color),), None

    async def _n_ImageBlur(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        return (kw["image"],), None  # the same tokens: no pixels here to blur

    async def _n_RebatchImages(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        size = int(kw["batch_size"][0])
        total = sum(i.n for i in kw["images"])
        first = kw["images"][0]
        batches = [Images(min(size, total - s), first.width, first.height, first.color) for s in range(0, total, size)]
        return (batches,), None

    async def _n_LoadImage(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        name, base = self._annotated(kw["image"])
        w, h = _png_size(base / name)
        return (Images(1, w, h), Token("MASK", uid)), None

    async def _n_LoadVideo(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        return (Video(24, 64, 64, 24.0, Audio(1.0)),), None

    async def _n_LoadAudio(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        return (Audio(2.0),), None

    async def _n_GetVideoComponents(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        v = kw["video"]
        return (Images(v.frames, v.width, v.height), v.audio, float(v.fps)), None

    async def _n_MiniMaxH3ImageToVideo(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        return (Token("CONDITIONING", uid), Latent(int(kw["length"]), int(kw["width"]), int(kw["height"]))), None

    _n_MiniMaxH3ReferenceToVideo = _n_MiniMaxH3ImageToVideo

    async def _n_VAEDecode(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        lat = kw["samples"]
        return (Images(lat.frames, lat.width, lat.height),), None

    async def _n_VAEEncode(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        img = kw["pixels"]
        return (Latent(img.n, img.width, img.height),), None

    async def _n_VAEDecodeAudio(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        return (Audio(kw["samples"].frames / 24.0),), None

    async def _n_CreateVideo(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        img = kw["images"]
        return (Video(img.n, img.width, img.height, float(kw["fps"]), kw.get("audio")),), None

    def _save_path(self, prefix: str, base: Path) -> tuple[Path, str, int, str]:
        """folder_paths.get_save_image_path: the next free counter for this prefix."""
        base_s = str(base)
        subfolder = os.path.dirname(os.path.normpath(prefix))
        filename = os.path.basename(os.path.normpath(prefix))
        folder = os.path.join(base_s, subfolder)
        if os.path.commonpath((base_s, os.path.abspath(folder))) != base_s:
            raise NodeFailure(
                "Exception",
                "**** ERROR: Saving image outside the output folder is not allowed.\n full_output_folder: "
                f"{os.path.abspath(folder)}\n         output_dir: {base_s}\n         commonpath: "
                f"{os.path.commonpath((base_s, os.path.abspath(folder)))}",
            )
        os.makedirs(folder, exist_ok=True)
        counter = 0
        for name in os.listdir(folder):
            head = name[: len(filename) + 1]
            if os.path.normcase(head[:-1]) == os.path.normcase(filename) and head[-1:] == "_":
                with contextlib.suppress(ValueError):
                    counter = max(counter, int(name[len(filename) + 1 :].split("_")[0]))
        return Path(folder), filename, counter + 1, subfolder

    def _save_images(self, img: Images, prefix: str, kind: str) -> dict[str, list[Any]]:
        base = self.root / kind
        folder, filename, counter, subfolder = self._save_path(prefix, base)
        data = png_bytes(min(img.width, 256) or 1, min(img.height, 256) or 1, img.color)
        results = []
        for b in range(img.n):
            file = f"{filename.replace('%batch_num%', str(b))}_{counter:05}_.png"
            (folder / file).write_bytes(data)
            results.append({"filename": file, "subfolder": subfolder, "type": kind})
            counter += 1
        return {"images": results}

    async def _n_SaveImage(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), self._save_images(kw["images"], str(kw.get("filename_prefix", "ComfyUI")), "output")

    async def _n_PreviewImage(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        suffix = self._objects.setdefault(
            (uid, "PreviewImage"), "".join(random.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
        )
        return (), self._save_images(kw["images"], f"ComfyUI_temp_{suffix}", "temp")

    async def _n_SaveAnimatedWEBP(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        folder, filename, counter, subfolder = self._save_path(str(kw.get("filename_prefix", "ComfyUI")), self.root / "output")
        file = f"{filename}_{counter:05}_.webp"
        (folder / file).write_bytes(_WEBP)
        return (), {"images": [{"filename": file, "subfolder": subfolder, "type": "output"}], "animated": [True]}

    async def _n_SaveImageWebsocket(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], None]:
        img = kw["images"]
        preview = png_bytes(min(img.width, 64) or 1, min(img.height, 64) or 1, img.color)
        for step in range(img.n):  # this node reports 0..n-1
            await asyncio.sleep(self.step_seconds)
            await self._progress(run, uid, step, img.n, preview)
        return (), None

    async def _n_SaveVideo(self, run: _Run, uid: str, kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        video = kw["video"]
        folder, filename, counter, subfolder = self._save_path(
            str(kw.get("filename_prefix", "video/ComfyUI")), self.root / "output"
        )
        file = f"{filename}_{counter:05}_.mp4"
        await asyncio.to_thread(self._write_video, folder / file, video)
        return (), {"images": [{"filename": file, "subfolder": subfolder, "type": "output"}], "animated": [True]}

    def _write_video(self, path: Path, video: Video) -> None:
        import numpy as np

        from h3core.adapters.video import write_mp4

        w, h = self.video_size
        frames_n = max(1, min(int(video.frames), self.max_video_frames))
        fps = max(1, round(video.fps))
        ramp = np.linspace(0, 255, frames_n, dtype=np.float32)
        frames = np.zeros((frames_n, h, w, 3), dtype=np.uint8)
        frames[..., 0] = ramp[:, None, None].astype(np.uint8)
        frames[..., 1] = np.arange(w, dtype=np.uint8)[None, None, :] * (255 // max(1, w - 1))
        frames[..., 2] = 128
        audio = None
        if video.audio is not None:
            rate = 32_000
            t = np.arange(int(rate * frames_n / fps), dtype=np.float32) / rate
            tone = (0.2 * np.sin(2 * math.pi * 440.0 * t)).astype(np.float32)
            audio = np.stack([tone, tone])
        write_mp4(path, frames, fps=fps, audio=audio, sample_rate=32_000)


def _types_match(received: Any, expected: Any) -> bool:
    """execution.validate_node_input (non-strict)."""
    if not received != expected:
        return True
    if not isinstance(received, str) or not isinstance(expected, str):
        return False
    r = {t.strip() for t in received.split(",")}
    e = {t.strip() for t in expected.split(",")}
    return "*" in r or "*" in e or bool(r & e)


def _sampler_frame(class_type: str) -> str:
    if class_type == "XFuserSamplerCustomAdvanced":
        return '  File "/opt/ComfyUI/custom_nodes/raylight/nodes.py", line 612, in sample\n    result = ray.get(futures)\n'
    return (
        '  File "/opt/ComfyUI/comfy/samplers.py", line 1035, in sample\n    output = executor.execute(noise, '
        "latent_image, sampler, sigmas, denoise_mask, callback, disable_pbar, seed, latent_shapes=latent_shapes)\n"
    )


def shutil_rmtree_contents(folder: Path) -> None:
    """Empty a folder (ComfyUI wipes its temp folder at start-up)."""
    import shutil

    if folder.is_dir():
        for p in folder.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
    else:
        folder.mkdir(parents=True, exist_ok=True)
