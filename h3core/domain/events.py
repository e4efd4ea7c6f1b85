"""The events a job's log is made of.

An event is an envelope (`job_id`, `seq`, `at`) around one body. Bodies are what callers
construct ("a job made progress"); the store gives them their place in the log.

Every body carries its schema version (`v`), stored and exported with it. Logs outlive the code
that wrote them, so a body is read by upcasting it, step by step, from the version it was written
at to the one this code defines (`h3core.domain.upcasting`); a body without `v` was written
before versions were recorded, at version 1. The rule for changing a body is in docs/events.md.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from h3core.domain import upcasting
from h3core.domain.failures import FailureKind
from h3core.domain.ids import JobId
from h3core.domain.quality import StepCounts
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.domain.segments import SegmentPlan
from h3core.domain.webhooks import WebhookTarget


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class _Body(_Model):
    # The version this body was written at. Its default is the version this code writes: a changed
    # body raises it (`v: int = 2`) and registers an upcaster from the old one (docs/events.md).
    v: int = Field(default=1, ge=1)
    _version: ClassVar[int] = 1  # `v`'s default, kept per class: every body checks it, and model_fields costs

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._version = cls.model_fields["v"].default

    @classmethod
    def version(cls) -> int:
        return cls._version

    @model_validator(mode="after")
    def _current(self) -> _Body:
        if self.v != self._version:
            raise ValueError(
                f"a version {self.v} {type(self).__name__} body: this code reads version {self.version()} (upcast it)"
            )
        return self


class Submitted(_Body):
    """A job was submitted: its request and how it is to be run (priority, retry policy, idempotency
    key, webhook). A job's first event, and only that."""

    v: int = Field(default=3, ge=1)  # 2: `webhook`; 3: `retry_of`, `by`, the request's `quality`
    type: Literal["submitted"] = "submitted"
    request: GenerationRequest
    priority: int = 0
    retry: RetryPolicy = RetryPolicy()
    warnings: tuple[str, ...] = ()
    idempotency_key: str | None = None
    # The job whose parameters this one reuses with a new prompt (a remix); None in older logs.
    remixed_from: str | None = Field(default=None, min_length=1, max_length=64)
    # The ended job this one runs again (a retry asked for by someone); None in older logs.
    retry_of: str | None = Field(default=None, min_length=1, max_length=64)
    # Who submitted it: the name of the API token it came with; None without tokens, and in older logs.
    by: str | None = Field(default=None, max_length=64)
    # Where the job's events are sent, and which (POST /v1/jobs `webhook`); None in older logs.
    webhook: WebhookTarget | None = None


class Admitted(_Body):
    """Admission accepted the request: the job is queued (`tokens`: its count, where the policy computed one)."""

    type: Literal["admitted"] = "admitted"
    # The request's token count where the admission policy computed one (capacity evidence).
    tokens: int | None = None


class Planned(_Body):
    """Admission planned the video, longer than the model's window, as segments (`plan`), each
    continuing the last; written with `admitted`, before any attempt."""

    type: Literal["planned"] = "planned"
    plan: SegmentPlan


class Running(_Body):
    """An attempt started on `executor`; `executor_ref` names the executor's own work for it, where it has one."""

    type: Literal["running"] = "running"
    attempt: int = Field(ge=1)
    executor: str
    executor_ref: str | None = None
    # What the executor chose for this attempt (attention kernel, device group, ...).
    info: dict[str, str] = Field(default_factory=dict)


class Resumed(_Body):
    """After h3core restarted, the runner follows the running attempt again instead of failing it:
    its work ran on outside h3core (a ComfyUI prompt), and `executor_ref` names that work."""

    type: Literal["resumed"] = "resumed"
    attempt: int = Field(ge=1)
    executor_ref: str = Field(min_length=1)
    # How long no h3core process followed the attempt: seconds from when the previous process
    # stopped following it (its `detached` event; after a crash, the last event it wrote) to the
    # resume. At most that long: the work may have made progress meanwhile.
    after_s: float = Field(ge=0)


class Detached(_Body):
    """h3core stopped while the running attempt's work went on outside it (a ComfyUI prompt left
    running): nothing ended, and the next start resumes the attempt (`resumed`) from here."""

    type: Literal["detached"] = "detached"
    attempt: int = Field(ge=1)
    executor_ref: str = Field(min_length=1)


class Progress(_Body):
    """The running attempt reached step `step` of `total`."""

    type: Literal["progress"] = "progress"
    step: int = Field(ge=0)
    total: int = Field(ge=1)


class Checkpoint(_Model):
    """A denoising checkpoint: the state an attempt's loop had after step `step` of `total`,
    stored at `path` (relative to the artifact store's root) with its size and sha256. Any attempt
    of the job may continue from it. Part of `checkpointed`, `restored` and `checkpoint_rejected`."""

    attempt: int = Field(ge=1)  # the attempt that wrote it
    step: int = Field(ge=1)
    total: int = Field(ge=1)
    path: str = Field(min_length=1)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Checkpointed(_Body):
    """The running attempt stored a denoising checkpoint (written and synced before this event):
    a later attempt may continue from it instead of from step 0."""

    type: Literal["checkpointed"] = "checkpointed"
    checkpoint: Checkpoint
    # How long the denoising loop waited for it (the copy off the device), and how long the
    # write took in all: what a checkpoint cost this job.
    paused_s: float = Field(default=0.0, ge=0)
    write_s: float = Field(default=0.0, ge=0)


class Restored(_Body):
    """The running attempt continues from `checkpoint` (its size and sha256 checked): its first
    step is the checkpoint's step + 1, and the steps before it are not computed again."""

    type: Literal["restored"] = "restored"
    attempt: int = Field(ge=1)
    checkpoint: Checkpoint


class CheckpointRejected(_Body):
    """A checkpoint the running attempt could have continued from is unusable (missing, truncated,
    its sha256 not the one recorded): it is never used, and the one before it (or step 0) is."""

    type: Literal["checkpoint_rejected"] = "checkpoint_rejected"
    attempt: int = Field(ge=1)
    checkpoint: Checkpoint
    reason: str


class Released(_Body):
    """h3core itself stopped the running attempt (a graceful stop: a deploy, an operator's
    `serve` stopped) and handed the job back to the queue: not a failure, so the next attempt does
    not count against the retry policy. `step`: the last step the attempt reached."""

    type: Literal["released"] = "released"
    attempt: int = Field(ge=1)
    reason: str
    step: int | None = Field(default=None, ge=0)


class Artifact(_Model):
    """A finished video. `path` is relative to the artifact store's root, never a client's.
    Part of `done` and `recovered`: changing it changes their versions."""

    path: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    frames: int = Field(ge=0)
    duration_s: float = Field(ge=0)
    media_type: str = "video/mp4"


class SegmentDone(_Body):
    """Segment `index` of the job's plan is made and committed (`artifact`: its segment file, the
    frames it keeps): no later attempt makes it again. Only while running, in the plan's order."""

    type: Literal["segment_done"] = "segment_done"
    index: int = Field(ge=0)
    artifact: Artifact


class Done(_Body):
    """The job finished with its video (`artifact`). Terminal."""

    v: int = Field(default=3, ge=1)  # 2: `cancel_too_late`; 3: `steps`
    type: Literal["done"] = "done"
    artifact: Artifact
    tokens: int | None = None
    # A cancel was requested, but the work had finished before the stop could take effect: the
    # video is kept and the job is done, not cancelled.
    cancel_too_late: bool = False
    # The transformer steps computed and served from the cache, at the request's quality level,
    # where the executor counts them (None: it does not, or an older log).
    steps: StepCounts | None = None


class _Failure(_Body):
    v: int = Field(default=2, ge=1)  # 2: the kind `not_started`
    kind: FailureKind
    message: str
    detail: str | None = None
    tokens: int | None = None


class AttemptFailed(_Failure):
    """An attempt failed and the job's retry policy gives it another; not terminal."""

    type: Literal["attempt_failed"] = "attempt_failed"
    attempt: int = Field(ge=1)


class Failed(_Failure):
    """The job failed and is not retried. Terminal."""

    type: Literal["failed"] = "failed"


class CancelRequested(_Body):
    """A cancel of the running job was asked for (a queued job is cancelled at once). Not terminal:
    the job is not retried, and ends `cancelled` once its work stops, or `done` or `failed` where
    the work ended first."""

    v: int = Field(default=2, ge=1)  # 2: `by`
    type: Literal["cancel_requested"] = "cancel_requested"
    reason: str = ""
    by: str | None = Field(default=None, max_length=64)  # who asked: an API token's name


class Reprioritized(_Body):
    """A queued job's priority was changed: where it stands in the queue from now on (higher starts
    first). Only while queued: a job that has started keeps its place."""

    type: Literal["reprioritized"] = "reprioritized"
    priority: int = Field(ge=-100, le=100)
    by: str | None = Field(default=None, max_length=64)  # who changed it: an API token's name


class Cancelled(_Body):
    """The job was cancelled. Terminal."""

    v: int = Field(default=2, ge=1)  # 2: `by`
    type: Literal["cancelled"] = "cancelled"
    reason: str = ""
    by: str | None = Field(default=None, max_length=64)  # who asked: an API token's name


class Recovered(_Body):
    """The running attempt had committed its video before h3core stopped; recovery checked the
    file against what the commit recorded (size and sha256). Only `Done` with that video follows."""

    type: Literal["recovered"] = "recovered"
    attempt: int = Field(ge=1)
    artifact: Artifact


Body = Annotated[
    Submitted
    | Admitted
    | Planned
    | Running
    | Resumed
    | Detached
    | Progress
    | SegmentDone
    | Done
    | AttemptFailed
    | Failed
    | CancelRequested
    | Reprioritized
    | Cancelled
    | Recovered
    | Checkpointed
    | Restored
    | CheckpointRejected
    | Released,
    Field(discriminator="type"),
]
TERMINAL_TYPES = frozenset({"done", "failed", "cancelled"})


class Event(BaseModel):
    """One entry of a job's log: `body`, at position `seq` (from 1, without gaps) of job `job_id`, stored at `at`."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    job_id: JobId
    seq: int = Field(ge=1)
    at: AwareDatetime
    body: Body

    @property
    def type(self) -> str:
        """The body's type ("submitted", "running", ...)."""
        return self.body.type

    @property
    def terminal(self) -> bool:
        """Whether the body ends the job (`done`, `failed` or `cancelled`)."""
        return self.body.type in TERMINAL_TYPES


_EVENT = TypeAdapter(Event)
_BODY = TypeAdapter(Body)
# The version this code writes, of each body type.
VERSIONS: dict[str, int] = {cls.model_fields["type"].default: cls.version() for cls in get_args(get_args(Body)[0])}


def event_from_json(data: str | bytes) -> Event:
    """An event as stored or exported, at whatever version its body was written."""
    return _read(_EVENT, data, "body")


def body_from_json(data: str | bytes) -> Body:
    """A body as stored, at whatever version it was written."""
    return _read(_BODY, data, None)


def _read(adapter: TypeAdapter[Any], data: str | bytes, key: str | None) -> Any:
    """`data` validated by `adapter`, its body (at `key`, or `data` itself) upcast first where it
    was written at an older version. Bodies of types never bumped take one pass."""
    error: ValidationError | None = None
    try:
        value = adapter.validate_json(data)
        if VERSIONS[value.type] == 1:
            return value
    except ValidationError as exc:
        error = exc
    raw = _json(data)
    body = raw.get(key) if key is not None and isinstance(raw, dict) else raw
    if not isinstance(body, dict) or not _stale(body):  # current, or not a body at all
        if error is not None:
            raise error
        return value
    current = upcast(body)
    return adapter.validate_json(json.dumps({**raw, key: current} if key is not None else current))


def _json(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None  # not JSON at all: the validation error stands


def _stale(body: dict[str, Any]) -> bool:
    return body.get("v", 1) != VERSIONS.get(str(body.get("type")))


def upcast(body: dict[str, Any]) -> dict[str, Any]:
    """A stored body (a JSON object) at the version this code writes of its type; `NewerBody` if it
    was written by a newer h3core."""
    return upcasting.upcast(body, VERSIONS)


def event_at(job_id: str, seq: int, at: datetime, body: Body) -> Event:
    """The event of `job_id` at `seq` and time `at` around `body`, validated."""
    return Event(job_id=job_id, seq=seq, at=at, body=body)
