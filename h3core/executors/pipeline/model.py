"""Load a MiniMax-H3 model folder once, from local files only, and keep it resident.

The folder has the diffusers layout: one subfolder per component (`transformer/`,
`transformer_ref/`, `vae/`, `audio_vae/`, `scheduler/`, `audio_scheduler/`, `text_encoder/`,
`tokenizer/`, `processor/`). Only `transformer_ref/` is optional (without it, ref2va is
refused). Nothing is fetched: every load passes `local_files_only=True`.

An optional `h3core-model.json` states facts about the checkpoint that are not in its configs
(its name, the clip lengths it was trained for); the released model's are the defaults.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h3core.executors.reports import DeviceMemory

FACTS_FILE = "h3core-model.json"
REQUIRED = ("transformer", "vae", "audio_vae", "scheduler", "audio_scheduler", "text_encoder", "tokenizer", "processor")
OPTIONAL = ("transformer_ref",)
PLACEABLE = ("text_encoder", "vae")  # parts that may live on another device than the transformer


class ModelError(Exception):
    """The model folder cannot be loaded as asked; the message says which part and why."""


@dataclass(frozen=True)
class ModelFacts:
    """What a checkpoint's configs do not say: its name and the clip lengths it was trained for."""

    name: str = "minimax-h3"
    min_seconds: float = 5.0  # the released checkpoint's window (diffusers refuses outside it)
    max_seconds: float = 15.0

    @classmethod
    def read(cls, root: Path) -> ModelFacts:
        """The folder's `h3core-model.json`, or the released model's facts without one; raises `ModelError`
        for a file that is not valid JSON or has a key the facts do not have."""
        path = root / FACTS_FILE
        if not path.exists():
            return cls()
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:  # bad JSON, or a key these facts do not have
            raise ModelError(f"{path}: {exc}") from exc


@dataclass
class LoadedModel:
    """Every component, resident on its device, and what loading them cost."""

    root: Path
    facts: ModelFacts
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    components: dict[str, Any]
    load_seconds: dict[str, float] = field(default_factory=dict)
    placement: dict[str, Any] = field(default_factory=dict)  # part -> torch.device, where not `device`

    def device_of(self, part: str):
        """Where a part runs: "text_encoder" and "vae" (both VAEs) may be placed apart from the transformer."""
        return self.placement.get(part, self.device)

    def has(self, name: str) -> bool:
        """Whether the component `name` was loaded (`transformer_ref` is optional)."""
        return self.components.get(name) is not None

    @property
    def video_processor_available(self) -> bool:
        """Whether the processor has a video processor, so video references can be read."""
        return getattr(self.components["processor"], "video_processor", None) is not None


def image_processor_class():
    """Qwen2-VL's image processor; the PIL one when torchvision is absent.

    The fast processor needs torchvision, and PyPI's torchvision does not import beside a CPU
    torch wheel; the PIL one computes the same pixel patches.
    """
    try:
        import torchvision  # noqa: F401
    except ImportError:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor


def make_processor(tokenizer, image_processor, video_processor=None):
    """A Qwen3-VL processor, allowing no video processor when torchvision is absent.

    transformers checks each slot's class through a registry that, without torchvision, has no
    video-processor entries at all, so an empty video slot fails that check; the processor itself
    only needs the video processor for video inputs, which the executor refuses up front then.
    """
    from transformers import Qwen3VLProcessor

    class _Processor(Qwen3VLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return _Processor(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor)


def device_name(device: str) -> str:
    """What a torch device is, as capacity profiles name hardware ("NVIDIA H200", "cpu")."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return dev.type


def device_memory(device: str) -> DeviceMemory | None:
    """A CUDA device's memory as the driver counts it, with what this process's allocator holds
    (reserved: what other processes cannot have); None for any other device."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(dev)
    name = f"{dev} {torch.cuda.get_device_name(dev)}"
    return DeviceMemory(name=name, total_bytes=total, free_bytes=free, held_bytes=torch.cuda.memory_reserved(dev))


def attention_geometry(root: Path) -> tuple[int, int]:
    """(heads, head dim) of the transformer's attention, from its config (no weights are read)."""
    path = Path(root) / "transformer" / "config.json"
    try:
        config = json.loads(path.read_text())
        return int(config["num_attention_heads"]), int(config["attention_head_dim"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{path}: cannot read the attention geometry ({type(exc).__name__}: {exc})") from exc


def missing_parts(root: Path) -> list[str]:
    """The required component folders `root` lacks (cheap: for a start-up check before loading)."""
    return [name for name in REQUIRED if not (Path(root) / name).is_dir()]


def quiet_progress_bars() -> None:
    """A service logs; it does not draw tqdm bars for every shard it loads or writes."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


def load_model(
    root: Path,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    load_transformer: Callable[[Path], Any] | None = None,
    placement: Mapping[str, str] | None = None,
) -> LoadedModel:
    """Load every component of the folder onto `device`; raises `ModelError` naming the part.

    `load_transformer(path)` replaces the plain load of `transformer/` and `transformer_ref/` (a
    rank of a group loads them sharded). `placement` puts "text_encoder" or "vae" (both VAEs) on
    another device, e.g. the text encoder in host memory beside a GPU-resident transformer.
    """
    import torch
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )
    from transformers import Qwen2Tokenizer, Qwen3VLForConditionalGeneration  # transformers 5: Qwen2TokenizerFast is its alias

    quiet_progress_bars()
    root = Path(root)
    if not root.is_dir():
        raise ModelError(f"model folder {root} does not exist")
    missing = missing_parts(root)
    if missing:
        raise ModelError(f"model folder {root} lacks {', '.join(missing)} (diffusers layout, one subfolder per component)")
    unknown = set(placement or {}) - set(PLACEABLE)
    if unknown:
        raise ModelError(f"placement: only {', '.join(PLACEABLE)} can be placed apart, not {', '.join(sorted(unknown))}")
    try:
        torch_dtype = getattr(torch, dtype)
        torch_device = torch.device(device)
        placed = {part: torch.device(d) for part, d in (placement or {}).items() if torch.device(d) != torch_device}
    except (AttributeError, RuntimeError) as exc:
        raise ModelError(f"bad device/dtype {device!r}/{dtype!r}/{dict(placement or {})}: {exc}") from exc
    facts = ModelFacts.read(root)
    seconds: dict[str, float] = {}
    comps: dict[str, Any] = {}

    def timed(name: str, load):
        t0 = time.perf_counter()
        try:
            comps[name] = load(root / name)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
            raise ModelError(f"cannot load {name} from {root / name}: {type(exc).__name__}: {exc}") from exc
        seconds[name] = time.perf_counter() - t0

    def model(cls, part: str = "transformer"):
        target = placed.get(part, torch_device)
        return lambda path: cls.from_pretrained(path, local_files_only=True, torch_dtype=torch_dtype).to(target).eval()

    transformer = load_transformer or model(MiniMaxH3Transformer3DModel)
    timed("transformer", transformer)
    if (root / "transformer_ref").is_dir():
        timed("transformer_ref", transformer)
    timed("vae", model(AutoencoderKLMiniMaxH3, "vae"))
    timed("audio_vae", model(AutoencoderKLMiniMaxH3Audio, "vae"))
    timed("scheduler", lambda p: MiniMaxH3Scheduler.from_pretrained(p, local_files_only=True))
    timed("audio_scheduler", lambda p: MiniMaxH3Scheduler.from_pretrained(p, local_files_only=True))
    timed("text_encoder", model(Qwen3VLForConditionalGeneration, "text_encoder"))
    timed("tokenizer", lambda p: Qwen2Tokenizer.from_pretrained(p, local_files_only=True))
    timed(
        "processor",
        lambda p: make_processor(
            comps["tokenizer"], image_processor_class().from_pretrained(p, local_files_only=True), _video_processor(p)
        ),
    )
    return LoadedModel(root, facts, torch_device, torch_dtype, comps, seconds, placed)


def _video_processor(path: Path):
    """Qwen3-VL's video processor when torchvision is importable and the folder configures one."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return None
    if not (path / "video_preprocessor_config.json").exists():
        return None
    from transformers import Qwen3VLVideoProcessor

    return Qwen3VLVideoProcessor.from_pretrained(path, local_files_only=True)
