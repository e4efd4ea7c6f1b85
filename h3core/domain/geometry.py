"""Token geometry: how long a MiniMax-H3 request's packed transformer sequence is.

Memory on the GPU is driven by this one number (field notes §5), so admission is a budget of
tokens rather than a table of frame limits. The formulas follow the model (field notes §4):

    F'       = smallest n >= F with n % 17 == 5        (the video VAE's 17-frame clips)
    latent_t = 5 * (F' - 5) / 17 + 2
    video    = latent_t * (W / 32) * (H / 32)          (VAE ÷16, then a 2×2 patch)
    audio    = 2 * round(F' / 24 * 40)                 (40 latents/s, two rows per step)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from h3core.domain.request import GenerationRequest

CLIP = 17
CLIP_REMAINDER = 5
FPS = 24
AUDIO_LATENTS_PER_S = 40
AUDIO_ROWS_PER_LATENT = 2
TOKEN_PIXELS = 32  # 16× VAE downsampling × 2×2 patch


def snap_frames(frames: int) -> int:
    """The frame count the model really generates: up to the next 17n + 5."""
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    return frames + (CLIP_REMAINDER - frames) % CLIP


def latent_frames(frames: int) -> int:
    snapped = snap_frames(frames)
    return 5 * (snapped - CLIP_REMAINDER) // CLIP + 2


def grid(width: int, height: int) -> int:
    """Tokens per latent frame of a canvas."""
    return (width // TOKEN_PIXELS) * (height // TOKEN_PIXELS)


def video_tokens(width: int, height: int, frames: int) -> int:
    return latent_frames(frames) * grid(width, height)


def audio_tokens(frames: int) -> int:
    # Python's round() is the model's: half to even.
    return AUDIO_ROWS_PER_LATENT * round(snap_frames(frames) / FPS * AUDIO_LATENTS_PER_S)


class TokenCount(BaseModel):
    """A request's sequence length, by part. `total` is what admission budgets."""

    model_config = ConfigDict(frozen=True)

    video: int
    audio: int
    keyframes: int = 0
    references: int = 0

    @property
    def total(self) -> int:
        return self.video + self.audio + self.keyframes + self.references


def count_tokens(request: GenerationRequest) -> TokenCount:
    w, h, f = request.width, request.height, request.frames
    keyframes = 0
    if request.keyframes is not None:
        # One latent frame of conditioning rows per keyframe given.
        n = sum(k is not None for k in (request.keyframes.first, request.keyframes.last))
        keyframes = n * grid(w, h)
    references = 0
    if request.references is not None:
        # Each reference image is encoded on the output canvas: one latent frame of rows.
        references = len(request.references.images) * grid(w, h)
    return TokenCount(video=video_tokens(w, h, f), audio=audio_tokens(f), keyframes=keyframes, references=references)
