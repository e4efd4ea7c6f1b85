"""The HTTP API (aiohttp, like ComfyUI's server.py): routes, also under /api, and what they answer.

Every request is recorded in `received` and delayed by `http_delay` before ComfyUI's origin check.
Handlers reach the fake's parts when called, not when the app is built: a restart replaces them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from ._registry import NODE_INFO
from ._system import MODEL_FOLDERS, SERVER_FEATURES, system_stats

if TYPE_CHECKING:
    from ._server import FakeComfyUI

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Moved out of extra_data before a prompt is queued: history and GET /queue never show them.
SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")
_INDEX = "<!DOCTYPE html><html><head><title>ComfyUI</title></head><body></body></html>"


def make_app(fake: FakeComfyUI) -> web.Application:
    api = _Api(fake)
    app = web.Application(middlewares=[api.middleware], client_max_size=SERVER_FEATURES["max_upload_size"])
    for method, path, handler in api.routes():
        app.router.add_route(method, path, handler)
        app.router.add_route(method, "/api" + path, handler)
    return app


class _Api:
    def __init__(self, fake: FakeComfyUI) -> None:
        self.fake = fake

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [
            ("GET", "/ws", self._ws),
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

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        body = None
        if request.can_read_body and not request.content_type.startswith("multipart/"):
            raw = await request.read()
            with contextlib.suppress(ValueError):
                body = json.loads(raw)
        self.fake.received.append((request.method, request.path_qs, body))
        if self.fake.http_delay > 0:
            await asyncio.sleep(self.fake.http_delay)
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

    # -- the server ----------------------------------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(text=_INDEX, content_type="text/html")

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
        return web.json_response(sorted((self.fake.model_files or {}).get(folder, [])))

    async def _system_stats(self, request: web.Request) -> web.Response:
        return web.json_response(system_stats(self.fake.port))

    async def _object_info(self, request: web.Request) -> web.Response:
        missing = self.fake.missing_nodes
        return web.json_response({name: self.fake._info(name) for name in NODE_INFO if name not in missing})

    async def _object_info_one(self, request: web.Request) -> web.Response:
        name = request.match_info["node_class"]
        known = name in NODE_INFO and name not in self.fake.missing_nodes
        return web.json_response({name: self.fake._info(name)} if known else {})

    # -- prompts and the queue -------------------------------------------------------------------------------

    async def _get_prompt(self, request: web.Request) -> web.Response:
        return web.json_response(self.fake._queue.info())

    async def _post_prompt(self, request: web.Request) -> web.Response:
        fake, queue = self.fake, self.fake._queue
        fake._log.line("got prompt")
        json_data = await request.json()  # not JSON: aiohttp's own 500, as ComfyUI answers
        if "number" in json_data:
            number: float = float(json_data["number"])
        else:
            number = queue.number(front=bool(json_data.get("front")))
        if "prompt" not in json_data:
            error = {"type": "no_prompt", "message": "No prompt provided", "details": "No prompt provided", "extra_info": {}}
            return web.json_response({"error": error, "node_errors": {}}, status=400)
        prompt = json_data["prompt"]
        prompt_id = str(json_data.get("prompt_id", uuid.uuid4()))
        partial = json_data.get("partial_execution_targets")
        valid = fake._validate_prompt(prompt, partial)
        extra_data = json_data["extra_data"] if "extra_data" in json_data else {}
        if "client_id" in json_data:
            extra_data["client_id"] = json_data["client_id"]
        if not valid[0]:
            fake._log.line(f"invalid prompt: {valid[1]}")
            return web.json_response({"error": valid[1], "node_errors": valid[3]}, status=400)
        sensitive = {k: extra_data.pop(k) for k in SENSITIVE_EXTRA_DATA_KEYS if k in extra_data}
        queue.put((number, prompt_id, prompt, extra_data, valid[2], sensitive))
        return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": valid[3]})

    async def _get_queue(self, request: web.Request) -> web.Response:
        queue = self.fake._queue
        return web.json_response({"queue_running": queue.running_view(), "queue_pending": queue.pending_view()})

    async def _post_queue(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:
            self.fake._queue.wipe()
        if "delete" in json_data:
            for id_to_delete in json_data["delete"]:
                self.fake._queue.delete(id_to_delete)
        return web.Response(status=200)

    async def _post_interrupt(self, request: web.Request) -> web.Response:
        fake = self.fake
        try:
            json_data = await request.json()
        except json.JSONDecodeError:
            json_data = {}
        prompt_id = json_data.get("prompt_id")
        fake.interrupts.append((time.monotonic(), prompt_id or None))
        if prompt_id:
            if fake._queue.is_running(prompt_id):
                fake._log.line(f"Interrupting prompt {prompt_id}")
                fake._worker.interrupt_requested = True
            else:
                fake._log.line(f"Prompt {prompt_id} is not currently running, skipping interrupt")
        else:
            fake._log.line("Global interrupt (no prompt_id specified)")
            fake._worker.interrupt_requested = True
        return web.Response(status=200)

    # -- the parts that serve their own routes ----------------------------------------------------------------

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        return await self.fake._sockets.serve(request)

    async def _upload_image(self, request: web.Request) -> web.Response:
        return await self.fake._files.upload_image(request, self.fake.uploads)

    async def _view(self, request: web.Request) -> web.StreamResponse:
        return await self.fake._files.view(request)

    # -- history -------------------------------------------------------------------------------------------

    async def _get_history(self, request: web.Request) -> web.Response:
        q = request.rel_url.query
        max_items = int(q["max_items"]) if "max_items" in q else None
        offset = int(q["offset"]) if "offset" in q else -1
        return web.json_response(self.fake._queue.history_page(max_items, offset))

    async def _get_history_id(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        history = self.fake._queue.history
        if prompt_id in history:
            return web.json_response({prompt_id: copy.deepcopy(history[prompt_id])})
        return web.json_response({})

    async def _post_history(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        history = self.fake._queue.history
        if "clear" in json_data and json_data["clear"]:
            history.clear()
        for prompt_id in json_data.get("delete", []):
            history.pop(prompt_id, None)
        return web.Response(status=200)
