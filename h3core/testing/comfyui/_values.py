"""What flows between fake nodes: tokens that stand for tensors and models, never the data itself.

Each prints like the value ComfyUI would show in an error's `current_inputs`. A link, the input
that carries one from node to node, is [node id, output index] (`is_link`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Images:
    n: int
    width: int
    height: int
    color: int = 0x808080

    def __str__(self) -> str:
        return f"tensor(<{self.n}x{self.height}x{self.width}x3 float32 image>)"


@dataclass(frozen=True)
class Latent:
    frames: int
    width: int
    height: int

    def __str__(self) -> str:
        return f"{{'samples': tensor(<latent {self.frames} frames {self.width}x{self.height}>)}}"


@dataclass(frozen=True)
class Sigmas:
    steps: int

    def __str__(self) -> str:
        return f"tensor(<{self.steps + 1} sigmas>)"


@dataclass(frozen=True)
class Audio:
    seconds: float
    sample_rate: int = 44100

    def __str__(self) -> str:
        return f"{{'waveform': tensor(<2 x {int(self.seconds * self.sample_rate)}>), 'sample_rate': {self.sample_rate}}}"


@dataclass(frozen=True)
class Video:
    frames: int
    width: int
    height: int
    fps: float
    audio: Audio | None

    def __str__(self) -> str:
        return f"<VideoFromComponents {self.frames} frames {self.width}x{self.height} @ {self.fps}>"


@dataclass(frozen=True)
class Token:
    """Any other node output (MODEL, CLIP, CONDITIONING, ...)."""

    type: str
    node: str

    def __str__(self) -> str:
        return f"<{self.type} from node {self.node}>"


def is_link(v: Any) -> bool:
    """A node input that takes another node's output: [node id, output index]."""
    return isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], int)
