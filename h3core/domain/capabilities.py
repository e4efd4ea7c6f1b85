"""What an executor can run now: the limits of its own that admission must know.

The capacity profile says what fits in memory on measured hardware; an executor knows more:
which modes it serves (a ComfyUI lacking a mode's nodes serves the others), the clip window of
its model, the token budget of each of its device groups, the longest sequence its attention
kernel may take, how many uploads of each kind its graph or model accepts, and whether each
mode can start a job *now*. `Capabilities` is that statement, as data; admission judges every
request against it and the profile together (`h3core.domain.admission.AdmissionRules`), so a request
the executor would refuse is refused at submission instead of being queued to fail later.

Two different "no"s: a mode that is not *served* can never run here (a submit is refused,
`mode_unavailable`); a mode that is served but not *ready* (the server is down, the model is
loading) will run later, so its jobs are admitted and wait in the queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from h3core.domain.frames import CLIP, CLIP_REMAINDER, snap_frames
from h3core.domain.geometry import FPS
from h3core.domain.quality import Quality
from h3core.domain.request import GenerationRequest, Mode

MODES: tuple[Mode, ...] = ("t2va", "fl2va", "ref2va")


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModeReadiness(_Data):
    """Whether the executor serves a mode, and whether it can start a job in it now (`reason`: why not)."""

    mode: Mode
    served: bool = True  # False: this executor can never run the mode (refused at submit)
    ready: bool = True  # False while served: not now (jobs wait queued)
    reason: str | None = None  # why not served, or why not ready

    @property
    def runnable(self) -> bool:
        """Served and ready: a job of this mode can start now."""
        return self.served and self.ready


class FrameWindow(_Data):
    """The clip lengths a model generates. Frames are snapped up to 17n + 5 first (the model
    generates the snapped count, and diffusers checks that one), then measured in seconds; a
    graph may also bound the requested count itself (`least`, `most`: a node input's range)."""

    min_seconds: float = Field(default=0.0, ge=0)
    max_seconds: float | None = Field(default=None, gt=0)
    least: int = Field(default=1, ge=1)  # bounds on the requested count, before snapping
    most: int | None = Field(default=None, ge=1)
    source: str = ""  # where the window comes from, for refusals ("model facts of minimax-h3")

    def admits(self, frames: int) -> bool:
        """Whether a request of `frames` frames is inside the window: the count asked within
        `least`..`most`, and its snapped count's length in seconds within the window's."""
        seconds = snap_frames(frames) / FPS
        return (
            self.least <= frames
            and (self.most is None or frames <= self.most)
            and self.min_seconds <= seconds
            and (self.max_seconds is None or seconds <= self.max_seconds)
        )

    @property
    def max_frames(self) -> int | None:
        """The largest request inside the window (None: no upper end)."""
        top = self.most
        if self.max_seconds is not None:
            last = math.floor(self.max_seconds * FPS + 1e-9)  # the longest snapped count inside
            last = 0 if last < CLIP_REMAINDER else last - (last - CLIP_REMAINDER) % CLIP
            top = last if top is None else min(top, last)
        return top

    @property
    def min_frames(self) -> int:
        """The smallest request inside the window's start."""
        least = max(1, math.ceil(self.min_seconds * FPS - 1e-9))
        snapped = snap_frames(least)  # the first count the model makes that is long enough
        return max(self.least, snapped - CLIP + 1)  # every request above the previous snapped count snaps to it

    def describe(self) -> str:
        """The window in words, for refusals ("2-10 s (model facts of minimax-h3)")."""
        top = f"{self.max_seconds:g} s" if self.max_seconds is not None else "no limit"
        text = f"{self.min_seconds:g}-{top}"
        if self.least > 1 or self.most is not None:
            text += f", {self.least}-{self.most if self.most is not None else ''} frames requested"
        return text + (f" ({self.source})" if self.source else "")


class GroupBudget(_Data):
    """How many tokens one device group of `size` ranks fits, and what backs the number."""

    size: int = Field(ge=1)
    tokens: int | None = Field(default=None, ge=0)  # None: nothing measured or configured
    verified: bool = False  # True only where a measured out-of-memory boundary backs it
    source: str = ""


class Capabilities(_Data):
    """One executor's statement of what it can run, as of now."""

    executor: str
    hardware: str = ""  # what it runs on, as matched against capacity profiles ("cpu", "NVIDIA H200")
    kernel: str | None = None  # the attention kernel that runs, where the executor chooses one
    model: str | None = None  # the model's name (its facts), e.g. "minimax-h3"
    topology: str | None = None  # e.g. ComfyUI's "raylight", or the groups "2+2"
    modes: tuple[ModeReadiness, ...] = tuple(ModeReadiness(mode=m) for m in MODES)
    window: FrameWindow | None = None
    groups: tuple[GroupBudget, ...] = (GroupBudget(size=1),)
    max_tokens: int | None = Field(default=None, ge=0)  # the attention kernel's own limit on the whole sequence
    max_tokens_reason: str = ""
    media: Mapping[str, int] = Field(default_factory=dict)  # most uploads per field (request.UPLOAD_KINDS); absent: the API's own
    max_references: int | None = Field(default=None, ge=0)  # references of any kind, in all
    audio_alone: bool = True  # False: an audio reference needs an image or video reference beside it
    # Whether it checkpoints its denoising loop (and continues from a checkpoint): the in-process
    # pipeline and its groups do; ComfyUI owns its loop and does not (its re-attach covers restarts).
    checkpoints: bool = False
    # Most attempts it runs at once, where it bounds that itself (a ComfyUI runs one prompt at a
    # time): the runner starts no more, and the rest wait queued in h3core. None: the runner's slots.
    concurrency: int | None = Field(default=None, ge=1)
    # How long it may follow its work after a stop, where that work runs outside the iteration (a
    # ComfyUI prompt runs on until an interrupt lands): the runner waits that long beyond its cancel
    # grace for how the work ended before it ends the job itself. None: the grace alone.
    stop_wait_s: float | None = Field(default=None, ge=0)
    # Modes whose video has exactly the frames asked (a graph that makes them as asked, the fake);
    # the others make MiniMax-H3's counts, 17n + 5 (the next one up), and say so in a warning.
    exact_frames: tuple[Mode, ...] = ()
    # The quality levels it runs (h3core.domain.quality): a request at another is refused at
    # submission. `exact` alone unless it says more (a statement from an older node says nothing).
    qualities: tuple[Quality, ...] = ("exact",)
    # Whether it makes a video longer than its window as segments, each continuing the last from
    # its last frame (fl2va's `first`): h3core.domain.segments. False: such a request is refused.
    continues_segments: bool = False

    def frames_made(self, request: GenerationRequest) -> int:
        """How many frames the video of `request` will have."""
        return request.frames if request.mode in self.exact_frames else snap_frames(request.frames)

    @model_validator(mode="after")
    def _every_mode(self) -> Capabilities:
        """One entry per mode, in order; a mode left out is one this executor does not serve."""
        given = {m.mode: m for m in self.modes}
        modes = tuple(given.get(m) or ModeReadiness(mode=m, served=False, ready=False, reason="not offered") for m in MODES)
        if modes != self.modes:
            object.__setattr__(self, "modes", modes)
        return self

    def identity(self) -> dict[str, str]:
        """What a job's `Running` event records of where it ran, so that its outcome can later be
        told apart as evidence for one capacity profile or another (`capacity fit`)."""
        out = {"hardware": self.hardware, "group_sizes": ",".join(str(g.size) for g in self.groups)}
        for key, value in (("kernel", self.kernel), ("model_name", self.model), ("topology", self.topology)):
            if value:
                out[key] = value
        return out

    @classmethod
    def of_run(cls, executor: str, info: Mapping[str, str]) -> Capabilities:
        """The identity a `Running` event recorded, as capabilities (for matching profiles)."""
        sizes = [int(n) for n in info.get("group_sizes", "1").split(",") if n.strip().isdigit()] or [1]
        return cls(
            executor=executor,
            hardware=info.get("hardware", ""),
            kernel=info.get("kernel"),
            model=info.get("model_name"),
            topology=info.get("topology"),
            groups=tuple(GroupBudget(size=n) for n in sizes),
        )

    def mode(self, mode: str) -> ModeReadiness:
        """The readiness of `mode`, which must be one of `MODES` (every one has an entry)."""
        return next(m for m in self.modes if m.mode == mode)

    @property
    def served_modes(self) -> tuple[Mode, ...]:
        """Modes this executor can ever run: a request in any other is refused at submission."""
        return tuple(m.mode for m in self.modes if m.served)

    @property
    def runnable_modes(self) -> tuple[Mode, ...]:
        """Modes a job can start in now: the runner claims only these."""
        return tuple(m.mode for m in self.modes if m.runnable)

    @property
    def ready(self) -> bool:
        """Ready when at least one mode can start a job now."""
        return bool(self.runnable_modes)

    def waiting_reason(self, mode: str) -> str | None:
        """Why a queued job of `mode` cannot start now (None: it waits only for a slot)."""
        m = self.mode(mode)
        if m.runnable:
            return None
        what = "not served" if not m.served else "not ready"
        return f"{self.executor} {what} for {mode}: {m.reason}" if m.reason else f"{self.executor} {what} for {mode}"

    def problems(self) -> list[str]:
        """Every reason a mode cannot run now (none cut)."""
        return [f"{m.mode}: {m.reason or ('not served' if not m.served else 'not ready')}" for m in self.modes if not m.runnable]

    def with_modes(self, updates: Iterable[ModeReadiness]) -> Capabilities:
        """The same statement with the readiness of each mode in `updates` replaced."""
        by_mode = {m.mode: m for m in self.modes}
        by_mode.update({m.mode: m for m in updates})
        return self.model_copy(update={"modes": tuple(by_mode[m] for m in MODES if m in by_mode)})

    def not_ready(self, why: str) -> Capabilities:
        """The same statement with no mode ready now (its jobs are admitted and wait): what is said
        of an executor that stopped, or a node that stopped beating."""
        return self.with_modes(
            ModeReadiness(mode=m.mode, served=m.served, ready=False, reason=why if m.served else m.reason) for m in self.modes
        )

    def with_budgets(self, budgets: Mapping[int, GroupBudget]) -> Capabilities:
        """Fill the groups that have no budget of their own from `budgets` (by size)."""
        groups = tuple(g if g.tokens is not None or g.size not in budgets else budgets[g.size] for g in self.groups)
        return self.model_copy(update={"groups": groups})
