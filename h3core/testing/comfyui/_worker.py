"""The worker: runs queued prompts one at a time, in `number` order (ComfyUI's prompt_worker and PromptExecutor).

A prompt sends execution_start and execution_cached, then runs its nodes in ComfyUI's order (a
cached node only reports `executed` again), and ends with execution_success, or execution_error or
execution_interrupted at the node that stopped it; then it goes to history with those messages.
Interrupts are noticed at ComfyUI's checks: before each call of a node and at a sampler's progress
ticks. What a node does is in `_nodes.py`; this module only runs them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._cache import NodeCache
from ._failures import OOM_TIPS, Interrupted, NodeFailure, full_type_name
from ._files import Files
from ._log import ComfyLog
from ._nodes import BEHAVIOURS, INPUT_IS_LIST, TIMED_BY_STEPS
from ._progress import Progress
from ._queue import Item, PromptQueue
from ._registry import NODE_INFO, is_output_node
from ._sockets import Sockets
from ._switches import Switches
from ._values import Token, is_link


@dataclass
class Run:
    """One prompt being executed."""

    number: float
    prompt_id: str
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    outputs_to_execute: list[str]
    client_id: str | None
    progress: Progress
    messages: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # what history's status keeps
    sigs: dict[str, str] = field(default_factory=dict)  # node -> cache signature (caching on)
    values: dict[str, list[list[Any]]] = field(default_factory=dict)  # node -> per socket, per list item
    ui: dict[str, dict[str, Any]] = field(default_factory=dict)  # used when caching is off
    executed: list[str] = field(default_factory=list)
    node: str | None = None
    step: int = 0
    success: bool = False


class Worker:
    def __init__(
        self,
        switches: Switches,
        queue: PromptQueue,
        sockets: Sockets,
        log: ComfyLog,
        files: Files,
        info: Callable[[str], dict[str, Any]],
    ) -> None:
        self.switches = switches
        self.queue = queue
        self.sockets = sockets
        self.log = log
        self.files = files
        self._info = info
        self.run: Run | None = None
        self.interrupt_requested = False  # by POST /interrupt; cleared when a check sees it, or a prompt starts
        self.cache = NodeCache(files.annotated)
        self.objects: dict[tuple[str, str], str] = {}  # (node, class) -> PreviewImage's random prefix

    async def serve(self) -> None:
        """The worker task, for the life of the process."""
        while True:
            item_id, item = await self.queue.get()
            started = time.perf_counter()
            run = await self._execute(item)
            status = {"status_str": "success" if run.success else "error", "completed": run.success, "messages": run.messages}
            self.queue.task_done(item_id, status, self._history_result(run))
            if run.client_id is not None:
                self.sockets.emit("executing", {"node": None, "prompt_id": run.prompt_id}, run.client_id)
            self.log.line(f"Prompt executed in {time.perf_counter() - started:.2f} seconds")

    # -- what node behaviours call ------------------------------------------------------------------------

    def check_interrupt(self) -> None:
        if self.interrupt_requested:
            self.interrupt_requested = False
            raise Interrupted()

    def progress(self, run: Run, uid: str, value: int, total: int, preview: bytes | None = None, *, check: bool = True) -> None:
        """ComfyUI's progress hook: interrupt check, then the progress messages."""
        if check:
            self.check_interrupt()
        run.progress.report(uid, value, total, preview)

    # -- one prompt -----------------------------------------------------------------------------------------

    async def _execute(self, item: Item) -> Run:
        number, prompt_id, prompt, extra_data, outputs_to_execute, sensitive = item
        self.interrupt_requested = False
        client_id = extra_data.get("client_id")
        progress = Progress(self.sockets, prompt_id, client_id)
        run = Run(number, prompt_id, prompt, {**extra_data, **sensitive}, list(outputs_to_execute), client_id, progress)
        self.run = run
        self.sockets.client_id = client_id
        try:
            await self._execute_run(run)
        except Exception as ex:  # a graph the fake cannot run (or a bug here): reported as a node error
            if not any(name in ("execution_error", "execution_interrupted") for name, _ in run.messages):
                self._handle_error(run, run.node or next(iter(run.prompt)), NodeFailure(full_type_name(ex), str(ex)), {})
            run.success = False
        finally:
            self.sockets.last_node_id = None
            self.run = None
        return run

    async def _execute_run(self, run: Run) -> None:
        prompt = run.prompt
        self._add_message(run, "execution_start", {"prompt_id": run.prompt_id}, broadcast=False)
        if self.switches.caching:
            run.sigs = self.cache.signatures(prompt)
            self.cache.keep_only(run.sigs.values())
        cached = [uid for uid in prompt if self._cached(run, uid)]
        await asyncio.sleep(0)
        self._add_message(run, "execution_cached", {"nodes": cached, "prompt_id": run.prompt_id}, broadcast=False)
        todo = _ExecutionList(prompt, lambda uid: self._cached(run, uid))
        for uid in run.outputs_to_execute:
            todo.add_node(uid)
        while todo.pending:
            ready = todo.next()
            if ready is None:
                failure = NodeFailure("graph.DependencyCycleError", "Dependency cycle detected", [])
                self._handle_error(run, next(iter(todo.pending)), failure, [])
                return
            if not await self._execute_node(run, ready):
                return
            todo.done(ready)
        run.success = True
        self._add_message(run, "execution_success", {"prompt_id": run.prompt_id}, broadcast=False)

    def _add_message(self, run: Run, event: str, data: dict[str, Any], broadcast: bool) -> None:
        data = {**data, "timestamp": _ms()}
        run.messages.append((event, data))
        if run.client_id is not None or broadcast:
            self.sockets.emit(event, data, run.client_id)

    def _history_result(self, run: Run) -> dict[str, Any]:
        outputs: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        for uid in run.prompt:
            ui = self._ui_of(run, uid)
            if ui is not None:
                outputs[uid] = ui["output"]
                meta[uid] = ui["meta"]
        return {"outputs": outputs, "meta": meta}

    # -- caching ----------------------------------------------------------------------------------------------

    def _cached(self, run: Run, uid: str) -> bool:
        return self.switches.caching and uid in run.sigs and run.sigs[uid] in self.cache.outputs

    def _ui_of(self, run: Run, uid: str) -> dict[str, Any] | None:
        if self.switches.caching and uid in run.sigs:
            return self.cache.ui.get(run.sigs[uid])
        return run.ui.get(uid)

    def _value_of(self, run: Run, uid: str) -> list[list[Any]]:
        if uid in run.values:
            return run.values[uid]
        return self.cache.outputs[run.sigs[uid]]

    # -- one node (execution.execute) -----------------------------------------------------------------------

    async def _execute_node(self, run: Run, uid: str) -> bool:
        node = run.prompt[uid]
        class_type = node["class_type"]
        if self._cached(run, uid):
            if run.client_id is not None:
                ui = self._ui_of(run, uid) or {}
                self.sockets.emit(
                    "executed",
                    {"node": uid, "display_node": uid, "output": ui.get("output"), "prompt_id": run.prompt_id},
                    run.client_id,
                )
            run.progress.finish(uid)
            return True
        run.progress.start(uid)
        run.node = uid
        input_data: dict[str, list[Any]] | None = None
        try:
            input_data = self._input_data(run, uid)
            if run.client_id is not None:
                self.sockets.last_node_id = uid
                self.sockets.emit("executing", {"node": uid, "display_node": uid, "prompt_id": run.prompt_id}, run.client_id)
            outputs, ui = await self._map_over_list(run, uid, class_type, input_data)
        except Interrupted:
            self.log.line("Processing interrupted")
            self._handle_interrupt(run, uid)
            return False
        except Exception as ex:
            failure = ex if isinstance(ex, NodeFailure) else NodeFailure(full_type_name(ex), str(ex))
            formatted = {k: [_format_value(v) for v in vs] for k, vs in (input_data or {}).items()}
            self.log.line(f"!!! Exception during processing !!! {failure.message}")
            self._handle_error(run, uid, failure, formatted)
            return False
        if ui:
            entry = {"meta": {"node_id": uid, "display_node": uid, "parent_node": None, "real_node_id": uid}, "output": ui}
            if self.switches.caching:
                self.cache.ui[run.sigs[uid]] = entry
            run.ui[uid] = entry
            if run.client_id is not None:
                self.sockets.emit(
                    "executed", {"node": uid, "display_node": uid, "output": ui, "prompt_id": run.prompt_id}, run.client_id
                )
        run.values[uid] = outputs
        if self.switches.caching:
            self.cache.outputs[run.sigs[uid]] = outputs
        run.progress.finish(uid)
        run.executed.append(uid)
        return True

    def _input_data(self, run: Run, uid: str) -> dict[str, list[Any]]:
        """Each input as a list: a link's output list, or the one literal value (undeclared literals dropped)."""
        node = run.prompt[uid]
        spec = self._info(node["class_type"])["input"]
        declared = set(spec.get("required", {})) | set(spec.get("optional", {}))
        data: dict[str, list[Any]] = {}
        for name, value in node["inputs"].items():
            if is_link(value):
                data[name] = list(self._value_of(run, value[0])[value[1]])
            elif name in declared:
                data[name] = [value]
        return data

    async def _map_over_list(
        self, run: Run, uid: str, class_type: str, input_data: dict[str, list[Any]]
    ) -> tuple[list[list[Any]], dict[str, list[Any]]]:
        """One call per list item (the longest input's length; shorter ones repeat their last), outputs joined."""
        info = NODE_INFO[class_type]
        behaviour = BEHAVIOURS.get(class_type)
        calls: list[dict[str, Any]]
        if class_type in INPUT_IS_LIST:
            calls = [input_data]
        elif not input_data:
            calls = [{}]
        else:
            n = max(len(v) for v in input_data.values())
            calls = [{k: v[i if len(v) > i else -1] for k, v in input_data.items()} for i in range(n)]
        results: list[tuple[Any, ...]] = []
        uis: list[dict[str, list[Any]]] = []
        for kwargs in calls:
            self.check_interrupt()  # nodes.before_node_execution()
            while self.switches.hold_node == uid:  # held by a test: an interrupt now is noticed only at the next check
                await asyncio.sleep(0.005)
            if class_type not in TIMED_BY_STEPS and self.switches.node_seconds > 0:
                await asyncio.sleep(self.switches.node_seconds)
            if behaviour is not None:
                out, ui = await behaviour(self, run, uid, kwargs)
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

    def _handle_interrupt(self, run: Run, uid: str) -> None:
        self._add_message(run, "execution_interrupted", _stopped_at(run, uid), broadcast=True)

    def _handle_error(self, run: Run, uid: str, failure: NodeFailure, current_inputs: Any) -> None:
        message = failure.message
        if failure.exception_type in ("torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"):
            message = f"{message}\n{OOM_TIPS}"
        elif failure.exception_type != "graph.DependencyCycleError":
            message = f"{message}\n"
        mes = {
            **_stopped_at(run, uid),
            "exception_message": message,
            "exception_type": failure.exception_type,
            "traceback": failure.traceback,
            "current_inputs": current_inputs,
            "current_outputs": list(run.prompt),
        }
        self._add_message(run, "execution_error", mes, broadcast=False)


class _ExecutionList:
    """ComfyUI's ExecutionList: what is left to run, a topological dissolve that prefers output nodes
    (ux_friendly_pick_node). Cached nodes are not added, unless something else needs them run."""

    def __init__(self, prompt: dict[str, Any], cached: Callable[[str], bool]) -> None:
        self._prompt = prompt
        self._cached = cached
        self.pending: dict[str, bool] = {}
        self._blockers: dict[str, set[str]] = {}
        self._blocking: dict[str, dict[str, bool]] = {}

    def add_node(self, start: str) -> None:
        stack, links = [start], []
        while stack:
            uid = stack.pop()
            if uid in self.pending:
                continue
            self.pending[uid], self._blockers[uid], self._blocking[uid] = True, set(), {}
            for value in self._prompt[uid]["inputs"].values():
                if is_link(value):
                    if not self._cached(value[0]):
                        stack.append(value[0])
                    links.append((value[0], uid))
        for src, dst in links:
            if not self._cached(src) or src in self.pending:
                self.add_node(src)
                self._blocking[src][dst] = True
                self._blockers[dst].add(src)

    def next(self) -> str | None:
        """The node to run next; None when none is ready (a dependency cycle)."""
        ready = [uid for uid in self.pending if not self._blockers[uid]]
        if not ready:
            return None
        return self._pick(ready)

    def done(self, uid: str) -> None:
        del self.pending[uid]
        for blocked in self._blocking.pop(uid):
            self._blockers[blocked].discard(uid)
        self._blockers.pop(uid)

    def _pick(self, ready: list[str]) -> str:
        def is_output(uid: str) -> bool:
            return is_output_node(self._prompt[uid]["class_type"])

        for uid in ready:
            if is_output(uid):
                return uid
        for uid in ready:
            if any(is_output(b) for b in self._blocking[uid]):
                return uid
        for uid in ready:
            for b in self._blocking[uid]:
                if b in self.pending and any(is_output(b1) for b1 in self._blocking[b]):
                    return uid
        return ready[0]


def _stopped_at(run: Run, uid: str) -> dict[str, Any]:
    """Where a prompt stopped: what execution_interrupted says, and execution_error begins with."""
    return {
        "prompt_id": run.prompt_id,
        "node_id": uid,
        "node_type": run.prompt[uid]["class_type"],
        "executed": list(run.executed),
    }


def _ms() -> int:
    return int(time.time() * 1000)


def _format_value(x: Any) -> Any:
    """An input as an error's `current_inputs` shows it: JSON scalars as they are, anything else as str()."""
    if x is None or isinstance(x, int | float | bool | str):
        return x
    return str(x)
