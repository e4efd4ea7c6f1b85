"""Websocket sessions by clientId, and the messages sent to them, as ComfyUI's PromptServer keeps them.

Messages are queued (`emit`, ComfyUI's send_sync) and sent in order by one publisher task; `sid`
None broadcasts. JSON messages are {"type", "data"}; binary ones are a 4-byte big-endian event
number and the payload (1: a legacy preview, 4: a preview with metadata).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from ._system import SERVER_FEATURES

_DROP = "__drop__"  # an outbox entry that closes every socket, in its place among the messages


class Sockets:
    def __init__(self, queue_info: Callable[[], dict[str, Any]]) -> None:
        self.by_sid: dict[str, web.WebSocketResponse] = {}
        self._meta: dict[str, dict[str, Any]] = {}
        self._all: set[web.WebSocketResponse] = set()
        self._dropped: set[web.WebSocketResponse] = set()
        self._outbox: asyncio.Queue[tuple[Any, Any, str | None]] = asyncio.Queue()
        self._queue_info = queue_info
        # ComfyUI's client_id and last_node_id: a socket that reconnects with that clientId is told
        # the node now executing.
        self.client_id: str | None = None
        self.last_node_id: str | None = None

    def emit(self, event: str | int, data: Any, sid: str | None) -> None:
        """Like ComfyUI's send_sync: queued, then sent in order by the publisher."""
        self._outbox.put_nowait((event, data, sid))

    def queue_updated(self) -> None:
        self.emit("status", {"status": self._queue_info()}, None)

    def drop_all_in_turn(self) -> None:
        """Close every socket once the messages queued before this are sent."""
        self.emit(_DROP, None, None)

    def supports_preview_metadata(self, sid: str | None) -> bool:
        if sid is None or sid not in self._meta:
            return False
        return self._meta[sid]["feature_flags"].get("supports_preview_metadata", False) is True

    async def publish(self) -> None:
        """The publisher task: sends what `emit` queued, for the life of the process."""
        while True:
            event, data, sid = await self._outbox.get()
            if event == _DROP:
                await self.drop_all()
                continue
            await self._send(event, data, sid)

    async def drop_all(self) -> None:
        """Close every socket server side. Their handlers then leave a newer socket of the same clientId be."""
        sockets = list(self._all)
        self._dropped.update(sockets)
        self.by_sid.clear()
        self._meta.clear()
        await asyncio.gather(*(_close(ws) for ws in sockets), return_exceptions=True)

    async def _send(self, event: str | int, data: Any, sid: str | None) -> None:
        if isinstance(event, int):
            payload: str | bytes = struct.pack(">I", event) + data
        else:
            payload = json.dumps({"type": event, "data": data})
        targets = list(self.by_sid.values()) if sid is None else [self.by_sid[sid]] if sid in self.by_sid else []
        for ws in targets:
            with contextlib.suppress(Exception):
                if isinstance(payload, bytes):
                    await ws.send_bytes(payload)
                else:
                    await ws.send_str(payload)

    async def serve(self, request: web.Request) -> web.WebSocketResponse:
        """GET /ws?clientId=: one session, until either side closes it."""
        ws = web.WebSocketResponse(timeout=2.0)
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId", "")
        if sid:
            self.by_sid.pop(sid, None)  # reusing the session: the old socket gets nothing more
        else:
            sid = uuid.uuid4().hex
        self.by_sid[sid] = ws
        self._meta[sid] = {"feature_flags": {}}
        self._all.add(ws)
        try:
            await self._send("status", {"status": self._queue_info(), "sid": sid}, sid)
            if self.client_id == sid and self.last_node_id is not None:
                await self._send("executing", {"node": self.last_node_id}, sid)
            first_message = True
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    try:
                        data = json.loads(msg.data)
                    except json.JSONDecodeError:
                        continue
                    if first_message and isinstance(data, dict) and data.get("type") == "feature_flags":
                        if sid in self._meta:
                            self._meta[sid]["feature_flags"] = data.get("data", {})
                        await self._send("feature_flags", SERVER_FEATURES, sid)
                    first_message = False
        finally:
            self._all.discard(ws)
            if ws not in self._dropped:
                # ComfyUI pops by sid, even when a newer socket of that clientId has replaced this one.
                self.by_sid.pop(sid, None)
                self._meta.pop(sid, None)
            self._dropped.discard(ws)
        return ws


async def _close(ws: web.WebSocketResponse) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ws.close(code=WSCloseCode.GOING_AWAY, message=b"server closed"), 1.0)
