"""What a new request may say: the bodies POST /v1/jobs and POST /v1/videos validate, and the
checks they share (a prompt not blank, upload ids as minted, sides the model can make, a body
that is a JSON object), each refusal in words a client can act on."""

from __future__ import annotations

import functools
import math
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from h3core.adapters.uploads import ID_PATTERN as UPLOAD_ID_PATTERN
from h3core.domain.request import (
    MAX_PROMPT_CHARS,
    MAX_REF_AUDIOS,
    MAX_REF_IMAGES,
    MAX_REF_VIDEOS,
    MAX_SIDE,
    MIN_SIDE,
    SIDE_MULTIPLE,
    GenerationRequest,
    Keyframes,
    References,
)
from h3core.domain.webhooks import DEFAULT_EVENTS, MAX_URL_CHARS, WebhookEvent, WebhookTarget

__all__ = [
    "NOT_BLANK_PATTERN",
    "WHITESPACE",
    "JobCreate",
    "JobPatch",
    "NodePatch",
    "KeyframesInput",
    "Prompt",
    "ReferencesInput",
    "UploadId",
    "json_object",
    "not_an_object",
    "sides_refusal",
]

# Whitespace as Python's `str.isspace` has it, spelled out: ECMA's, Python's and Rust's `\s` each
# differ, and the document's pattern must mean to every reader what the server checks.
WHITESPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK_PATTERN = f"[^{WHITESPACE}]"  # somewhere in the text: a character other than whitespace


def _not_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank", "the prompt is only whitespace: say what the video shows")
    return text


# New requests' prompts (a stored request's may predate the rule: the domain model reads those).
Prompt = Annotated[
    str,
    Field(min_length=1, max_length=MAX_PROMPT_CHARS, json_schema_extra={"pattern": NOT_BLANK_PATTERN}),
    AfterValidator(_not_blank),
]
# An upload a new request names: an id POST /v1/uploads gave (stored requests may hold older forms).
UploadId = Annotated[str, StringConstraints(pattern=UPLOAD_ID_PATTERN)]


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def not_an_object(value: object) -> str:
    """What to say of a body that is JSON but not an object (no class name of ours in it)."""
    kind = "null" if value is None else _JSON_TYPES.get(type(value), "another value")
    return f"the body must be a JSON object with at least 'prompt', not {kind}"


def json_object(data: object, model: type[BaseModel]) -> object:
    """For a model's before-validator: `data` passed on if a JSON object (or the model already), else refused."""
    if isinstance(data, dict | model):
        return data
    raise PydanticCustomError("json_object", not_an_object(data))


def _nearest_side(n: int) -> int:
    return min(max(math.floor(n / SIDE_MULTIPLE + 0.5) * SIDE_MULTIPLE, MIN_SIDE), MAX_SIDE)


def sides_refusal(sides: tuple[int, ...]) -> str | None:
    """Why the model cannot make a canvas with these sides (a width, a height, or both), naming
    the rule and the nearest it makes; None when it can. Both APIs say it in these words."""
    wrong = list(dict.fromkeys(_side_fault(n) for n in sides if n % SIDE_MULTIPLE or not MIN_SIDE <= n <= MAX_SIDE))
    if not wrong:
        return None
    nearest = "x".join(str(_nearest_side(n)) for n in sides)
    what = "size" if len(sides) > 1 else "side"
    return (
        f"MiniMax-H3 makes sides that are multiples of {SIDE_MULTIPLE} from {MIN_SIDE} to {MAX_SIDE}, "
        f"and {' and '.join(wrong)}; the nearest {what} it makes is {nearest}"
    )


def _side_fault(n: int) -> str:
    """What is wrong with side `n`, in words: the bound it passes, else the multiple it misses."""
    if n > MAX_SIDE:
        return f"{n} is above {MAX_SIDE}"
    if n < MIN_SIDE:
        return f"{n} is below {MIN_SIDE}"
    return f"{n} is not a multiple of {SIDE_MULTIPLE}"


@functools.cache  # per class, once: `model_fields` costs on every look, and every body checks
def _int_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for name, f in model.model_fields.items() if f.annotation is int)


class KeyframesInput(Keyframes):
    """fl2va's first and/or last frame, as ids POST /v1/uploads gave."""

    first: UploadId | None = None
    last: UploadId | None = None


class ReferencesInput(References):
    """ref2va's reference media, as ids POST /v1/uploads gave."""

    images: tuple[UploadId, ...] = Field(default=(), max_length=MAX_REF_IMAGES, strict=False)
    videos: tuple[UploadId, ...] = Field(default=(), max_length=MAX_REF_VIDEOS, strict=False)
    audios: tuple[UploadId, ...] = Field(default=(), max_length=MAX_REF_AUDIOS, strict=False)


# GenerationRequest's own rules, which a new request's schema keeps.
_REQUEST_EXTRA = GenerationRequest.model_config["json_schema_extra"]
assert isinstance(_REQUEST_EXTRA, dict) and isinstance(_REQUEST_EXTRA["allOf"], list)
_REQUEST_RULES = _REQUEST_EXTRA["allOf"]


def integral_numbers(model: type[BaseModel], data: object) -> object:
    """JSON has one number type: `24.0` is the integer 24 (JSON Schema agrees), `24.5` is not.
    Strings stay refused: strictness is about types, and "24" is text."""
    if not isinstance(data, dict):
        return json_object(data, model)  # the model already, or refused
    ints = _int_fields(model)
    if not any(isinstance(data.get(k), float) for k in ints):
        return data  # nearly every body: nothing to convert, nothing copied
    return {k: int(v) if k in ints and isinstance(v, float) and v.is_integer() else v for k, v in data.items()}


class JobCreate(GenerationRequest):
    """A generation request, plus where it goes in the queue; what a new request may say is
    narrower than what a stored one holds (its prompt not blank, its uploads' ids as minted)."""

    # The document says what the route refuses: a filter (not null) without a webhook to filter.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                *_REQUEST_RULES,
                {
                    "if": {"required": ["webhook_events_filter"], "properties": {"webhook_events_filter": {"type": "array"}}},
                    "then": {"required": ["webhook"], "properties": {"webhook": {"type": "string"}}},
                },
            ]
        }
    )

    prompt: Prompt
    keyframes: KeyframesInput | None = None
    references: ReferencesInput | None = None
    priority: int = Field(default=0, ge=-100, le=100)
    # Replicate's names: where the job's events are POSTed (signed with H3_WEBHOOK_SECRET), and which.
    webhook: str | None = Field(default=None, min_length=1, max_length=MAX_URL_CHARS)
    webhook_events_filter: list[WebhookEvent] | None = Field(default=None, min_length=1, max_length=3)

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers(cls, data: object) -> object:
        return integral_numbers(cls, data)

    @field_validator("width", "height", mode="wrap")
    @classmethod
    def _side(cls, value: object, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> object:
        """A whole number the model cannot make as a side is refused naming the rule and the nearest side."""
        try:
            return handler(value)
        except ValidationError:
            why = sides_refusal((value,)) if isinstance(value, int) and not isinstance(value, bool) else None
            if why is None:
                raise  # not a whole number: the type's own error
            raise PydanticCustomError("side", f"{info.field_name} {value} cannot be made: {why}") from None

    def generation(self) -> GenerationRequest:
        """The generation request alone, without the queue's and the webhook's fields."""
        return GenerationRequest.model_validate(self.model_dump(exclude={"priority", "webhook", "webhook_events_filter"}))

    def webhook_target(self) -> WebhookTarget | None:
        """Where the job's events go and which (default: `DEFAULT_EVENTS`), or None without a
        webhook."""
        if self.webhook is None:
            return None
        events = tuple(dict.fromkeys(self.webhook_events_filter)) if self.webhook_events_filter else DEFAULT_EVENTS
        return WebhookTarget(url=self.webhook, events=events)


class JobPatch(BaseModel):
    """PATCH /v1/jobs/{id}: what of a job may change after it is submitted (a queued job's priority)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    priority: int = Field(ge=-100, le=100)

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers(cls, data: object) -> object:
        return integral_numbers(cls, data)


class NodePatch(BaseModel):
    """PATCH /v1/nodes/{id}: mark a runner node draining (it takes no new jobs; what it runs goes on),
    or clear the mark."""

    model_config = ConfigDict(strict=True, extra="forbid")

    draining: bool
