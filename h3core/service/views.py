"""What the HTTP API says: response bodies, built by pure functions from job state."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from h3core.domain.admission import Ceiling
from h3core.domain.capacity import CeilingRow
from h3core.domain.request import GenerationRequest
from h3core.domain.state import JobState

ApiStatus = Literal["queued", "running", "done", "failed", "cancelled"]


class JobCreate(GenerationRequest):
    """A generation request, plus where it goes in the queue."""

    priority: int = Field(default=0, ge=-100, le=100)

    def generation(self) -> GenerationRequest:
        return GenerationRequest.model_validate(self.model_dump(exclude={"priority"}))


class ErrorView(BaseModel):
    kind: str
    message: str
    detail: str | None = None


class ArtifactView(BaseModel):
    url: str
    bytes: int
    sha256: str
    frames: int
    duration_seconds: float
    media_type: str


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
    request: GenerationRequest


class JobPage(BaseModel):
    items: list[JobView]
    next_cursor: str | None


class Problem(BaseModel):
    """Every 4xx/5xx body: what went wrong, and where it names a field, which."""

    detail: str
    errors: list[dict[str, str]] | None = None
    ceiling: Ceiling | None = None


class GroupView(BaseModel):
    index: int
    size: int
    state: Literal["down", "starting", "ready", "busy", "dead"]
    builds: int
    rebuilds: int
    last_error: str | None
    build_seconds: float | None


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


class ReadyView(BaseModel):
    status: Literal["ready", "not ready"]
    store: str
    executor: str
    runner: str
    groups: list[GroupView] | None = None  # device groups, when the pipeline runs on them
    attention: list[AttentionRowView] | None = None  # the pipeline's attention probe: the chosen kernel and the others


class CeilingView(BaseModel):
    mode: str
    width: int
    height: int
    keyframes: int
    reference_images: int
    max_frames: int
    max_seconds: float
    reason: str
    verified: bool
    tokens_at_max: int | None


class CeilingsView(BaseModel):
    profile: str
    hardware: str
    attention: str
    budget_tokens: int
    api_max_frames: int
    fps: int = 24
    ceilings: list[CeilingView]


def api_status(state: JobState) -> ApiStatus:
    return "queued" if state.status in ("submitted", "queued") else state.status  # type: ignore[return-value]


def job_view(state: JobState, *, now: datetime, queue_position: int | None, base: str = "") -> JobView:
    start = state.started_at
    elapsed = ((state.finished_at or now) - start).total_seconds() if start else 0.0
    error = ErrorView(kind=state.error.kind, message=state.error.message, detail=state.error.detail) if state.error else None
    artifact = None
    if state.artifact is not None:
        a = state.artifact
        artifact = ArtifactView(
            url=f"{base}/v1/jobs/{state.job_id}/video", bytes=a.bytes, sha256=a.sha256, frames=a.frames,
            duration_seconds=a.duration_s, media_type=a.media_type,
        )  # fmt: skip
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
        request=state.request,
    )


def ceiling_view(row: CeilingRow) -> CeilingView:
    s = row.shape
    return CeilingView(
        mode=s.mode, width=s.width, height=s.height, keyframes=s.keyframes, reference_images=s.ref_images,
        max_frames=row.max_frames, max_seconds=round(row.max_frames / 24, 3), reason=row.reason,
        verified=row.verified, tokens_at_max=row.tokens_at_max,
    )  # fmt: skip


def problems(*codes: int) -> dict[int, object]:
    """OpenAPI entries for the error responses a route can give."""
    from litestar.openapi.datastructures import ResponseSpec

    return {code: ResponseSpec(data_container=Problem, description="see `detail`") for code in codes}
