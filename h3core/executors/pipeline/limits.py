"""What a model folder lets the pipeline run, known before the model loads.

The clip window is the folder's fact (`h3core-model.json`, the released checkpoint's 5-15 s by
default), and the pipeline hands it to diffusers' blocks (`generate.py`), so an operator who
widens it gets longer clips. ref2va needs the `transformer_ref/` part; video references need
Qwen3-VL's video processor (torchvision, and the folder's video preprocessor config); the
reference slots are those diffusers' ref2va block enforces. The same facts give the executor's
capabilities (what admission lets in) and its own pre-check (what it refuses), so the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from h3core.domain.capabilities import MODES, Capabilities, FrameWindow, GroupBudget, ModeReadiness
from h3core.domain.geometry import FPS, snap_frames
from h3core.domain.request import GenerationRequest
from h3core.executors.base import ExecutorFailure
from h3core.executors.pipeline.model import ModelFacts


@dataclass(frozen=True)
class ModelLimits:
    """What a model folder lets the pipeline run: its facts (clip window, name), whether ref2va and
    video references are possible, and the reference slots."""

    facts: ModelFacts
    ref2va: bool  # the transformer_ref part is there
    video_references: bool  # Qwen3-VL's video processor can be built
    max_images: int
    max_videos: int
    max_audios: int
    max_references: int
    root: Path

    @classmethod
    def of(cls, root: Path) -> ModelLimits:
        """Read off the folder (no weights are loaded). Raises ModelError for a bad facts file."""
        from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep

        root = Path(root)
        block = MiniMaxH3Ref2VASetupStep()
        videos = find_spec("torchvision") is not None and (root / "processor" / "video_preprocessor_config.json").exists()
        return cls(
            facts=ModelFacts.read(root),
            ref2va=(root / "transformer_ref").is_dir(),
            video_references=videos,
            max_images=block.max_images,
            max_videos=block.max_videos,
            max_audios=block.max_audios,
            max_references=block.max_references,
            root=root,
        )

    @property
    def window(self) -> FrameWindow:
        """The clip window of the model's facts."""
        f = self.facts
        return FrameWindow(min_seconds=f.min_seconds, max_seconds=f.max_seconds, source=f"model facts of {f.name}")

    def capabilities(
        self,
        *,
        hardware: str,
        kernel: str | None,
        not_ready: str | None,
        groups: tuple[GroupBudget, ...] = (GroupBudget(size=1),),
        max_tokens: int | None = None,
        max_tokens_reason: str = "",
        topology: str | None = None,
    ) -> Capabilities:
        """The capabilities these limits give, with the executor's hardware, kernel and budgets; every
        served mode is unready with `not_ready` as the reason where that is not None."""
        modes = []
        for mode in MODES:
            if mode == "ref2va" and not self.ref2va:
                modes.append(
                    ModeReadiness(mode=mode, served=False, ready=False, reason=f"{self.root} has no transformer_ref part")
                )
            elif not_ready is not None:
                modes.append(ModeReadiness(mode=mode, ready=False, reason=not_ready))
            else:
                modes.append(ModeReadiness(mode=mode))
        media = {
            "references.images": self.max_images,
            "references.videos": self.max_videos if self.video_references else 0,
            "references.audios": self.max_audios,
        }
        return Capabilities(
            executor="pipeline",
            hardware=hardware,
            kernel=kernel,
            model=self.facts.name,
            topology=topology,
            modes=tuple(modes),
            window=self.window,
            groups=groups,
            max_tokens=max_tokens,
            max_tokens_reason=max_tokens_reason,
            media=media,
            max_references=self.max_references,
            audio_alone=False,
        )

    def check(self, request: GenerationRequest) -> None:
        """Refuse, before any work, what this model cannot do (`ExecutorFailure("invalid")`)."""
        snapped = snap_frames(request.frames)
        seconds = snapped / FPS
        f = self.facts
        if not f.min_seconds <= seconds <= f.max_seconds:
            raise ExecutorFailure(
                "invalid",
                f"frames: {request.frames} (snapped to {snapped}, {seconds:.2f} s at {FPS} fps) is outside the "
                f"{f.min_seconds:g}-{f.max_seconds:g} s this model ({f.name}) generates",
            )
        refs = request.references
        if request.mode == "ref2va" and not self.ref2va:
            raise ExecutorFailure("invalid", f"mode: ref2va needs the transformer_ref partition, which {self.root} lacks")
        if refs is None:
            return
        if refs.videos and not self.video_references:
            raise ExecutorFailure(
                "invalid", "references.videos: video references need Qwen3-VL's video processor (torchvision), not available here"
            )
        for name, given, most in (
            ("images", refs.images, self.max_images),
            ("videos", refs.videos, self.max_videos),
            ("audios", refs.audios, self.max_audios),
        ):
            if len(given) > most:
                raise ExecutorFailure("invalid", f"references.{name}: MiniMax-H3 takes at most {most}, got {len(given)}")
        if refs.count() > self.max_references:
            raise ExecutorFailure(
                "invalid", f"references: MiniMax-H3 takes at most {self.max_references} in all, got {refs.count()}"
            )
        if refs.audios and not (refs.images or refs.videos):
            raise ExecutorFailure("invalid", "references.audios: an audio reference needs an image or video reference beside it")


def kernel_limit(plan) -> dict:
    """The attention plan's own bound on a sequence, as capabilities state it (none: unbounded)."""
    if plan.max_tokens is None:
        return {}
    return {"max_tokens": plan.max_tokens, "max_tokens_reason": f"only the quadratic MATH kernel runs here ({plan.describe()})"}
