"""One MiniMax-H3 job, run in stages over the resident model (synchronous; the executor calls
it from a worker thread).

The stages are diffusers' own blocks (`MiniMaxH3Blocks`: before_encode, text_encoder,
vae_encoder, denoise, decode), each wrapped in its own pipeline over the same components, so
that h3core can time each one, skip the text encoder when the prompt's embeddings are cached,
and stop between steps. A block inserted at the end of every denoising loop reports each step
and raises `StopRequested` once the executor asks the job to stop; it derives from
BaseException so diffusers' per-block error logging does not treat a requested stop as a
failure.

Checkpoints: that block also copies what the loop carries (the video and audio latents, both
schedulers' step index, the generator's state) off the device when the job's policy says one is
due, or where a stop asked for one, and hands it to `Control.on_checkpoint`. Each denoising loop
runs as `_Resumable`, which starts at a checkpoint's step with its state put back: every stage
before the loop runs again (the same inputs draw the same noise), and the loop skips the steps
the checkpoint holds, so the video is the uninterrupted one.

A request at a faster quality level runs with its step cache enabled on the loop's transformer for
that job only (`caching.step_cache`), each iteration inside the cache's context; `Output.cache`
counts the steps computed and served from it (`exact`: every step computed).

On a group of ranks (`Control.agree`), every decision taken between stages and steps (stop,
checkpoint) is the group's: each rank offers its own and gets rank 0's back, so all ranks leave
the loop at the same boundary and count the same checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from h3core.domain.checkpoints import CheckpointPolicy
from h3core.domain.geometry import snap_frames
from h3core.domain.quality import StepCounts
from h3core.domain.request import GenerationRequest
from h3core.executors.base import ExecutorFailure
from h3core.executors.pipeline.attention import AttentionPlan, install
from h3core.executors.pipeline.caching import step_cache
from h3core.executors.pipeline.limits import ModelLimits
from h3core.executors.pipeline.model import LoadedModel

STAGES = ("before_encode", "text_encoder", "vae_encoder", "denoise", "decode")
# The part whose device a stage runs on (the text encoder and the VAEs may be placed apart).
STAGE_PART = {
    "before_encode": "transformer",
    "text_encoder": "text_encoder",
    "vae_encoder": "vae",
    "denoise": "transformer",
    "decode": "vae",
}


class StopRequested(BaseException):
    """The executor asked the running job to stop at the next step boundary."""


@dataclass(frozen=True)
class Media:
    """The job's uploads as local files, in the order the request lists them."""

    first: Path | None = None
    last: Path | None = None
    images: tuple[Path, ...] = ()
    videos: tuple[Path, ...] = ()
    audios: tuple[Path, ...] = ()


@dataclass
class Output:
    """What one job made: the video and its sound (empty where the job did not decode), the steps it
    ran, and the seconds each stage and each step took."""

    frames: np.ndarray  # uint8 [T, H, W, 3]
    audio: np.ndarray  # float32 [2, samples] in [-1, 1]
    sample_rate: int
    steps: int
    seconds: dict[str, float] = field(default_factory=dict)  # per stage
    step_seconds: list[float] = field(default_factory=list)
    encoded: bool = True  # False when the prompt embeddings came from the cache
    raw: np.ndarray | None = None  # float32 [T, H, W, 3] in [0, 1], before rounding (when asked for)
    checkpoints: list[int] = field(default_factory=list)  # the steps checkpointed (on a group: as agreed)
    cache: StepCounts | None = None  # the steps computed and served from the step cache, at the request's level


# A checkpoint's layout: bumped when what it holds changes, so that an old one is refused, not misread.
CHECKPOINT_FORMAT = 1


@dataclass
class Control:
    """What a running job shares with the thread that drives it."""

    on_step: Callable[[int, int], None] = lambda step, total: None
    on_stage: Callable[[str], None] = lambda stage: None
    stop: threading.Event = field(default_factory=threading.Event)
    decode: bool = True  # False: stop after denoising (a rank that is not the one returning the video)
    keep_raw: bool = False  # also return the decoded video before it is rounded to 8 bits
    checkpoints: CheckpointPolicy | None = None  # when to hand a checkpoint to `on_checkpoint`
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None  # the loop's state on the host, after its step
    save_on_stop: bool = False  # a stop also hands over a checkpoint of the last step reached
    resume: dict[str, Any] | None = None  # a checkpoint to continue from (`load_checkpoint`'s)
    on_saved: Callable[[Any], None] = lambda saved: None  # where the executor reports a stored checkpoint
    # A group's agreement: (stop, checkpoint) as this rank would decide them in, rank 0's decision out (one
    # collective, at the same points on every rank). None: this process decides alone.
    agree: Callable[[bool, bool], tuple[bool, bool]] | None = None
    # Signs of life inside a long stage (a decoder's modules, the encoder's frames), at most one per
    # this many seconds: a 15 s clip's decode and encode take minutes on a slow box, without a step.
    alive_every_s: float = 1.0
    _alive_at: float = field(default=0.0, repr=False)

    def alive(self, stage: str) -> None:
        """Say the job is alive in `stage` (`on_stage`), unless it said so within `alive_every_s`."""
        now = time.monotonic()
        if now - self._alive_at >= self.alive_every_s:
            self._alive_at = now
            self.on_stage(stage)

    def decided(self, stop: bool, save: bool = False) -> tuple[bool, bool]:
        """(stop, checkpoint) as decided here, or as the group agreed (`agree`)."""
        return self.agree(stop, save) if self.agree is not None else (stop, save)


class Generator:
    """The resident model plus one pipeline per stage; runs one job at a time."""

    def __init__(self, model: LoadedModel, plan: AttentionPlan, *, cache_size: int = 32) -> None:
        # From its own module: mypy reads the package's name as diffusers' dummy placeholder class.
        from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3Blocks

        self.model = model
        self.plan = plan
        # The window diffusers is given (the model's facts) is the one the pre-check enforces.
        self.limits = dataclasses.replace(ModelLimits.of(model.root), facts=model.facts)
        self.cache: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
        self.cache_size = cache_size
        self.encodes = 0  # text-encoder runs, for tests and metrics
        self.cache_hits = 0
        self.jobs = 0
        with quiet("diffusers.models.modeling_utils"):  # "attention backends are experimental", once per model
            for name in ("transformer", "transformer_ref"):
                if model.has(name):
                    install(model.components[name], plan)
            # diffusers' set_attention_backend also moves the global default; the VAEs keep native SDPA.
            for name in ("vae", "audio_vae"):
                _native(model.components[name])
        blocks = MiniMaxH3Blocks()
        for core in blocks.sub_blocks["denoise"].sub_blocks.values():
            loop = core.sub_blocks["denoise"]
            loop.__class__ = _resumable(type(loop))
            loop.sub_blocks["h3core_step"] = _step_block()
            loop.set_progress_bar_config(disable=True)  # progress is the job's events, not a tqdm bar
        pipeline_class = _pipeline_class()
        self.stages = {}
        for name in STAGES:
            pipe = pipeline_class(blocks=blocks.sub_blocks[name])
            # Every stage sees every component: geometry (latent channels, patch size) is read off the VAE and
            # the transformer even by stages that do not run them.
            pipe.register_components(**{k: v for k, v in model.components.items() if k in pipe._component_specs})
            for k, v in model.components.items():
                if k not in pipe._component_specs:
                    object.__setattr__(pipe, k, v)  # read-only use: the geometry properties
            pipe.set_progress_bar_config(disable=True)
            pipe.h3_facts = model.facts
            pipe.h3_device = model.device_of(STAGE_PART[name])
            self.stages[name] = pipe
        self._stage_inputs = {name: {i.name for i in blocks.sub_blocks[name].inputs if i.name} for name in STAGES}
        self._encoder_outputs = tuple(o.name for o in blocks.sub_blocks["text_encoder"].intermediate_outputs)

    @property
    def last_tokens(self) -> int | None:
        """Length of the packed sequence of the last transformer call (set by the attention guard)."""
        for name in ("transformer", "transformer_ref"):
            tokens = getattr(self.model.components.get(name), "_h3_tokens", None)
            if tokens:
                return tokens
        return None

    def check(self, request: GenerationRequest, media: Media) -> None:
        """Refuse, before any work, what this model cannot do (ExecutorFailure 'invalid')."""
        self.limits.check(request)

    def run(self, request: GenerationRequest, media: Media, control: Control) -> Output:
        """Run one job through every stage, reporting steps and stages through `control`; raises
        `StopRequested` once `control.stop` is set (checked between stages and after each step), and
        `ExecutorFailure("invalid")` for a request the model refuses before its first step."""
        import torch

        self.check(request, media)
        self.jobs += 1
        for name in ("transformer", "transformer_ref"):
            if self.model.has(name):
                self.model.components[name]._h3_tokens = None
        seconds: dict[str, float] = {}
        step_seconds: list[float] = []
        inputs = self._inputs(request, media)
        key = _cache_key(request)
        state: Any = None  # diffusers' PipelineState, from the first stage on
        encoded = True
        last = time.perf_counter()
        mark, generator = fingerprint(request), inputs["generator"]
        if control.resume is not None and control.resume.get("fingerprint") != mark:
            raise ExecutorFailure("executor_error", "the checkpoint is not of this request (its fingerprint differs)")
        saved_step: int = control.resume["step"] if control.resume is not None else 0
        saved_at = time.perf_counter()
        checkpointed: list[int] = []

        def after_step(i: int, total: int, components: Any, block_state: Any) -> None:
            nonlocal last, saved_step, saved_at
            now = time.perf_counter()
            step_seconds.append(now - last)
            last = now
            step = i + 1
            control.on_step(step, total)
            stop = control.stop.is_set()
            policy, hand = control.checkpoints, control.on_checkpoint
            due = policy is not None and policy.due(step, total, saved_step, now - saved_at)
            save = hand is not None and (due or (stop and control.save_on_stop and saved_step < step < total))
            # One agreement for both, before the next step starts: on a group every rank learns here whether this
            # step is checkpointed (rank 0's policy and clock decide) and whether the loop ends after it.
            stop, save = control.decided(stop, save)
            if save:
                checkpointed.append(step)
                if hand is not None:  # on a group: rank 0's (the others hold the same state, and agree only)
                    copying = time.perf_counter()
                    held = _snapshot(components, block_state, generator, step, total, mark)
                    held["copy_s"] = time.perf_counter() - copying  # the loop's wait for the copy off the device
                    hand(held)
                saved_step, saved_at = step, time.perf_counter()
            if stop:
                raise StopRequested

        # The level's step cache on the loop's denoiser, for this job only (removed on the way out).
        denoiser = self.model.components["transformer_ref" if request.mode == "ref2va" else "transformer"]
        scope = contextlib.ExitStack()
        cache = scope.enter_context(step_cache(denoiser, request.quality))
        for pipe in self.stages.values():
            pipe.h3_after_step = after_step
            pipe.h3_resume = control.resume
            pipe.h3_generator = generator
            pipe.h3_step_context = cache.step if cache is not None else None

        def counted() -> StepCounts:  # `exact` computed every step this attempt ran
            return cache.counts() if cache is not None else StepCounts(quality="exact", computed=len(step_seconds), cached=0)

        try:
            for name in STAGES:
                if control.decided(control.stop.is_set())[0]:
                    raise StopRequested
                if name == "decode" and not control.decode:
                    return Output(
                        np.zeros((0, 0, 0, 3), np.uint8),
                        np.zeros((2, 0), np.float32),
                        0,
                        len(step_seconds),
                        seconds,
                        step_seconds,
                        encoded,
                        checkpoints=checkpointed,
                        cache=counted(),
                    )
                control.on_stage(name)
                t0 = time.perf_counter()
                if name == "text_encoder" and key in self.cache:
                    self.cache.move_to_end(key)
                    self.cache_hits += 1
                    encoded = False
                    for k, v in self.cache[key].items():
                        state.set(k, v)
                else:
                    if name == "denoise":
                        last = time.perf_counter()

                    def before_steps(stage: str = name) -> bool:
                        return stage != "decode" and not step_seconds

                    with self._alive_while(name, control):
                        state = self._stage(name, state, inputs, before_steps=before_steps)
                    if name == "text_encoder":
                        self.encodes += 1
                        self._remember(key, {k: state.get(k) for k in self._encoder_outputs})
                seconds[name] = time.perf_counter() - t0
            videos, audio, rate = state.get("videos"), state.get("audio"), state.get("sampling_rate")
            raw = np.clip(np.asarray(videos[0], dtype=np.float32), 0.0, 1.0)
            frames = (raw * 255.0).round().astype(np.uint8)
            sound = np.clip(audio[0].float().cpu().numpy(), -1.0, 1.0).astype(np.float32)
            kept = raw if control.keep_raw else None
            return Output(
                frames, sound, int(rate), len(step_seconds), seconds, step_seconds, encoded, kept, checkpointed, counted()
            )
        finally:
            del state, inputs  # the job's tensors are released before the collection below
            scope.close()  # the cache's hooks and state go: the next job finds the model as it was
            for pipe in self.stages.values():
                pipe.h3_after_step = pipe.h3_resume = pipe.h3_generator = pipe.h3_step_context = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    @contextlib.contextmanager
    def _alive_while(self, name: str, control: Control) -> Iterator[None]:
        """While the decode stage runs, each forward of a VAE's module is a sign of life (the stage
        has no steps to report; a long clip's decode may outlast the stall timeout)."""
        parts = [self.model.components.get(k) for k in ("vae", "audio_vae")] if name == "decode" else []
        hooks = [m.register_forward_hook(lambda *_: control.alive(name)) for p in parts if p is not None for m in p.modules()]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def _stage(self, name: str, state, inputs: dict[str, Any], *, before_steps: Callable[[], bool]):
        pipe = self.stages[name]
        if state is not None:
            hand_off(state, name, pipe.h3_device)
        try:
            # Every stage gets the request's inputs (a stage keeps only those its blocks declare).
            return pipe(state=state, **{k: v for k, v in inputs.items() if k in self._stage_inputs[name]})
        except ValueError as exc:
            # diffusers checks its inputs with ValueError; before the first step that is a refusal of the request.
            if before_steps():
                raise ExecutorFailure("invalid", f"{name}: {exc}") from exc
            raise

    def _inputs(self, request: GenerationRequest, media: Media) -> dict[str, Any]:
        import torch

        out: dict[str, Any] = {
            "prompt": request.prompt,
            "height": request.height,
            "width": request.width,
            # The count the model makes (17n + 5): diffusers' ref2va blocks snap it for the encoder
            # but hand the raw count to the denoiser, which refuses anything unsnapped.
            "num_frames": snap_frames(request.frames),
            # The scheduler's grid has one more point than there are model evaluations.
            "num_inference_steps": request.steps + 1,
            # A CPU generator draws the same noise whatever the device, so a seed means one video.
            "generator": torch.Generator(device="cpu").manual_seed(request.seed),
            "output_type": "np",
        }
        if request.mode == "fl2va":
            from PIL import Image

            if media.first is not None:
                out["image"] = Image.open(media.first).convert("RGB")
            if media.last is not None:
                out["last_image"] = Image.open(media.last).convert("RGB")
        elif request.mode == "ref2va":
            from diffusers.modular_pipelines.minimax_h3 import (
                MiniMaxH3AudioReference,
                MiniMaxH3ImageReference,
                MiniMaxH3VideoReference,
            )

            refs: list[Any] = [MiniMaxH3ImageReference.from_file(str(p)) for p in media.images]
            refs += [MiniMaxH3VideoReference.from_file(str(p)) for p in media.videos]
            refs += [MiniMaxH3AudioReference.from_file(str(p)) for p in media.audios]
            out["references"] = refs
        return out

    def remember_encoding(self, request: GenerationRequest, values: dict[str, Any]) -> None:
        """Keep `values` (the text encoder's outputs: `prompt_embeds`, `text_token_tags`) as the
        encoding of `request`'s prompt, so its run skips the text encoder (the capacity probe runs
        without one, on embeddings of the right shape)."""
        self._remember(_cache_key(request), values)

    def _remember(self, key: tuple, value: dict[str, Any]) -> None:
        if self.cache_size <= 0:
            return
        self.cache[key] = value
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)


# What a stage feeds its model as it finds it in the state, per stage (diffusers 0.42.1's MiniMax-H3
# blocks): these must be on the device of that stage's part. Everything else a stage leaves stays where
# it is: the blocks keep their bookkeeping on the host (`text_token_tags` indexes host tensors in the
# layout step) and move what else they need themselves (conditioning latents, the layout's indices).
MODEL_INPUTS: dict[str, tuple[str, ...]] = {
    "denoise": ("prompt_embeds",),  # the transformer's encoder_hidden_states
    "decode": ("latents", "audio_latents"),  # what the VAEs decode
}


def hand_off(state, stage: str, device) -> None:
    """Move the tensors `stage` hands straight to its model onto `device`, and nothing else."""
    import torch

    for key in MODEL_INPUTS.get(stage, ()):
        value = state.get(key)
        if isinstance(value, torch.Tensor) and value.device != device:
            state.set(key, value.to(device))


def _cache_key(request: GenerationRequest) -> tuple:
    """What the text encoder's output depends on: the prompt and the conditioning media.

    Keyframes are put on the canvas before they are encoded, and video references are cut to
    the clip, so the canvas and the frame count are part of the key where media is present.
    """
    if request.mode == "t2va":
        return ("t2va", request.prompt)
    return (request.mode, request.prompt, request.upload_ids(), request.width, request.height, request.frames)


@contextlib.contextmanager
def quiet(logger: str):
    """Let `logger` log only errors inside the block, then restore its level."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _native(model) -> None:
    try:
        model.set_attention_backend("native")
    except (ValueError, AttributeError):  # a model with no diffusers attention modules
        pass


def _pipeline_class():
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ModularPipeline

    class H3Pipeline(MiniMaxH3ModularPipeline):
        """diffusers' pipeline with the clip window from the model's facts and a step callback."""

        h3_facts = None
        h3_after_step = None
        h3_resume = None  # a checkpoint the denoising loop starts from
        h3_generator = None  # the request's generator, whose state a checkpoint carries
        h3_device = None  # where this stage runs (diffusers' blocks place their tensors on `_execution_device`)
        h3_step_context = None  # the context each denoising iteration runs in (the step cache's), if any

        @property
        def _execution_device(self):
            return self.h3_device if self.h3_device is not None else super()._execution_device

        @property
        def min_duration(self):
            return self.h3_facts.min_seconds if self.h3_facts else super().min_duration

        @property
        def max_duration(self):
            return self.h3_facts.max_seconds if self.h3_facts else super().max_duration

    return H3Pipeline


def _step_block():
    from diffusers.modular_pipelines import ModularPipelineBlocks

    class StepBlock(ModularPipelineBlocks):
        """Runs last in every denoising iteration: reports the step, stops if asked."""

        model_name = "minimax-h3"

        @property
        def description(self) -> str:
            return "h3core: report the finished step and stop between steps when asked"

        @property
        def inputs(self):
            return []

        @property
        def intermediate_outputs(self):
            return []

        def __call__(self, components, block_state, i, t):
            callback = getattr(components, "h3_after_step", None)
            if callback is not None:
                callback(i, len(block_state.timesteps), components, block_state)
            return components, block_state

    return StepBlock()


def fingerprint(request: GenerationRequest) -> dict[str, Any]:
    """What a checkpoint must have been made for: the request's fields that shape the loop."""
    # `exact` is left out, so that a checkpoint written before the field existed still matches.
    exclude = {"fps", "quality"} if request.quality == "exact" else {"fps"}
    return {"format": CHECKPOINT_FORMAT, **request.model_dump(mode="json", exclude=exclude)}


def _snapshot(components: Any, block_state: Any, generator: Any, step: int, total: int, mark: dict[str, Any]) -> dict[str, Any]:
    """The loop's state after `step`, on the host (the one copy off the device the loop waits for)."""
    return {
        "fingerprint": mark,
        "step": step,
        "total": total,
        "latents": block_state.latents.detach().to("cpu", copy=True),
        "audio_latents": block_state.audio_latents.detach().to("cpu", copy=True),
        "scheduler": _scheduler_state(components.scheduler),
        "audio_scheduler": _scheduler_state(components.audio_scheduler),
        "generator": generator.get_state() if generator is not None else None,
    }


def _scheduler_state(scheduler: Any) -> dict[str, int | None]:
    return {"step_index": scheduler._step_index, "begin_index": scheduler._begin_index}


def _restore(components: Any, block_state: Any, held: dict[str, Any]) -> None:
    """Put a checkpoint's state back into the loop about to run its next step."""
    like = block_state.latents
    block_state.latents = held["latents"].to(device=like.device, dtype=like.dtype)
    like = block_state.audio_latents
    block_state.audio_latents = held["audio_latents"].to(device=like.device, dtype=like.dtype)
    for name in ("scheduler", "audio_scheduler"):
        target = getattr(components, name)
        target._step_index = held[name]["step_index"]
        target._begin_index = held[name]["begin_index"]
    generator = getattr(components, "h3_generator", None)
    if generator is not None and held.get("generator") is not None:
        generator.set_state(held["generator"])


def save_checkpoint(held: dict[str, Any]) -> bytes:
    """A checkpoint as bytes (torch's format, tensors only: read back without unpickling code)."""
    import io

    import torch

    out = io.BytesIO()
    torch.save(held, out)
    return out.getvalue()


def load_checkpoint(data: bytes) -> dict[str, Any]:
    """A checkpoint read back (`weights_only`: nothing but tensors and plain values is loaded)."""
    import io

    import torch

    held = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(held, dict) or held.get("fingerprint", {}).get("format") != CHECKPOINT_FORMAT:
        raise ExecutorFailure("executor_error", "the checkpoint is not one this version reads")
    return held


_RESUMABLE: dict[type, type] = {}


def _resumable(loop_class: type) -> type:
    """`loop_class` (a diffusers denoising loop) that starts at a checkpoint's step when its pipeline
    holds one (`h3_resume`), its state put back, the steps before it skipped."""
    if loop_class not in _RESUMABLE:

        def __call__(self, components, state):
            block_state = self.get_block_state(state)
            held = getattr(components, "h3_resume", None)
            first = 0
            if held is not None:
                first = held["step"]
                _restore(components, block_state, held)
            context = getattr(components, "h3_step_context", None)
            for i, t in enumerate(block_state.timesteps):
                if i < first:
                    continue  # computed before the checkpoint: its state is in the latents put back
                with context() if context is not None else contextlib.nullcontext():
                    components, block_state = self.loop_step(components, block_state, i=i, t=t)
            self.set_block_state(state, block_state)
            return components, state

        _RESUMABLE[loop_class] = type(f"Resumable{loop_class.__name__}", (loop_class,), {"__call__": __call__})
    return _RESUMABLE[loop_class]
