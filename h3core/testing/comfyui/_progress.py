"""A prompt's progress messages: `progress_state` (every started node's state), `progress`, and previews.

As ComfyUI's ProgressRegistry and WebUIProgressHandler send them: to the prompt's client, or to every
socket when the prompt names none.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from ._sockets import Sockets


class Progress:
    def __init__(self, sockets: Sockets, prompt_id: str, client_id: str | None) -> None:
        self._sockets = sockets
        self._prompt_id = prompt_id
        self._client_id = client_id
        self._nodes: dict[str, dict[str, Any]] = {}

    def start(self, uid: str) -> None:
        self._entry(uid).update(state="running", value=0.0, max=1.0)
        self._send_state()

    def finish(self, uid: str) -> None:
        e = self._entry(uid)
        e.update(state="finished", value=e["max"])
        self._send_state()

    def report(self, uid: str, value: int, total: int, preview: bytes | None = None) -> None:
        """ComfyUI's progress hook after its interrupt check: progress_state, (preview), progress, (legacy preview).

        A preview goes with its metadata to a client that said it supports that, else as a legacy preview.
        """
        self._entry(uid).update(state="running", value=value, max=total)
        self._send_state()
        modern = self._sockets.supports_preview_metadata(self._client_id)
        if preview is not None and modern:
            meta = {**self._node(uid), "image_type": "image/png"}
            meta_json = json.dumps(meta).encode()
            self._sockets.emit(4, struct.pack(">I", len(meta_json)) + meta_json + preview, self._client_id)
        self._sockets.emit("progress", {"value": value, "max": total, "prompt_id": self._prompt_id, "node": uid}, self._client_id)
        if preview is not None and not modern:
            self._sockets.emit(1, struct.pack(">I", 2) + preview, self._client_id)

    def _entry(self, uid: str) -> dict[str, Any]:
        return self._nodes.setdefault(uid, {"state": "pending", "value": 0, "max": 1})

    def _node(self, uid: str) -> dict[str, Any]:
        """Which node a message is about (the same node in every role: the fake has no subgraphs)."""
        return {
            "node_id": uid,
            "prompt_id": self._prompt_id,
            "display_node_id": uid,
            "parent_node_id": None,
            "real_node_id": uid,
        }

    def _send_state(self) -> None:
        nodes = {
            uid: {"value": e["value"], "max": e["max"], "state": e["state"], **self._node(uid)}
            for uid, e in self._nodes.items()
            if e["state"] != "pending"
        }
        self._sockets.emit("progress_state", {"prompt_id": self._prompt_id, "nodes": nodes}, self._client_id)
