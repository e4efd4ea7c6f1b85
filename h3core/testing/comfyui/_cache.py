"""Node outputs kept across prompts: ComfyUI's classic cache, keyed like CacheKeySetInputSignature.

A node's signature hashes its class, its IS_CHANGED value and its inputs, a link standing for the
linked node's own signature; a node whose signature is in the cache is not run again. Each prompt
keeps only the entries its own nodes have (the classic cache forgets the rest).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ._registry import FILE_INPUTS
from ._values import is_link


class NodeCache:
    def __init__(self, annotated: Callable[[str], tuple[str, Path]]) -> None:
        self.outputs: dict[str, list[list[Any]]] = {}  # signature -> per output, per list item
        self.ui: dict[str, dict[str, Any]] = {}  # signature -> {"meta", "output"}, of output nodes
        self._annotated = annotated

    def keep_only(self, signatures: Iterable[str]) -> None:
        keep = set(signatures)
        self.outputs = {k: v for k, v in self.outputs.items() if k in keep}
        self.ui = {k: v for k, v in self.ui.items() if k in keep}

    def signatures(self, prompt: dict[str, Any]) -> dict[str, str]:
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
                parts.append([key, ["ANCESTOR", sig(value[0]), value[1]] if is_link(value) else value])
            visiting.discard(uid)
            sigs[uid] = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()
            return sigs[uid]

        for uid in prompt:
            sig(uid)
        return sigs

    def _is_changed(self, node: dict[str, Any]) -> Any:
        """The node's IS_CHANGED: a loaded file's hash; for SaveImageWebsocket, new every time."""
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
