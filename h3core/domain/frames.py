"""The frame counts MiniMax-H3 makes: 17n + 5 (its video VAE decodes 17-frame clips plus 5).

A request for any other count gets the next one up; the job says so in a warning."""

from __future__ import annotations

CLIP = 17
CLIP_REMAINDER = 5


def snap_frames(frames: int) -> int:
    """The frame count the model really generates: up to the next 17n + 5."""
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    return frames + (CLIP_REMAINDER - frames) % CLIP


def snap_warning(frames: int) -> str | None:
    """What a request for `frames` is told when the model makes another count (None: it makes exactly that)."""
    snapped = snap_frames(frames)
    if snapped == frames:
        return None
    return f"{frames} frames snapped to {snapped}: MiniMax-H3 makes {CLIP}n+{CLIP_REMAINDER}"
