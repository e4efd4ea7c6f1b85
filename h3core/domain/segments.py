"""Long videos as segments: a request longer than the model's window, planned as segments that
each fit it, each continuing the last. Pure.

Segment k+1 is conditioned on the last frame segment k keeps, as its first keyframe (what fl2va
takes as `first`): the model makes that frame again as its own first, so the joined video drops
it there, and each joint shows the frame once. The plan asks each segment for the frames it keeps
plus that repeated one, spread evenly over the fewest segments the window allows (their requests
differ by at most one frame: none runs at the window's edge unless all must). A model that makes
17n + 5 frames makes up to 16 more than asked; a segment keeps only its first `frames` of them
(the tail trimmed), so what the segments keep adds up to exactly the frames asked, and the audio,
cut at the same frames, to exactly their length.

The audio of the repeated frame is not dropped but crossfaded: segment k's sound over its last
kept frame and segment k+1's over its first (the same moment, made twice) are blended over that
frame's 1/24 s, so the sound runs on without a click and its length is the video's.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from h3core.domain.geometry import FPS

__all__ = ["JOINT_FRAMES", "Segment", "SegmentPlan", "plan_segments", "segments_needed", "steps_done"]

# Frames each segment after the first repeats from the one before: its conditioned first frame.
JOINT_FRAMES = 1


class Segment(BaseModel):
    """One call of the model: the frames asked of it, how many of them lead with the repeated joint
    frame (dropped), and where what it keeps starts in the joined video."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0)
    frames: int = Field(ge=1)  # asked of the model (it may make more: the tail is trimmed)
    skip: int = Field(ge=0)  # leading frames dropped: the joint frame it repeats (0 for the first)
    start: int = Field(ge=0)  # the joined video's frame its first kept frame becomes

    @property
    def keep(self) -> int:
        """Frames it adds to the joined video."""
        return self.frames - self.skip


class SegmentPlan(BaseModel):
    """The segments of one video of `frames` frames, in order, each continuing the last."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    frames: int = Field(ge=1)
    segments: tuple[Segment, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _adds_up(self) -> SegmentPlan:
        start = 0
        for i, s in enumerate(self.segments):
            if s.index != i or s.start != start or s.skip != (0 if i == 0 else JOINT_FRAMES) or s.keep < 1:
                raise ValueError(f"segment {i} does not continue the plan: {s}")
            start += s.keep
        if start != self.frames:
            raise ValueError(f"the segments keep {start} frames, not the {self.frames} asked")
        return self

    @property
    def joints(self) -> tuple[int, ...]:
        """The joined video's frames where each segment after the first begins."""
        return tuple(s.start for s in self.segments[1:])

    def describe(self) -> str:
        """The plan in a line, for people ("3 segments of 10.04, 10 and 10 s, joined at 10.04 s and 20.04 s")."""
        lengths = [f"{s.keep / FPS:.4g}" for s in self.segments]
        if len(lengths) == 1:
            return f"one segment of {lengths[0]} s"
        joins = " and ".join(f"{j / FPS:.4g} s" for j in self.joints)
        return f"{len(lengths)} segments of {', '.join(lengths[:-1])} and {lengths[-1]} s, joined at {joins}"


def segments_needed(frames: int, most: int) -> int:
    """The fewest segments that make `frames` frames when one call may be asked for at most `most`
    (the first adds `most`, each after it `most - 1`: it repeats the joint frame)."""
    if most < 1 + JOINT_FRAMES:
        raise ValueError(f"a window of {most} frame(s) cannot continue a segment")
    if frames <= most:
        return 1
    step = most - JOINT_FRAMES
    return 1 + -(-(frames - most) // step)


def plan_segments(frames: int, most: int) -> SegmentPlan:
    """The plan for a video of `frames` frames where one call may be asked for at most `most` (a
    window's `max_frames`: a model that snaps makes more, inside the window, and the tail is
    trimmed): the fewest segments, the frames asked spread evenly, the first ones a frame longer
    where they do not divide evenly."""
    n = segments_needed(frames, most)
    asked = frames + (n - 1) * JOINT_FRAMES  # what the calls are asked for in all
    segments = []
    start = 0
    for i in range(n):
        ask = asked // n + (1 if i < asked % n else 0)
        skip = 0 if i == 0 else JOINT_FRAMES
        segments.append(Segment(index=i, frames=ask, skip=skip, start=start))
        start += ask - skip
    return SegmentPlan(frames=frames, segments=tuple(segments))


def steps_done(per: int, made: int, step: int | None, total: int | None) -> int | None:
    """The denoising steps of a whole segmented job done so far: `made` segments of `per` steps
    each, and `step` of `total` into the next (counted in `per` where the executor counts its
    steps otherwise, so the figure never passes `per` a segment). None while none is done."""
    if step is None or not total:
        return made * per if made else None
    return made * per + (step if total == per else step * per // total)
