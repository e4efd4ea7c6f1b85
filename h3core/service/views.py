"""What the HTTP API says: response bodies, built by pure functions from job state."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from h3core.domain.admission import AdmissionRules, Ceiling, CeilingRow
from h3core.domain.request import GenerationRequest
from h3core.domain.state import JobState

if TYPE_CHECKING:
    from litestar.openapi.datastructures import ResponseSpec

    from h3core.adapters.store.nodes import NodeRow

__all__ = [
    "ApiStatus",
    "ArtifactView",
    "AttentionRowView",
    "BudgetView",
    "CeilingView",
    "CeilingsView",
    "ErrorView",
    "GroupView",
    "JobPage",
    "JobView",
    "ModeView",
    "DrainView",
    "NodeView",
    "Problem",
    "ReadyStatus",
    "ReadyView",
    "SegmentsView",
    "WindowView",
    "api_status",
    "ceiling_view",
    "ceilings_view",
    "job_view",
    "problems",
    "segments_view",
]

ApiStatus = Literal["queued", "running", "done", "failed", "cancelled"]


class ErrorView(BaseModel):  # noqa: D101
    kind: str
    message: str
    detail: str | None = None


class ArtifactView(BaseModel):  # noqa: D101
    url: str | None  # null once the video was deleted: nothing is left to download
    bytes: int
    sha256: str
    frames: int
    duration_seconds: float
    media_type: str
    deleted_at: datetime | None = None  # when its file was deleted (DELETE /v1/videos/{id}); the record stays


class SegmentsView(BaseModel):
    """A video longer than the model's window, made as segments that each continue the last (its
    `planned` event): how many, how many are made, and which is being made."""

    count: int = Field(ge=1)
    done: int = Field(ge=0)  # made and kept (through retries)
    # The one being made, or made next (from 0, as `segment_done`'s `index`); null once all are made.
    current: int | None = Field(default=None, ge=0)
    plan: str  # the plan in words ("3 segments of 10.04, 10 and 10 s, joined at 10.04 s and 20.04 s")


class JobView(BaseModel):  # noqa: D101
    id: str
    status: ApiStatus
    step: int | None = Field(
        description="The whole job's denoising steps done so far (null: none yet); for a video made as segments, "
        "those of every segment made and of the one being made, so it never goes back"
    )
    total_steps: int = Field(
        description="The whole job's denoising steps: the request's `steps` (as the executor counts them once it reports), "
        "times `segments.count` for a video made as segments"
    )
    elapsed_seconds: float
    queue_position: int | None
    priority: int = 0  # higher starts first among the queued
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
    retry_of: str | None = None  # the ended job this one runs again (POST /v1/jobs/{id}/retry)
    submitted_by: str | None = None  # the name of the API token it was submitted with
    # A video longer than the model's window: its segments (null for a video made in one call).
    segments: SegmentsView | None = None


class JobPage(BaseModel):  # noqa: D101
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


class GroupView(BaseModel):  # noqa: D101
    index: int
    size: int
    state: Literal["down", "starting", "ready", "busy", "dead"]
    builds: int
    rebuilds: int
    last_error: str | None
    build_seconds: float | None


class ModeView(BaseModel):  # noqa: D101
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


class DrainView(BaseModel):
    """A node's drain: it takes no new jobs (what it runs goes on) since `since`, marked by `by`."""

    since: datetime
    by: str | None = None


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
    drain: DrainView | None = None  # marked draining: it takes no new jobs until cleared

    @classmethod
    def of(cls, row: NodeRow) -> NodeView:
        """The view of a node as the store keeps it."""
        return cls(**row.model_dump(include=set(cls.model_fields) - {"alive"}), alive=row.alive())


class ReadyView(BaseModel):  # noqa: D101
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


class HealthView(BaseModel):
    """/healthz: whether the process can do its job, and where it cannot, why (not told to a caller
    without a valid token when tokens are set)."""

    status: Literal["ok", "failing"]
    reason: str | None = None


class ReadyStatus(BaseModel):
    """/readyz for a caller without a valid token (when tokens are set): no paths, no pids."""

    model_config = ConfigDict(extra="forbid")  # the schema says so: a ReadyView is not one

    status: Literal["ready", "not ready"]


class CeilingView(BaseModel):  # noqa: D101
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


class BudgetView(BaseModel):  # noqa: D101
    group_size: int
    tokens: int | None  # null: nothing measured or configured for groups of this size
    verified: bool
    source: str


class WindowView(BaseModel):  # noqa: D101
    min_seconds: float
    max_seconds: float | None
    source: str


class CeilingsView(BaseModel):  # noqa: D101
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
    """The status a client sees: a job still `submitted` is `queued`."""
    return "queued" if state.status == "submitted" else state.status


def job_view(
    state: JobState,
    *,
    now: datetime,
    queue_position: int | None,
    base: str = "",
    waiting: str | None = None,
    deleted_at: datetime | None = None,
) -> JobView:
    """The job as /v1/jobs shows it at `now`: its video's url under `base` (null once deleted at
    `deleted_at`), and `waiting` only while it is queued."""
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
        step=state.steps_done,
        total_steps=state.steps_total,
        elapsed_seconds=round(max(elapsed, 0.0), 3),
        queue_position=queue_position,
        priority=state.priority,
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
        retry_of=state.retry_of,
        submitted_by=state.submitted_by,
        segments=segments_view(state),
    )


def segments_view(state: JobState) -> SegmentsView | None:
    """A segmented job's segments as /v1/jobs shows them; None for a job made in one call."""
    if state.plan is None:
        return None
    plan = state.plan
    return SegmentsView(count=len(plan.segments), done=len(state.segments), current=state.segment, plan=plan.describe())


def ceiling_view(row: CeilingRow) -> CeilingView:
    """A ceiling row as /v1/ceilings lists it, its frames also in seconds at 24 fps."""
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


def ceilings_view(contract: AdmissionRules, rows: Sequence[CeilingRow] | None = None) -> CeilingsView:
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


def problems(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error responses a route can give."""
    from litestar.openapi.datastructures import ResponseSpec

    return {code: ResponseSpec(data_container=Problem, description="see `detail`") for code in codes}
