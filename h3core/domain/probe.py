"""A capacity probe's search and the profile it writes, as pure functions.

The probe runs one denoising step and one decode at a canvas for growing frame counts until one
runs out of memory (or the largest count asked for runs), then bisects between the largest that
ran and the smallest that did not. Only counts the model really makes are tried (17n + 5, each a
distinct token count), plus the largest count asked for itself (a request of that many frames).
`next_frames` decides the next count from what was measured so far; the shell measures it.
Memory grows with the sequence, so the search assumes a count that ran means every smaller one
runs; it never measures outside the bounds it has, so its own points never contradict.

`probed_profile` turns the measured points into a `CapacityProfile` whose budget is what the
points imply (the largest run that fit; verified only where a run ran out of memory above it).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from h3core.domain.capacity import CapacityProfile, MeasuredPoint, Outcome, ProfileMatch, ReferencePolicy
from h3core.domain.geometry import CLIP, CLIP_REMAINDER, count_tokens
from h3core.domain.request import GenerationRequest

SOURCE = "probed with random weights"
GIB = 2**30


def frame_candidates(max_frames: int, *, min_frames: int = CLIP + CLIP_REMAINDER) -> tuple[int, ...]:
    """The frame counts worth measuring up to `max_frames`: every 17n + 5 from `min_frames` on
    (each is its own token count; the video VAE decodes one 17-frame clip at least) and
    `max_frames` itself when it is not one (it snaps up)."""
    if max_frames < 1 or min_frames < 1:
        raise ValueError(f"frames must be >= 1, got {min_frames}..{max_frames}")
    first = min_frames + (CLIP_REMAINDER - min_frames) % CLIP
    out = list(range(first, max_frames + 1, CLIP))
    if not out or out[-1] != max_frames:
        out.append(max_frames)
    return tuple(out)


def next_frames(
    candidates: Sequence[int],
    trials: Mapping[int, Outcome],
    *,
    start: int,
    growth: float = 2.0,
    precision: int = CLIP,
) -> int | None:
    """The next frame count to measure, or None when the boundary is found.

    With nothing measured: the first candidate at or above `start`. While nothing ran out of
    memory: `growth` times the largest that ran (at most the last candidate; None once that ran).
    While nothing ran: half the smallest that ran out (None once the first candidate did). Then
    bisect until the largest that ran and the smallest that did not are adjacent candidates or at
    most `precision` frames apart.
    """
    if growth <= 1.0:
        raise ValueError(f"growth must be above 1, got {growth}")
    cands = sorted(set(candidates))
    if not cands:
        raise ValueError("no candidate frame counts")
    unknown = set(trials) - set(cands)
    if unknown:
        raise ValueError(f"measured frame counts that are not candidates: {sorted(unknown)}")
    ran = [cands.index(f) for f, o in trials.items() if o == "ran"]
    oom = [cands.index(f) for f, o in trials.items() if o == "oom"]
    lo = max(ran, default=-1)
    hi = min(oom, default=len(cands))
    if lo >= hi:
        raise ValueError(f"{cands[hi]} frames ran out of memory but {cands[lo]} ran: not one boundary")
    if not trials:
        return cands[min(bisect.bisect_left(cands, start), len(cands) - 1)]
    if hi == len(cands):  # nothing ran out of memory yet: grow
        if lo == len(cands) - 1:
            return None
        target = cands[lo] * growth
        return cands[max(lo + 1, min(bisect.bisect_left(cands, target), len(cands) - 1))]
    if lo == -1:  # nothing ran yet: shrink
        if hi == 0:
            return None
        below = bisect.bisect_right(cands, cands[hi] / growth) - 1  # the largest at or under the target
        return cands[min(max(below, 0), hi - 1)]
    if hi - lo <= 1 or cands[hi] - cands[lo] <= precision:
        return None
    return cands[(lo + hi) // 2]


class Measurement(BaseModel):
    """One point the probe ran: a denoising step and a decode at a canvas and frame count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    width: int
    height: int
    frames: int
    outcome: Outcome
    sequence: int | None = None  # rows the transformer attended over (text included), where it ran
    step_seconds: float | None = None
    decode_seconds: float | None = None
    step_peak_bytes: int | None = None
    decode_peak_bytes: int | None = None
    stage: str | None = None  # where it ran out of memory
    error: str | None = None

    @property
    def tokens(self) -> int:
        """Video and audio rows, as admission counts them."""
        return count_tokens(GenerationRequest(prompt="-", width=self.width, height=self.height, frames=self.frames)).total

    def describe(self) -> str:
        """The measurement in words: its tokens and, where it ran, the step's and the decode's time
        and peak memory; else where it ran out of memory."""

        def gib(n: int | None) -> str:
            return "?" if n is None else f"{n / GIB:.2f} GiB"

        parts = [f"{self.tokens:,} tokens"]
        if self.outcome == "ran":
            parts.append(f"step {self.step_seconds:.2f} s, peak {gib(self.step_peak_bytes)}")
            parts.append(f"decode {self.decode_seconds:.2f} s, peak {gib(self.decode_peak_bytes)}")
        else:
            first = (self.error or "").splitlines()[0] if self.error else ""
            parts.append(f"out of memory in {self.stage or 'the run'} ({first[:240]})")
        return "; ".join(parts)

    def point(self) -> MeasuredPoint:
        """The measurement as a profile's `MeasuredPoint`, its description as the note."""
        return MeasuredPoint(width=self.width, height=self.height, frames=self.frames, outcome=self.outcome, note=self.describe())


class ProbeIdentity(BaseModel):
    """Where the probe ran: what the profile's `[[match]]` and header say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str  # the device's name, as the pipeline executor reports its hardware ("NVIDIA H200", "cpu")
    dtype: str
    kernel: str  # the attention kernel that ran (the executor's `kernel`)
    attention: str  # the kernel plan, described
    model: str  # the model's name (its facts), whose geometry was built
    geometry: str  # "released", "tiny", or the folder the configs came from
    group_size: int = Field(default=1, ge=1)
    memory_cap_gib: float | None = None
    reserve_gib: float = 0.0
    text_tokens: int = 0


def probed_profile(
    identity: ProbeIdentity,
    measurements: Sequence[Measurement],
    *,
    api_max_frames: int,
    resolutions: Sequence[tuple[int, int]],
    name: str | None = None,
) -> CapacityProfile:
    """The profile the measurements imply (raises ValueError if none ran, or they contradict one budget)."""
    points = tuple(m.point() for m in sorted(measurements, key=lambda m: (m.width, m.height, m.frames)))
    cap = f", capped at {identity.memory_cap_gib:g} GiB" if identity.memory_cap_gib is not None else ""
    held = f", {identity.reserve_gib:g} GiB held for parts not built" if identity.reserve_gib else ""
    return CapacityProfile(
        name=name or default_name(identity),
        hardware=f"{identity.group_size} x {identity.device} ({identity.dtype}{cap}{held}), "
        "in-process pipeline, one job at a time",
        attention=identity.attention,
        match=(
            ProfileMatch(
                executor="pipeline",
                device=identity.device,
                kernel=identity.kernel,
                model=identity.model,
                group_size=identity.group_size,
            ),
        ),
        source=SOURCE,
        api_max_frames=api_max_frames,
        resolutions=tuple(dict.fromkeys((w, h) for w, h in resolutions)),
        points=points,
        references=ReferencePolicy(policy="reject", note="the probe measures requests without references"),
    )


def default_name(identity: ProbeIdentity) -> str:
    """A profile name for where the probe ran, lower case and dash-separated ("probed-1xnvidia-h200-sdpa-minimax-h3")."""
    words = f"probed {identity.group_size}x{identity.device} {identity.kernel} {identity.model}".lower()
    return "-".join("".join(c if c.isalnum() or c == "." else " " for c in words).split())
