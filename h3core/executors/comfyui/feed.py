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
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

Message = dict[str, Any]

log = logging.getLogger("h3core.executors.comfyui")


class SocketFeed:
    def __init__(self, base_url: str, client_id: str, *, buffer: int = 256) -> None:
        self.url = re.sub(r"^http", "ws", base_url.rstrip("/")) + f"/ws?clientId={client_id}"
        self.client_id = client_id
        self._buffer = buffer
        self._subs: dict[str, set[ObjectSendStream[Message]]] = {}
        self.connected = False
        self.connects = 0  # for tests and metrics: how often it (re)connected

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep a connection up until cancelled; never raises for a dropped or refused socket, but
        logs each drop, the first refusal of a run of them, and each reconnection."""
        task_status.started()
        delay = 0.2
        refused = 0  # connection attempts refused since the socket was last up
        while True:
            was_up = False
            try:
                async with connect(self.url, open_timeout=10, ping_interval=20, max_size=None) as ws:
                    self.connected, delay, was_up = True, 0.2, True
                    self.connects += 1
                    where = {"url": self.url, "connects": self.connects}
                    if self.connects == 1:
                        log.info("ComfyUI websocket connected (%s)", self.url, extra=where)
                    else:
                        log.info("ComfyUI websocket reconnected (%s, after %d refused)", self.url, refused, extra=where)
                    refused = 0
                    async for raw in ws:
                        if isinstance(raw, str):
                            self._dispatch(json.loads(raw))
                why = "closed by ComfyUI"
            except (OSError, WebSocketException, TimeoutError, json.JSONDecodeError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            finally:
                self.connected = False
            where = {"url": self.url, "error": why}
            if was_up:
                log.warning("ComfyUI websocket dropped (%s); reconnecting", why, extra=where)
            else:
                refused += 1
                # The first refusal says ComfyUI is down; the retries after it, every few seconds, only at DEBUG.
                (log.warning if refused == 1 else log.debug)(
                    "ComfyUI websocket cannot connect (%s); retrying in %.1fs", why, delay, extra=where
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)

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
