"""The frame counts MiniMax-H3 makes: 17n + 5 (its video VAE decodes 17-frame clips plus 5).

A request for any other count gets the next one up; the job says so in a warning, unless what
runs it makes exactly the count asked (a ComfyUI graph without the model, the fake executor)."""

from __future__ import annotations

CLIP = 17
CLIP_REMAINDER = 5


def snap_frames(frames: int) -> int:
    """The frame count the model really generates: up to the next 17n + 5."""
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    return frames + (CLIP_REMAINDER - frames) % CLIP


def snap_warning(frames: int, made: int | None = None) -> str | None:
    """What a request for `frames` is told when the video will have another count: `made`, as the
    executor states it, or else the model's (`snap_frames`). None: exactly the count asked."""
    made = snap_frames(frames) if made is None else made
    if made == frames:
        return None
    return f"{frames} frames snapped to {made}: MiniMax-H3 makes {CLIP}n+{CLIP_REMAINDER}"
