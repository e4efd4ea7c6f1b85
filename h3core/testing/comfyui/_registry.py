"""The node registry: each class's `/object_info` entry, loaded once from the JSON files beside this module.

`object_info_stock.json` was copied verbatim from `GET /object_info` of a stock ComfyUI 0.3.64 (the
recording of h3core/testing/comfyui_protocol/; its 488 KB object_info.json is not copied), except that
`CLIPLoader.type` also lists "minimax". `object_info_extra.json` is written by hand: classes of
MiniMax-H3 and Raylight, and two stock audio classes that the recorded server did not load (its
torchaudio import failed). Their specs follow the workflow templates in
`h3core/executors/comfyui/workflows/`; defaults and ranges not given there are plausible guesses.

Combo lists that depend on files (`LoadImage.image`, `LoadVideo.file`, `LoadAudio.audio`, model
names) are filled in at request time (`object_info`); see `FILE_INPUTS` and `MODEL_INPUTS`.
What a node does when it runs is code, in `_nodes.py`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(name: str) -> dict[str, dict[str, Any]]:
    return json.loads((Path(__file__).parent / name).read_text(encoding="utf-8"))


STOCK_NODES: dict[str, dict[str, Any]] = _load("object_info_stock.json")
EXTRA_NODES: dict[str, dict[str, Any]] = _load("object_info_extra.json")
NODE_INFO: dict[str, dict[str, Any]] = {**STOCK_NODES, **EXTRA_NODES}

# (class, input) -> model folder; the options come from `FakeComfyUI.model_files`.
MODEL_INPUTS: dict[tuple[str, str], str] = {
    ("UNETLoader", "unet_name"): "diffusion_models",
    ("RayUNETLoader", "unet_name"): "diffusion_models",
    ("CLIPLoader", "clip_name"): "text_encoders",
    ("VAELoader", "vae_name"): "vae",
    ("CheckpointLoaderSimple", "ckpt_name"): "checkpoints",
}

# (class, input) -> (content types listed from input/, what its custom validation says when missing)
FILE_INPUTS: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("LoadImage", "image"): (("image",), "Invalid image file: {}"),
    ("LoadVideo", "file"): (("video",), "Invalid video file: {}"),
    ("LoadAudio", "audio"): (("audio", "video"), "Invalid audio file: {}"),
}


def is_output_node(class_type: str) -> bool:
    return NODE_INFO[class_type]["output_node"] is True


def object_info(
    class_type: str, input_files: Callable[[tuple[str, ...]], list[str]], model_files: dict[str, list[str]] | None
) -> dict[str, Any]:
    """A private copy of a class's /object_info entry, with the file and model lists of now."""
    info = copy.deepcopy(NODE_INFO[class_type])
    for (cls, name), (kinds, _) in FILE_INPUTS.items():
        if cls == class_type:
            spec = info["input"]["required"][name]
            if spec[0] == "COMBO":
                spec[1]["options"] = input_files(kinds)
            else:
                spec[0] = input_files(kinds)
    for (cls, name), folder in MODEL_INPUTS.items():
        if cls == class_type:
            spec = info["input"]["required"][name]
            names = sorted((model_files or {}).get(folder, []))
            spec[0] = names + (["pixel_space"] if folder == "vae" else [])
    return info
