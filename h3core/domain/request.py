"""What a caller asks for: one MiniMax-H3 generation.

The model is pure data. Limits that depend on measured capacity (how many frames fit at a
resolution) are not here; they belong to admission. What is here are the limits of the API
itself: shapes the model cannot take at all, and sizes no request may exceed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from h3core.domain.frames import snap_warning
from h3core.domain.quality import Quality

Mode = Literal["t2va", "fl2va", "ref2va"]

# Upload ids are opaque tokens minted by the upload store; never paths (no '/', no '.').
UPLOAD_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

MAX_PROMPT_CHARS = 8000
MIN_SIDE = 32  # the smallest canvas the model takes (docs/design.md §4: 32-pixel token grid)
MAX_SIDE = 4096
SIDE_MULTIPLE = 32
MAX_FRAMES = 100_000  # a sanity bound on the field; admission applies the real caps
MAX_STEPS = 1000
MAX_SEED = 2**63 - 1
MAX_REF_IMAGES = 9
MAX_REF_VIDEOS = 3
MAX_REF_AUDIOS = 3

# What kind of upload each field of a request takes.
UPLOAD_KINDS = {
    "keyframes.first": "image",
    "keyframes.last": "image",
    "references.images": "image",
    "references.videos": "video",
    "references.audios": "audio",
}
# The mode each upload field belongs to.
UPLOAD_MODES = {name: "fl2va" if name.startswith("keyframes.") else "ref2va" for name in UPLOAD_KINDS}

# Accepted for the console's contract but with no effect on MiniMax-H3 (docs/design.md §2.8).
INERT_FIELDS = ("cfg_scale", "negative_prompt", "turbo")


_UploadRef = Annotated[str, StringConstraints(pattern=UPLOAD_ID_PATTERN)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


def present(name: str) -> dict:
    """JSON Schema: `name` is given and not null."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


class Keyframes(_Frozen):
    """First and/or last frame for fl2va, as upload ids."""

    # The validators' rules, in the JSON Schema too (the API's document says what is accepted).
    model_config = ConfigDict(json_schema_extra={"anyOf": [present("first"), present("last")]})

    first: _UploadRef | None = None
    last: _UploadRef | None = None

    @model_validator(mode="after")
    def _one_at_least(self) -> Keyframes:
        if self.first is None and self.last is None:
            raise ValueError("keyframes needs at least one of 'first' or 'last'")
        return self


class References(_Frozen):
    """Reference media for ref2va, as upload ids (lists are taken as tuples)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [{"required": [n], "properties": {n: {"minItems": 1}}} for n in ("images", "videos", "audios")]
        }
    )

    images: tuple[_UploadRef, ...] = Field(default=(), max_length=MAX_REF_IMAGES, strict=False)
    videos: tuple[_UploadRef, ...] = Field(default=(), max_length=MAX_REF_VIDEOS, strict=False)
    audios: tuple[_UploadRef, ...] = Field(default=(), max_length=MAX_REF_AUDIOS, strict=False)

    @model_validator(mode="after")
    def _one_at_least(self) -> References:
        if not (self.images or self.videos or self.audios):
            raise ValueError("references needs at least one image, video or audio")
        return self

    def count(self) -> int:
        """How many references there are, of every kind."""
        return len(self.images) + len(self.videos) + len(self.audios)


def _only_with(mode: str, name: str) -> dict:
    """JSON Schema: `name` is given exactly when `mode` is."""
    return {
        "if": {"required": ["mode"], "properties": {"mode": {"const": mode}}},
        "then": present(name),
        "else": {"properties": {name: {"type": "null"}}},
    }


class GenerationRequest(_Frozen):
    """One generation: text (and keyframes or references) to video with audio."""

    model_config = ConfigDict(json_schema_extra={"allOf": [_only_with("fl2va", "keyframes"), _only_with("ref2va", "references")]})

    mode: Mode = "t2va"
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    width: int = Field(default=1344, ge=MIN_SIDE, le=MAX_SIDE, multiple_of=SIDE_MULTIPLE)
    height: int = Field(default=768, ge=MIN_SIDE, le=MAX_SIDE, multiple_of=SIDE_MULTIPLE)
    frames: int = Field(default=124, ge=1, le=MAX_FRAMES)
    steps: int = Field(default=50, ge=1, le=MAX_STEPS)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    fps: Literal[24] = 24
    keyframes: Keyframes | None = None
    references: References | None = None
    # How many steps may be served from a cache for speed (h3core.domain.quality); `exact`: none.
    quality: Quality = "exact"
    # Inert: kept so the console's requests validate; each one set adds a warning to the job.
    cfg_scale: float | None = Field(default=None, ge=0, le=100)
    negative_prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    turbo: bool | None = None

    @model_validator(mode="after")
    def _mode_inputs(self) -> GenerationRequest:
        if self.mode == "fl2va" and self.keyframes is None:
            raise ValueError("mode 'fl2va' needs 'keyframes' (first and/or last image)")
        if self.mode != "fl2va" and self.keyframes is not None:
            raise ValueError(f"'keyframes' is only accepted with mode 'fl2va', not {self.mode!r}")
        if self.mode == "ref2va" and self.references is None:
            raise ValueError("mode 'ref2va' needs 'references'")
        if self.mode != "ref2va" and self.references is not None:
            raise ValueError(f"'references' is only accepted with mode 'ref2va', not {self.mode!r}")
        return self

    def warnings(self, frames_made: int | None = None) -> tuple[str, ...]:
        """One line per accepted field that has no effect on this model, and one where the video
        will have other than the frames asked: `frames_made`, as the executor states it (None: the
        model's own count, 17n + 5)."""
        out = []
        for name in INERT_FIELDS:
            if getattr(self, name) is not None:
                out.append(
                    f"'{name}' was accepted but has no effect: MiniMax-H3 is CFG-distilled"
                    + (" and turbo needs a LoRA this deployment does not load" if name == "turbo" else "")
                )
        snapped = snap_warning(self.frames, frames_made)
        if snapped:
            out.append(snapped)
        return tuple(out)

    def uploads(self) -> dict[str, tuple[str, ...]]:
        """The upload ids the request names, by field ("keyframes.first", "references.images", ...)."""
        out: dict[str, tuple[str, ...]] = {}
        if self.keyframes is not None:
            for key in ("first", "last"):
                value = getattr(self.keyframes, key)
                if value is not None:
                    out[f"keyframes.{key}"] = (value,)
        if self.references is not None:
            for key in ("images", "videos", "audios"):
                ids = getattr(self.references, key)
                if ids:
                    out[f"references.{key}"] = tuple(ids)
        return out

    def upload_ids(self) -> tuple[str, ...]:
        """Every upload this request refers to, in a stable order."""
        return tuple(i for ids in self.uploads().values() for i in ids)
