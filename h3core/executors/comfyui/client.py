"""ComfyUI's HTTP API, as the recorded protocol (h3core/testing/comfyui_protocol/PROTOCOL.md) records it, and nothing more.

Every call raises `Unreachable` when the server cannot be reached (connection refused, reset,
timed out, 5xx), so callers can tell "ComfyUI is down" from "ComfyUI said no".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx


class Unreachable(Exception):
    """The server did not answer (or answered 5xx). `sent`: the request may have reached it (False
    only when no connection was made: then the server has seen nothing of it)."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


# Failures to connect at all: the request never left.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class PromptRejected(Exception):
    """POST /prompt answered 400: the graph failed validation."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        error = body.get("error") or {}
        super().__init__(f"{error.get('message', 'invalid prompt')} {error.get('details', '')}".strip())


@dataclass(frozen=True)
class HistoryEntry:
    """A finished prompt's record in /history: its status, the execution messages in order, and its
    outputs by node id."""

    status: str  # "success" | "error"
    completed: bool
    messages: list[tuple[str, dict[str, Any]]]
    outputs: dict[str, dict[str, Any]]

    def last(self, kind: str) -> dict[str, Any] | None:
        """The data of the last message of `kind` (e.g. "execution_error"), or None."""
        for name, data in reversed(self.messages):
            if name == kind:
                return data
        return None


class ComfyClient:
    """One ComfyUI server's HTTP API over a pooled client; every call raises `Unreachable` when the
    server does not answer or answers 5xx."""

    def __init__(self, base_url: str, *, timeout: float = 30.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise Unreachable(
                f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc}", sent=not isinstance(exc, _NOT_SENT)
            ) from exc
        if response.status_code >= 500:
            raise Unreachable(f"{method} {self.base_url}{path}: HTTP {response.status_code}")
        return response

    async def submit(self, prompt_id: str, graph: dict[str, Any], client_id: str) -> dict[str, Any]:
        """POST /prompt with our own prompt id; `PromptRejected` on validation errors.

        A 200 with `node_errors` means only part of the graph will run (PROTOCOL.md §2): that is
        a rejection for us, since the output node may be the part that will not.
        """
        body = {"prompt": graph, "client_id": client_id, "prompt_id": prompt_id}
        response = await self._request("POST", "/prompt", json=body)
        data = response.json() if response.content else {}
        if response.status_code == 400 or data.get("node_errors"):
            raise PromptRejected(data)
        response.raise_for_status()
        return data

    async def history(self, prompt_id: str) -> HistoryEntry | None:
        """The finished prompt's record, or None while it runs, waits, or is unknown."""
        response = await self._request("GET", f"/history/{prompt_id}")
        entry = (response.json() or {}).get(prompt_id)
        if not entry:
            return None
        status = entry.get("status") or {}
        return HistoryEntry(
            status=status.get("status_str", "error"),
            completed=bool(status.get("completed")),
            messages=[(m[0], m[1]) for m in status.get("messages", []) if isinstance(m, list) and len(m) == 2],
            outputs=entry.get("outputs") or {},
        )

    async def queue(self) -> tuple[set[str], set[str]]:
        """(running prompt ids, pending prompt ids)."""
        data = (await self._request("GET", "/queue")).json()
        return {item[1] for item in data.get("queue_running", [])}, {item[1] for item in data.get("queue_pending", [])}

    async def interrupt(self, prompt_id: str) -> None:
        """Interrupt this prompt only if it is the running one (never the global interrupt)."""
        await self._request("POST", "/interrupt", json={"prompt_id": prompt_id})

    async def delete(self, prompt_id: str) -> None:
        """Remove a pending prompt (a running one is not affected: PROTOCOL.md §4)."""
        await self._request("POST", "/queue", json={"delete": [prompt_id]})

    async def upload(self, path: Path, name: str) -> str:
        """Upload to the input folder; returns the name to use (the server may rename it)."""
        data = await anyio.Path(path).read_bytes()
        response = await self._request(
            "POST", "/upload/image", files={"image": (name, data)}, data={"type": "input", "overwrite": "true"}
        )
        response.raise_for_status()
        return response.json()["name"]

    async def download(self, ref: dict[str, Any], dest: Path) -> None:
        """Stream the output file `ref` names (its filename, subfolder and type, as /history lists it) from
        /view into `dest`; an HTTP 4xx raises `httpx.HTTPStatusError`."""
        params = {"filename": ref["filename"], "subfolder": ref.get("subfolder", ""), "type": ref.get("type", "output")}
        try:
            async with self._http.stream("GET", "/view", params=params) as response:
                if response.status_code >= 500:
                    raise Unreachable(f"GET /view: HTTP {response.status_code}")
                response.raise_for_status()
                async with await anyio.open_file(dest, "wb") as f:
                    async for chunk in response.aiter_bytes(1 << 16):
                        await f.write(chunk)
        except httpx.TransportError as exc:
            raise Unreachable(f"GET /view {ref.get('filename')}: {exc}") from exc

    async def system_stats(self) -> dict[str, Any]:
        """GET /system_stats: the server's machine, its devices' memory among it."""
        return (await self._request("GET", "/system_stats")).json()

    async def object_info(self) -> dict[str, Any]:
        """GET /object_info: the node classes the server offers, by name."""
        return (await self._request("GET", "/object_info")).json()
