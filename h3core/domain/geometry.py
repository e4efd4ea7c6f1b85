"""Token geometry: how long a MiniMax-H3 request's packed transformer sequence is.

Memory on the GPU is driven by this one number (docs/design.md §5), so admission is a budget of
tokens rather than a table of frame limits. The formulas follow the model (docs/design.md §4):

    F'       = smallest n >= F with n % 17 == 5        (the video VAE's 17-frame clips)
    latent_t = 5 * (F' - 5) / 17 + 2
    video    = latent_t * (W / 32) * (H / 32)          (VAE ÷16, then a 2×2 patch)
    audio    = 2 * round(F' / 24 * 40)                 (40 latents/s, two rows per step)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from h3core.domain.frames import CLIP, CLIP_REMAINDER, snap_frames
from h3core.domain.request import GenerationRequest

FPS = 24
AUDIO_LATENTS_PER_S = 40
AUDIO_ROWS_PER_LATENT = 2
TOKEN_PIXELS = 32  # 16× VAE downsampling × 2×2 patch


def latent_frames(frames: int) -> int:
    """Latent frames of a video of `frames` frames (snapped up to 17n + 5 first)."""
    snapped = snap_frames(frames)
    return 5 * (snapped - CLIP_REMAINDER) // CLIP + 2


def grid(width: int, height: int) -> int:
    """Tokens per latent frame of a canvas."""
    return (width // TOKEN_PIXELS) * (height // TOKEN_PIXELS)


def video_tokens(width: int, height: int, frames: int) -> int:
    """Video rows of a `width` x `height` canvas at `frames` frames."""
    return latent_frames(frames) * grid(width, height)


def audio_tokens(frames: int) -> int:
    """Audio rows of a video of `frames` frames: two per audio latent, 40 latents a second of its snapped length."""
    # Python's round() is the model's: half to even.
    return AUDIO_ROWS_PER_LATENT * round(snap_frames(frames) / FPS * AUDIO_LATENTS_PER_S)


# Reference media (diffusers 0.42.1, modular_pipelines/minimax_h3): images are resized to a
# 2048-pixel short edge (sides to multiples of 32) and encoded as one latent frame; videos to a
# 768-pixel short edge within 768 × 1344 pixels, snapped down to 17n + 5 frames and cut to the
# target's length; audio is cut to the target's duration, 2 rows per 800-sample (32 kHz) step,
# rounded up. Images also enter the text stream through Qwen3-VL's processor, about one token
# per 32 × 32 pixels (an estimate: the processor's pixel cap is in the checkpoint's config).
REF_IMAGE_SHORT_EDGE = 2048
REF_VIDEO_SHORT_EDGE = 768
REF_VIDEO_MAX_PIXELS = 768 * 1344


class Media(BaseModel):
    """What admission needs to know of an uploaded keyframe or reference."""

    model_config = ConfigDict(frozen=True)

    kind: str  # image | video | audio
    width: int | None = None
    height: int | None = None
    seconds: float | None = None
    has_audio: bool = False


# Assumed where an upload's dimensions are unknown: a 16:9 picture, a 16:9 video with sound
# as long as the target. Both are the common large case, so the estimate errs high.
ASSUMED_IMAGE = Media(kind="image", width=1920, height=1080)
ASSUMED_VIDEO = Media(kind="video", width=1920, height=1080, has_audio=True)
ASSUMED_AUDIO = Media(kind="audio")


def _to_32(x: float) -> int:
    return max(TOKEN_PIXELS, int(round(x / TOKEN_PIXELS)) * TOKEN_PIXELS)


def ref_image_rows(width: int, height: int) -> int:
    """Rows one reference image of `width` x `height` adds, resized to a 2048-pixel short edge."""
    scale = REF_IMAGE_SHORT_EDGE / min(width, height)
    return grid(_to_32(width * scale), _to_32(height * scale))


def ref_video_grid(width: int, height: int) -> int:
    """Tokens per latent frame of a reference video of `width` x `height`, resized to a 768-pixel
    short edge within 768 x 1344 pixels."""
    scale = REF_VIDEO_SHORT_EDGE / min(width, height)
    w, h = width * scale, height * scale
    if w * h > REF_VIDEO_MAX_PIXELS:
        shrink = (REF_VIDEO_MAX_PIXELS / (w * h)) ** 0.5
        w, h = w * shrink, h * shrink
    return grid(_to_32(w), _to_32(h))


def ref_audio_rows(seconds: float | None, frames: int) -> int:
    """Rows a reference audio adds: `seconds` long (None: unknown, taken as long as the target), cut
    to the target's length, rounded up."""
    target_s = snap_frames(frames) / FPS
    s = target_s if seconds is None else min(seconds, target_s)
    return AUDIO_ROWS_PER_LATENT * math.ceil(s * AUDIO_LATENTS_PER_S - 1e-9)


def ref_video_rows(media: Media, frames: int) -> int:
    """Rows a reference video adds to a job of `frames` frames: its frames, cut to the target's
    length and snapped down to 17n + 5, plus its sound where it has one."""
    target = snap_frames(frames)
    n = target if media.seconds is None else min(target, int(media.seconds * FPS))
    n = max(1, (n - CLIP_REMAINDER) // CLIP) * CLIP + CLIP_REMAINDER  # snapped down
    rows = (5 * (n - CLIP_REMAINDER) // CLIP + 2) * ref_video_grid(media.width or 1920, media.height or 1080)
    if media.has_audio:
        rows += ref_audio_rows(media.seconds, frames)
    return rows


class TokenCount(BaseModel):
    """A request's sequence length, by part. `total` is what admission budgets.

    The prompt's own text tokens are left out: the measured budgets (docs/design.md §5) count
    video and audio rows only, and a prompt is small beside them.
    """

    model_config = ConfigDict(frozen=True)

    video: int
    audio: int
    keyframes: int = 0
    references: int = 0
    reference_text: int = 0  # image tokens the references add to the text stream (estimate)

    @property
    def total(self) -> int:
        """The sequence length admission budgets: every part summed."""
        return self.video + self.audio + self.keyframes + self.references + self.reference_text


def count_tokens(request: GenerationRequest, media: Mapping[str, Media] | None = None) -> TokenCount:
    """The request's sequence length; `media` gives what is known of its uploads."""
    media = media or {}
    w, h, f = request.width, request.height, request.frames
    keyframes = 0
    if request.keyframes is not None:
        # Each keyframe is resized to the output canvas: one latent frame of conditioning rows.
        n = sum(k is not None for k in (request.keyframes.first, request.keyframes.last))
        keyframes = n * grid(w, h)
    references = reference_text = 0
    if request.references is not None:
        for ref in request.references.images:
            m = media.get(ref, ASSUMED_IMAGE)
            rows = ref_image_rows(m.width or 1920, m.height or 1080)
            references += rows
            reference_text += rows
        for ref in request.references.videos:
            references += ref_video_rows(media.get(ref, ASSUMED_VIDEO), f)
        for ref in request.references.audios:
            references += ref_audio_rows(media.get(ref, ASSUMED_AUDIO).seconds, f)
    return TokenCount(
        video=video_tokens(w, h, f),
        audio=audio_tokens(f),
        keyframes=keyframes,
        references=references,
        reference_text=reference_text,
    )


# Rows a prompt's chat template may add around its own tokens (a bound, not a count).
TEXT_TEMPLATE_ROWS = 64


def text_rows_bound(request: GenerationRequest) -> int:
    """At most how many rows the prompt adds to the packed sequence: a byte-level BPE token is at
    least one byte of UTF-8, so the prompt's byte count bounds its tokens, plus the template's."""
    return len(request.prompt.encode("utf-8")) + TEXT_TEMPLATE_ROWS
