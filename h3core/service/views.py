"""What the HTTP API says: response bodies, built by pure functions from job state."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Literal

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
from h3core.domain.admission import Ceiling, CeilingRow, Contract
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
from h3core.domain.state import JobState
from h3core.domain.webhooks import DEFAULT_EVENTS, MAX_URL_CHARS, WebhookEvent, WebhookTarget

ApiStatus = Literal["queued", "running", "done", "failed", "cancelled"]

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
    wrong = [str(n) for n in sides if n % SIDE_MULTIPLE or not MIN_SIDE <= n <= MAX_SIDE]
    if not wrong:
        return None
    nearest = "x".join(str(_nearest_side(n)) for n in sides)
    what = "size" if len(sides) > 1 else "side"
    return (
        f"MiniMax-H3 makes sides that are multiples of {SIDE_MULTIPLE} from {MIN_SIDE} to {MAX_SIDE}, "
        f"and {' and '.join(dict.fromkeys(wrong))} is not; the nearest {what} it makes is {nearest}"
    )


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


class JobCreate(GenerationRequest):
    """A generation request, plus where it goes in the queue; what a new request may say is
    narrower than what a stored one holds (its prompt not blank, its uploads' ids as minted)."""

    # The document says what the route refuses: a filter (not null) without a webhook to filter.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                *GenerationRequest.model_config["json_schema_extra"]["allOf"],  # type: ignore[index]
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
        """JSON has one number type: `24.0` is the integer 24 (JSON Schema agrees), `24.5` is not.
        Strings stay refused: strictness is about types, and "24" is text."""
        if not isinstance(json_object(data, cls), dict):
            return data
        ints = _int_fields(cls)
        if not any(isinstance(data.get(k), float) for k in ints):
            return data  # nearly every body: nothing to convert, nothing copied
        return {k: int(v) if k in ints and isinstance(v, float) and v.is_integer() else v for k, v in data.items()}

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
        return GenerationRequest.model_validate(self.model_dump(exclude={"priority", "webhook", "webhook_events_filter"}))

    def webhook_target(self) -> WebhookTarget | None:
        if self.webhook is None:
            return None
        events = tuple(dict.fromkeys(self.webhook_events_filter)) if self.webhook_events_filter else DEFAULT_EVENTS
        return WebhookTarget(url=self.webhook, events=events)


class ErrorView(BaseModel):
    kind: str
    message: str
    detail: str | None = None


class ArtifactView(BaseModel):
    url: str | None  # null once the video was deleted: nothing is left to download
    bytes: int
    sha256: str
    frames: int
    duration_seconds: float
    media_type: str
    deleted_at: datetime | None = None  # when its file was deleted (DELETE /v1/videos/{id}); the record stays


class JobView(BaseModel):
    id: str
    status: ApiStatus
    step: int | None
    total_steps: int
    elapsed_seconds: float
    queue_position: int | None
    attempt: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: ErrorView | None
    warnings: list[str]
    artifact: ArtifactView | None
    tokens: int | None
    # Queued and unable to start now, and why (the executor is not ready for its mode); null when
    # the job waits only for a free slot, or is not queued.
    waiting: str | None = None
    request: GenerationRequest
    remixed_from: str | None = None  # the job whose parameters this one reuses with a new prompt


class JobPage(BaseModel):
    items: list[JobView]
    next_cursor: str | None


class Problem(BaseModel):
    """Every 4xx/5xx body: what went wrong, and where it names a field, which."""

    detail: str
    errors: list[dict[str, str]] | None = None
    ceiling: Ceiling | None = None
    # A refused submission: the limit it broke (vram, model_window, mode_unavailable, ...); a refused
    # cancel: `too_late` where the job had finished (it is done, its video kept).
    reason: str | None = None
    status: ApiStatus | None = None  # a refused cancel: the state the job ended in
    limit: int | None = None  # a body or upload too large (413): the limit in bytes
    setting: str | None = None  # and the setting that sets it


class GroupView(BaseModel):
    index: int
    size: int
    state: Literal["down", "starting", "ready", "busy", "dead"]
    builds: int
    rebuilds: int
    last_error: str | None
    build_seconds: float | None


class ModeView(BaseModel):
    mode: str
    served: bool  # false: this deployment never runs the mode (submits are refused)
    ready: bool  # true: a job in this mode can start now
    reason: str | None


class AttentionRowView(BaseModel):
    """One kernel as the pipeline's start-up probe found it (`kernel_probe`)."""

    kernel: str
    verdict: Literal["chosen", "accepted", "rejected", "failed", "unsupported", "not needed"]
    ms: float | None  # one attention call at `tokens`, median
    tokens: int | None
    peak_bytes: int | None
    error: float | None  # relative L1 against the float32 reference (null where not finite: see the note)
    note: str

    @field_validator("ms", "error", mode="before")
    @classmethod
    def _finite(cls, value):
        return value if value is None or math.isfinite(value) else None


class NodeView(BaseModel):
    """A runner node of a store shared by several (PostgreSQL)."""

    node_id: str
    host: str
    pid: int
    slots: int
    leases: int  # attempts it runs now
    modes: list[str]  # what its executor can start now
    beat_age_s: float  # seconds since its last heartbeat, by the store's clock
    lease_s: float
    alive: bool  # beat within its lease and not stopped


class ReadyView(BaseModel):
    status: Literal["ready", "not ready"]
    store: str
    executor: str
    runner: str
    modes: list[ModeView]
    problems: list[str]  # every reason a mode cannot run now, none left out
    groups: list[GroupView] | None = None  # device groups, when the pipeline runs on them
    attention: list[AttentionRowView] | None = None  # the pipeline's attention probe: the chosen kernel and the others
    node: str | None = None  # this process's node id, on a store shared by runner nodes
    nodes: list[NodeView] | None = None  # every runner node of such a store


class ReadyStatus(BaseModel):
    """/readyz for a caller without a valid token (when tokens are set): no paths, no pids."""

    model_config = ConfigDict(extra="forbid")  # the schema says so: a ReadyView is not one

    status: Literal["ready", "not ready"]


class CeilingView(BaseModel):
    mode: str
    width: int
    height: int
    keyframes: int
    reference_images: int
    min_frames: int
    max_frames: int
    max_seconds: float
    reason: str  # what sets max_frames: vram, unverified, quality, model_window, mode_unavailable, api_limit
    verified: bool
    tokens_at_max: int | None
    why: str


class BudgetView(BaseModel):
    group_size: int
    tokens: int | None  # null: nothing measured or configured for groups of this size
    verified: bool
    source: str


class WindowView(BaseModel):
    min_seconds: float
    max_seconds: float | None
    source: str


class CeilingsView(BaseModel):
    executor: str
    hardware: str
    kernel: str | None
    profile: str | None  # the capacity profile that describes this executor, if any
    profile_hardware: str | None
    attention: str | None
    budgets: list[BudgetView]
    window: WindowView | None  # the model's clip window
    max_tokens: int | None  # the attention kernel's own limit
    api_max_frames: int
    fps: int = 24
    ceilings: list[CeilingView]


def api_status(state: JobState) -> ApiStatus:
    return "queued" if state.status in ("submitted", "queued") else state.status  # type: ignore[return-value]


def job_view(
    state: JobState,
    *,
    now: datetime,
    queue_position: int | None,
    base: str = "",
    waiting: str | None = None,
    deleted_at: datetime | None = None,
) -> JobView:
    start = state.started_at
    elapsed = ((state.finished_at or now) - start).total_seconds() if start else 0.0
    error = ErrorView(kind=state.error.kind, message=state.error.message, detail=state.error.detail) if state.error else None
    artifact = None
    if state.artifact is not None:
        a = state.artifact
        artifact = ArtifactView(
            url=f"{base}/v1/jobs/{state.job_id}/video" if deleted_at is None else None,
            bytes=a.bytes,
            sha256=a.sha256,
            frames=a.frames,
            duration_seconds=a.duration_s,
            media_type=a.media_type,
            deleted_at=deleted_at,
        )
    return JobView(
        id=state.job_id,
        status=api_status(state),
        step=state.step,
        total_steps=state.total or state.request.steps,
        elapsed_seconds=round(max(elapsed, 0.0), 3),
        queue_position=queue_position,
        attempt=state.attempt,
        cancel_requested=state.cancel_requested,
        created_at=state.created_at,
        started_at=state.started_at,
        finished_at=state.finished_at,
        error=error,
        warnings=list(state.warnings),
        artifact=artifact,
        tokens=state.tokens,
        waiting=waiting if api_status(state) == "queued" else None,
        request=state.request,
        remixed_from=state.remixed_from,
    )


def ceiling_view(row: CeilingRow) -> CeilingView:
    s = row.shape
    return CeilingView(
        mode=s.mode,
        width=s.width,
        height=s.height,
        keyframes=s.keyframes,
        reference_images=s.ref_images,
        min_frames=row.min_frames,
        max_frames=row.max_frames,
        max_seconds=round(row.max_frames / 24, 3),
        reason=row.reason,
        verified=row.verified,
        tokens_at_max=row.tokens_at_max,
        why=row.why,
    )


def ceilings_view(contract: Contract, rows: Sequence[CeilingRow] | None = None) -> CeilingsView:
    """`contract` describes the deployment; `rows` (default: its own) may be several nodes' best."""
    caps, profile = contract.caps, contract.profile
    window = caps.window
    return CeilingsView(
        executor=caps.executor,
        hardware=caps.hardware,
        kernel=caps.kernel,
        profile=profile.name if profile else None,
        profile_hardware=profile.hardware if profile else None,
        attention=profile.attention if profile else None,
        budgets=[
            BudgetView(group_size=g.size, tokens=g.tokens, verified=g.verified, source=g.source or "none measured")
            for g in caps.groups
        ],
        window=WindowView(min_seconds=window.min_seconds, max_seconds=window.max_seconds, source=window.source)
        if window
        else None,
        max_tokens=caps.max_tokens,
        api_max_frames=contract.api_max_frames,
        ceilings=[ceiling_view(r) for r in (contract.ceilings() if rows is None else rows)],
    )


def problems(*codes: int) -> dict[int, object]:
    """OpenAPI entries for the error responses a route can give."""
    from litestar.openapi.datastructures import ResponseSpec

    return {code: ResponseSpec(data_container=Problem, description="see `detail`") for code in codes}
