"""Progress hints from ComfyUI: its websocket, and (for Raylight) its log.

Neither decides anything: completion is read from /history only. The websocket is one
connection per executor (`clientId`), reconnected with backoff whenever it drops, and its
messages are handed to whoever follows that prompt. The log tail trusts only progress bars
whose total equals the request's steps (docs/design.md §2.4: another bar at start-up counts GPUs).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream
from anyio.streams.memory import MemoryObjectSendStream
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from h3core.adapters.backoff import Backoff

Message = dict[str, Any]

log = logging.getLogger("h3core.executors.comfyui")

RECONNECT = Backoff(first_s=0.2, longest_s=5.0)  # pauses between tries to connect, until cancelled


class _ReconnectsAtDebug(logging.LoggerAdapter):
    """websockets' logger, with its INFO line per reconnection said at DEBUG: `_refused_or_fatal`
    says each refusal already (the first at WARNING)."""

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.debug(msg, *args, **kwargs)


_QUIET_RECONNECTS = _ReconnectsAtDebug(logging.getLogger("websockets.client"))


class SocketFeed:
    """ComfyUI's websocket for one `clientId`, kept up by `run` and handed out by prompt: `follow` gets
    the messages of one prompt, a hint dropped where its reader falls behind."""

    def __init__(self, base_url: str, client_id: str, *, buffer: int = 256) -> None:
        self.url = re.sub(r"^http", "ws", base_url.rstrip("/")) + f"/ws?clientId={client_id}"
        self.client_id = client_id
        self._buffer = buffer
        self._subs: dict[str, set[MemoryObjectSendStream[Message]]] = {}
        self.connected = False
        self.connects = 0  # for tests and metrics: how often it (re)connected
        self._refused = 0  # connection attempts refused since the socket was last up

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a connection up until cancelled; never raises for a dropped or refused socket, but
        logs each drop, the first refusal of a run of them, and each reconnection. websockets
        reconnects, with `RECONNECT`'s pauses; `_refused_or_fatal` says which failures it tries again."""
        self._refused = 0
        connections = connect(
            self.url,
            open_timeout=10,
            ping_interval=20,
            max_size=None,
            process_exception=self._refused_or_fatal,
            reconnect_delays=RECONNECT.pauses,  # type: ignore[arg-type]  # a generator, typed Iterator; websockets calls next()
            logger=_QUIET_RECONNECTS,
        )  # a malformed URL raises here, at start: no try could ever connect
        task_status.started()
        # websockets types its `__aiter__`, an async generator, as an AsyncIterator without `aclose`.
        async with aclosing(aiter(connections)) as sockets:  # type: ignore[type-var]  # closed (and its socket) when cancelled
            async for ws in sockets:
                self.connected = True
                self.connects += 1
                where = {"url": self.url, "connects": self.connects}
                if self.connects == 1:
                    log.info("ComfyUI websocket connected (%s)", self.url, extra=where)
                else:
                    log.info("ComfyUI websocket reconnected (%s, after %d refused)", self.url, self._refused, extra=where)
                self._refused = 0
                try:
                    async for raw in ws:
                        if isinstance(raw, str):
                            self._dispatch(json.loads(raw))
                    why = "closed by ComfyUI"
                except (OSError, WebSocketException, TimeoutError, json.JSONDecodeError) as exc:
                    why = f"{type(exc).__name__}: {exc}"
                finally:
                    self.connected = False
                log.warning("ComfyUI websocket dropped (%s); reconnecting", why, extra={"url": self.url, "error": why})
                # websockets reconnects at once after a connection that was up: a server that accepts and
                # drops at once would be hammered. The first pause, as after a refusal.
                await anyio.sleep(RECONNECT.first_s)

    def _refused_or_fatal(self, exc: Exception) -> Exception | None:
        """websockets' `process_exception`: None to connect again. Every failure to connect is tried
        again, an HTTP error in the handshake too (websockets would give up on a 4xx, or on a server
        that does not speak websocket yet: ComfyUI starting, a proxy before it); a bug is raised."""
        if not isinstance(exc, (OSError, WebSocketException, TimeoutError)):
            return exc
        self._refused += 1
        why = f"{type(exc).__name__}: {exc}"
        # The first refusal says ComfyUI is down; the retries after it, every few seconds, only at DEBUG.
        (log.warning if self._refused == 1 else log.debug)(
            "ComfyUI websocket cannot connect (%s); retrying in %.1fs",
            why,
            RECONNECT.pause(self._refused),
            extra={"url": self.url, "error": why},
        )
        return None

    def _dispatch(self, message: Message) -> None:
        data = message.get("data") or {}
        prompt_id = data.get("prompt_id") if isinstance(data, dict) else None
        for send in list(self._subs.get(prompt_id, ())) if prompt_id else ():
            try:
                send.send_nowait(message)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # a hint lost: history is the authority, and the next progress supersedes it

    @asynccontextmanager
    async def follow(self, prompt_id: str) -> AsyncIterator[ObjectReceiveStream[Message]]:
        """The websocket's messages about `prompt_id` while the block runs (at most `buffer` waiting; later
        ones are dropped until it reads)."""
        send, receive = anyio.create_memory_object_stream[Message](self._buffer)
        self._subs.setdefault(prompt_id, set()).add(send)
        try:
            with receive:
                yield receive
        finally:
            subs = self._subs.get(prompt_id, set())
            subs.discard(send)
            if not subs:
                self._subs.pop(prompt_id, None)
            send.close()


class LogTail:
    """New lines of a log file, from where it ended when the tail was made."""

    _ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

    def __init__(self, path: Path, pattern: str) -> None:
        self.path = path
        self.pattern = re.compile(pattern)
        try:
            self._offset = path.stat().st_size
        except OSError:
            self._offset = 0
        self._rest = ""

    def progress(self, total: int) -> int | None:
        """The latest step of a bar whose total is `total` among the lines written since last call."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, 2)
                if size < self._offset:  # the log was rotated or truncated
                    self._offset = 0
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except OSError:
            return None
        text = self._rest + chunk.decode("utf-8", "replace")
        # tqdm redraws with \r; a line may still be being written: keep the tail for next time.
        parts = re.split(r"[\r\n]", text)
        self._rest = parts.pop()
        best = None
        for line in parts:
            for m in self.pattern.finditer(self._ANSI.sub("", line)):
                step, seen_total = int(m.group(1)), int(m.group(2))
                if seen_total == total and step <= total:
                    best = step if best is None else max(best, step)
        return best
