"""Admission by measured capacity: one token budget, with its evidence attached.

A `CapacityProfile` is data an operator edits: the hardware, the attention kernel, the measured
runs (ran or ran out of memory), quality caps, the API's hard cap, and what to do where nothing
was measured (requests with references). The budget is derived from the measurements, never
typed in: the largest run that fit, plus a stated share of the gap to the smallest that did not.

`CapacityPolicy` is the one code path that judges a submission and produces the ceilings table:
`ceiling(shape)` is, by construction, the largest frame count `decide` admits for that shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from h3core.domain.admission import Admit, Ceiling, CeilingReason, Decision, Refuse
from h3core.domain.geometry import CLIP, Media, TokenCount, count_tokens, snap_frames
from h3core.domain.request import GenerationRequest, Keyframes, Mode, References

Outcome = Literal["ran", "oom"]


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MeasuredPoint(_Data):
    width: int
    height: int
    frames: int
    mode: Mode = "t2va"
    keyframes: int = Field(default=0, ge=0, le=2)
    ref_images: int = Field(default=0, ge=0)
    outcome: Outcome
    note: str = ""

    def request(self) -> GenerationRequest:
        return Shape.model_validate(self.model_dump(include=set(Shape.model_fields))).request(self.frames)

    @property
    def tokens(self) -> int:
        return count_tokens(self.request()).total


class QualityCap(_Data):
    width: int
    height: int
    max_frames: int = Field(ge=1)
    note: str = ""


class ReferencePolicy(_Data):
    """What to do with requests that carry references, where the budget is unmeasured."""

    policy: Literal["reject", "budget"] = "reject"
    budget_tokens: int | None = Field(default=None, ge=0)
    note: str = ""
    points: tuple[MeasuredPoint, ...] = ()

    @model_validator(mode="after")
    def _budget_given(self) -> ReferencePolicy:
        if self.policy == "budget" and self.budget_tokens is None:
            raise ValueError("references.policy 'budget' needs references.budget_tokens")
        return self


class Budget(_Data):
    tokens: int
    largest_ran: MeasuredPoint
    largest_ran_tokens: int
    smallest_oom: MeasuredPoint | None
    smallest_oom_tokens: int | None
    safety_margin: float


class CapacityProfile(_Data):
    name: str
    hardware: str
    attention: str
    api_max_frames: int = Field(ge=1)
    # Where between the largest run that fit (0.0) and the smallest OOM (1.0) the budget sits.
    safety_margin: float = Field(default=0.0, ge=0.0, lt=1.0)
    resolutions: tuple[tuple[int, int], ...]
    points: tuple[MeasuredPoint, ...] = Field(min_length=1)
    quality_caps: tuple[QualityCap, ...] = ()
    references: ReferencePolicy = ReferencePolicy()

    @model_validator(mode="after")
    def _consistent(self) -> CapacityProfile:
        plain = [p for p in self.points if p.ref_images == 0]
        if not any(p.outcome == "ran" for p in plain):
            raise ValueError("points: at least one run without references that ran is needed for a budget")
        ran = max(p.tokens for p in plain if p.outcome == "ran")
        ooms = [p for p in plain if p.outcome == "oom"]
        if ooms and min(p.tokens for p in ooms) <= ran:
            bad = min(ooms, key=lambda p: p.tokens)
            raise ValueError(
                f"points contradict one budget: {bad.width}x{bad.height}x{bad.frames} ran out of memory "
                f"at {bad.tokens} tokens, but a run of {ran} tokens fit"
            )
        return self

    def budget(self) -> Budget:
        plain = [p for p in self.points if p.ref_images == 0]
        largest = max((p for p in plain if p.outcome == "ran"), key=lambda p: p.tokens)
        ooms = [p for p in plain if p.outcome == "oom"]
        smallest = min(ooms, key=lambda p: p.tokens) if ooms else None
        tokens = largest.tokens
        if smallest is not None:
            # Stay strictly below the smallest failure whatever the margin.
            tokens += min(int(self.safety_margin * (smallest.tokens - largest.tokens)), smallest.tokens - largest.tokens - 1)
        return Budget(
            tokens=tokens,
            largest_ran=largest,
            largest_ran_tokens=largest.tokens,
            smallest_oom=smallest,
            smallest_oom_tokens=smallest.tokens if smallest else None,
            safety_margin=self.safety_margin,
        )


class Shape(_Data):
    """Everything about a request that admission looks at, except its length."""

    mode: Mode = "t2va"
    width: int
    height: int
    keyframes: int = Field(default=0, ge=0, le=2)
    ref_images: int = 0
    ref_videos: int = 0
    ref_audios: int = 0

    @classmethod
    def of(cls, r: GenerationRequest) -> Shape:
        kf = sum(k is not None for k in (r.keyframes.first, r.keyframes.last)) if r.keyframes else 0
        refs = r.references
        return cls(
            mode=r.mode,
            width=r.width,
            height=r.height,
            keyframes=kf,
            ref_images=len(refs.images) if refs else 0,
            ref_videos=len(refs.videos) if refs else 0,
            ref_audios=len(refs.audios) if refs else 0,
        )

    @model_validator(mode="after")
    def _mode_inputs(self) -> Shape:
        if (self.mode == "fl2va") != (self.keyframes > 0):
            raise ValueError("keyframes: fl2va takes 1 or 2 keyframes, other modes none")
        if (self.mode == "ref2va") != self.has_references:
            raise ValueError("references: ref2va takes at least one reference, other modes none")
        return self

    @property
    def has_references(self) -> bool:
        return bool(self.ref_images or self.ref_videos or self.ref_audios)

    def request(self, frames: int) -> GenerationRequest:
        """A stand-in request of this shape (prompt and ids are placeholders)."""
        keyframes = None
        if self.mode == "fl2va":
            keyframes = Keyframes(first="k1", last="k2" if self.keyframes == 2 else None)
        references = None
        if self.mode == "ref2va":
            references = References(
                images=tuple(f"i{n}" for n in range(self.ref_images)),
                videos=tuple(f"v{n}" for n in range(self.ref_videos)),
                audios=tuple(f"a{n}" for n in range(self.ref_audios)),
            )
        return GenerationRequest(
            mode=self.mode, prompt="-", width=self.width, height=self.height, frames=frames,
            keyframes=keyframes, references=references,
        )  # fmt: skip


class CeilingRow(_Data):
    shape: Shape
    max_frames: int
    reason: CeilingReason
    verified: bool
    tokens_at_max: int | None  # the sequence length of a request at the ceiling
    budget_tokens: int | None


_REASON_ORDER: dict[str, int] = {"vram": 0, "quality": 1, "api_limit": 2}


class CapacityPolicy:
    """The admission policy for a measured profile. Pure: a function of the profile."""

    def __init__(self, profile: CapacityProfile) -> None:
        self.profile = profile
        self.budget = profile.budget()

    # The single judgement both `decide` and `ceiling` rest on.
    def _judge(self, request: GenerationRequest, media: Mapping[str, Media]) -> tuple[Ceiling | None, TokenCount]:
        """None if `request` is admissible, else the kind of limit it breaks."""
        p = self.profile
        shape = Shape.of(request)
        tokens = count_tokens(request, media)
        cap = self._quality_cap(shape)
        if cap is not None and request.frames > cap:
            return Ceiling(max_frames=cap, reason="quality"), tokens
        if request.frames > p.api_max_frames:
            return Ceiling(max_frames=p.api_max_frames, reason="api_limit"), tokens
        budget, verified = self._budget_for(shape)
        if budget is None or tokens.total > budget:
            return Ceiling(max_frames=0, reason="vram", verified=verified), tokens
        return None, tokens

    def _quality_cap(self, shape: Shape) -> int | None:
        caps = [c.max_frames for c in self.profile.quality_caps if (c.width, c.height) == (shape.width, shape.height)]
        return min(caps) if caps else None

    def _budget_for(self, shape: Shape) -> tuple[int | None, bool]:
        if not shape.has_references:
            return self.budget.tokens, True
        refs = self.profile.references
        return (refs.budget_tokens if refs.policy == "budget" else None), False

    def ceiling(self, like: Shape | GenerationRequest, media: Mapping[str, Media] | None = None) -> CeilingRow:
        """The largest frame count admitted for requests like `like` (all but its length)."""
        media = media or {}
        template = like.request(1) if isinstance(like, Shape) else like
        shape = Shape.of(template)
        budget, verified = self._budget_for(shape)
        top = self.profile.api_max_frames
        cap = self._quality_cap(shape)
        if cap is not None:
            top = min(top, cap)
        # Tokens only change at snapped counts (17n + 5), and admission is monotone in frames:
        # walk those upwards (and `top` itself) until the first refusal.
        best = 0
        for frames in [*range(snap_frames(1), top, CLIP), top]:
            if self._judge(template.model_copy(update={"frames": frames}), media)[0] is not None:
                break
            best = frames
        if best > 0 and best == top:
            reason: CeilingReason = "quality" if cap is not None and cap <= self.profile.api_max_frames else "api_limit"
        else:
            reason = "vram"
        tokens = count_tokens(template.model_copy(update={"frames": best}), media).total if best else None
        return CeilingRow(
            shape=shape, max_frames=best, reason=reason, verified=verified, tokens_at_max=tokens, budget_tokens=budget
        )

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        media = media or {}
        shape = Shape.of(request)
        limit, tokens = self._judge(request, media)
        if limit is None:
            return Admit(tokens=tokens.total)
        row = self.ceiling(request, media)
        ceiling = Ceiling(max_frames=row.max_frames, reason=row.reason, verified=row.verified)
        where = f"{shape.width}x{shape.height} {shape.mode}"
        if limit.reason == "vram" and row.budget_tokens is None:
            why = (
                f"requests with references have no measured memory budget on {self.profile.name}, "
                f"and this profile rejects them ({self.profile.references.note or 'references.policy = reject'})"
            )
        elif limit.reason == "vram":
            unverified = " (unverified: no measurement backs this budget)" if not row.verified else ""
            why = f"it needs {tokens.total} tokens, over the {row.budget_tokens}-token budget of {self.profile.name}{unverified}"
        elif limit.reason == "quality":
            why = f"the quality cap at {shape.width}x{shape.height} is {limit.max_frames} frames"
        else:
            why = f"the API limit is {self.profile.api_max_frames} frames"
        detail = f"{request.frames} frames at {where} refused: {why}; at most {row.max_frames} frames are admitted ({row.reason})"
        return Refuse(detail=detail, ceiling=ceiling)

    def ceilings(self) -> list[CeilingRow]:
        """The table the console reads: every offered resolution, for each mode."""
        rows = []
        for w, h in self.profile.resolutions:
            for shape in (
                Shape(mode="t2va", width=w, height=h),
                Shape(mode="fl2va", width=w, height=h, keyframes=1),
                Shape(mode="fl2va", width=w, height=h, keyframes=2),
                Shape(mode="ref2va", width=w, height=h, ref_images=1),
            ):
                rows.append(self.ceiling(shape))
        return rows


class Evidence(_Data):
    job_id: str
    tokens: int
    outcome: Outcome
    references: bool


class Fit(_Data):
    """A proposed budget from what jobs did, and the jobs that bound it."""

    references: bool
    ran: int
    oom: int
    bound_below: Evidence | None  # the largest job that ran
    bound_above: Evidence | None  # the smallest job that ran out of memory
    contradictions: tuple[tuple[Evidence, Evidence], ...]  # an OOM at or below a success
    proposed_budget: int | None


def fit(evidence: Iterable[Evidence], *, safety_margin: float = 0.0) -> list[Fit]:
    """Propose budgets (one without references, one with) from done and OOM jobs. Pure."""
    out = []
    items = list(evidence)
    for refs in (False, True):
        group = [e for e in items if e.references == refs]
        if not group:
            continue
        ran = [e for e in group if e.outcome == "ran"]
        oom = [e for e in group if e.outcome == "oom"]
        below = max(ran, key=lambda e: e.tokens) if ran else None
        above = min(oom, key=lambda e: e.tokens) if oom else None
        contradictions = tuple(
            (o, r) for o in sorted(oom, key=lambda e: e.tokens) for r in ran if o.tokens <= r.tokens
        )[:20]
        proposed = None
        if below is not None:
            proposed = below.tokens
            if above is not None and above.tokens > below.tokens:
                proposed += min(int(safety_margin * (above.tokens - below.tokens)), above.tokens - below.tokens - 1)
        out.append(
            Fit(
                references=refs, ran=len(ran), oom=len(oom), bound_below=below, bound_above=above,
                contradictions=contradictions, proposed_budget=proposed,
            )
        )  # fmt: skip
    return out


def evidence_points(points: Sequence[MeasuredPoint]) -> list[Evidence]:
    return [
        Evidence(job_id=f"profile:{p.width}x{p.height}x{p.frames}", tokens=p.tokens, outcome=p.outcome, references=p.ref_images > 0)
        for p in points
    ]
