"""The server the fake plays: the recorded ComfyUI 0.3.64's features, model folders and machine."""

from __future__ import annotations

import sys
from typing import Any

SERVER_FEATURES = {"supports_preview_metadata": True, "max_upload_size": 104857600}
RAM_TOTAL = 25276063744  # the recorded server's; EmptyImage bigger than this fails like it did
MODEL_FOLDERS = [
    "checkpoints",
    "configs",
    "loras",
    "vae",
    "text_encoders",
    "diffusion_models",
    "clip_vision",
    "style_models",
    "embeddings",
    "diffusers",
    "vae_approx",
    "controlnet",
    "gligen",
    "upscale_models",
    "custom_nodes",
    "hypernetworks",
    "photomaker",
    "classifiers",
    "model_patches",
    "audio_encoders",
]


def system_stats(port: int) -> dict[str, Any]:
    """GET /system_stats: the recorded server's answer, on one H200, with this fake's port and Python."""
    vram = 150_754_820_096
    return {
        "system": {
            "os": "posix",
            "ram_total": RAM_TOTAL,
            "ram_free": 24194351104,
            "comfyui_version": "0.3.64",
            "required_frontend_version": "1.27.10",
            "installed_templates_version": "0.1.95",
            "required_templates_version": "0.1.95",
            "python_version": sys.version,
            "pytorch_version": "2.14.1+cu130",
            "embedded_python": False,
            "argv": ["main.py", "--listen", "127.0.0.1", "--port", str(port)],
        },
        "devices": [
            {
                "name": "cuda:0 NVIDIA H200 : cudaMallocAsync",
                "type": "cuda",
                "index": 0,
                "vram_total": vram,
                "vram_free": vram - 2**30,
                "torch_vram_total": 0,
                "torch_vram_free": 0,
            }
        ],
    }
