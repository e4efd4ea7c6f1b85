"""The prompt queue and history, as ComfyUI's PromptQueue keeps them.

Pending prompts sit in a heap ordered by `number` (a `front` prompt gets a negative one); an item is
the tuple (number, prompt_id, prompt, extra_data, outputs_to_execute, sensitive), and GET /queue
shows its first five. Every change calls `changed` (the server's queue_updated: a `status` broadcast).
"""

from __future__ import annotations

import asyncio
import copy
import heapq
from collections.abc import Callable
from typing import Any

MAXIMUM_HISTORY_SIZE = 10000

Item = tuple[Any, ...]


class PromptQueue:
    def __init__(self, changed: Callable[[], None]) -> None:
        self.counter = 0  # the next `number`
        self.pending: list[Item] = []
        self.running: dict[int, Item] = {}
        self.history: dict[str, dict[str, Any]] = {}
        self._task_counter = 0
        self._changed = changed
        self._wakeup = asyncio.Event()

    def info(self) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": len(self.pending) + len(self.running)}}

    def pending_view(self) -> list[list[Any]]:
        """As GET /queue shows them (heap order)."""
        return [list(i[:5]) for i in self.pending]

    def running_view(self) -> list[list[Any]]:
        return [list(i[:5]) for i in self.running.values()]

    def is_running(self, prompt_id: str) -> bool:
        return any(item[1] == prompt_id for item in self.running.values())

    def number(self, front: bool) -> int:
        """The next `number`: negated for a prompt sent to the front."""
        number = -self.counter if front else self.counter
        self.counter += 1
        return number

    def put(self, item: Item) -> None:
        heapq.heappush(self.pending, item)
        self._changed()
        self._wakeup.set()

    async def get(self) -> tuple[int, Item]:
        """The next prompt, now running (waits for one); its id is for `task_done`."""
        while not self.pending:
            self._wakeup.clear()
            await self._wakeup.wait()
        item = heapq.heappop(self.pending)
        item_id = self._task_counter
        self._task_counter += 1
        self.running[item_id] = copy.deepcopy(item)
        self._changed()
        return item_id, item

    def task_done(self, item_id: int, status: dict[str, Any], result: dict[str, Any]) -> None:
        """The prompt ran: into history with its status and {"outputs", "meta"}."""
        prompt = self.running.pop(item_id)
        if len(self.history) > MAXIMUM_HISTORY_SIZE:
            self.history.pop(next(iter(self.history)))
        self.history[prompt[1]] = {"prompt": list(prompt[:5]), "outputs": {}, "status": copy.deepcopy(status)}
        self.history[prompt[1]].update(result)
        self._changed()

    def wipe(self) -> None:
        self.pending.clear()
        self._changed()

    def delete(self, prompt_id: str) -> None:
        """Drop a pending prompt (a running one stays: ComfyUI deletes from the queue only)."""
        for i, item in enumerate(self.pending):
            if item[1] == prompt_id:
                self.pending.pop(i)
                heapq.heapify(self.pending)
                self._changed()
                return

    def history_page(self, max_items: int | None, offset: int) -> dict[str, Any]:
        """GET /history?max_items=&offset=: a copy; a negative offset counts max_items from the end."""
        if offset < 0 and max_items is not None:
            offset = len(self.history) - max_items
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(self.history.items()):
            if i >= offset:
                out[k] = v
                if max_items is not None and len(out) >= max_items:
                    break
        return copy.deepcopy(out)
