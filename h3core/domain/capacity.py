"""Measured capacity: one token budget per profile, with its evidence attached.

A `CapacityProfile` is data an operator edits: the hardware and kernel it was measured on (and
which executors it describes: `match`), the measured runs (ran or ran out of memory), quality
caps, the API's hard cap, and what to do where nothing was measured (requests with references).
The budget is derived from the measurements, never typed in: the largest run that fit, plus a
stated share of the gap to the smallest that did not. A budget with no out-of-memory run above
it is *unverified*: it says what ran, not where memory ends.

Admission itself (the profile judged together with what the executor can run) is
`h3core.domain.admission.AdmissionRules`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from h3core.domain.capabilities import Capabilities, GroupBudget
from h3core.domain.geometry import count_tokens
from h3core.domain.request import GenerationRequest, Keyframes, Mode, References

Outcome = Literal["ran", "oom"]


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MeasuredPoint(_Data):
    """One measured run: a request of this shape and frame count, and whether it ran or ran out of memory."""

    width: int
    height: int
    frames: int
    mode: Mode = "t2va"
    keyframes: int = Field(default=0, ge=0, le=2)
    ref_images: int = Field(default=0, ge=0)
    outcome: Outcome
    note: str = ""

    def request(self) -> GenerationRequest:
        """A stand-in request of this point's shape and frame count (`Shape.request`)."""
        return Shape.model_validate(self.model_dump(include=set(Shape.model_fields))).request(self.frames)

    @property
    def tokens(self) -> int:
        """The point's sequence length, as admission counts it."""
        return count_tokens(self.request()).total


class QualityCap(_Data):
    """The most frames admitted at a `width` x `height` canvas, whatever fits in memory (a refusal's reason: `quality`)."""

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
    """A profile's token budget and the points that bound it: the largest run that fit and, where
    one was measured, the smallest that ran out of memory."""

    tokens: int
    largest_ran: MeasuredPoint
    largest_ran_tokens: int
    smallest_oom: MeasuredPoint | None
    smallest_oom_tokens: int | None
    safety_margin: float

    @property
    def verified(self) -> bool:
        """Only an out-of-memory run bounds a budget from above; without one it is a floor."""
        return self.smallest_oom is not None


class ProfileMatch(_Data):
    """Which executors a profile describes: every field given must equal the executor's own
    (`device` is a case-insensitive part of its hardware name)."""

    executor: str | None = None
    topology: str | None = None
    device: str | None = None
    kernel: str | None = None
    model: str | None = None
    group_size: int | None = Field(default=None, ge=1)

    def matches(self, caps: Capabilities, size: int) -> bool:
        """Whether an executor with `caps`, in a group of `size` ranks, is one this match describes."""
        return (
            (self.executor is None or self.executor == caps.executor)
            and (self.model is None or self.model == caps.model)
            and (self.topology is None or self.topology == caps.topology)
            and (self.device is None or self.device.lower() in caps.hardware.lower())
            and (self.kernel is None or self.kernel == caps.kernel)
            and (self.group_size is None or self.group_size == size)
        )


class CapacityProfile(_Data):
    """A capacity profile, as its TOML file says (the module docstring): the hardware it was
    measured on, the executors it describes, the measured points its budget derives from, and its
    caps."""

    name: str
    hardware: str
    attention: str
    # The executors (hardware, kernel, group size) this profile was measured on; none: any.
    match: tuple[ProfileMatch, ...] = ()
    source: str = "measured"  # how the points were obtained ("measured", "probed with random weights")
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

    def describes(self, caps: Capabilities, size: int) -> bool:
        """Whether this profile describes a group of `size` ranks of the executor with `caps` (a
        profile with no `match` describes any)."""
        return not self.match or any(m.matches(caps, size) for m in self.match)

    def describes_run(self, executor: str, info: Mapping[str, str]) -> bool:
        """Whether a job that ran with this `Running` identity is evidence for this profile: it
        must have recorded where it ran, and that must be what the profile describes."""
        if "hardware" not in info:
            return False
        caps = Capabilities.of_run(executor, info)
        return any(self.describes(caps, g.size) for g in caps.groups)

    def group_budget(self, size: int) -> GroupBudget:
        """The budget of a group of `size` ranks by this profile, verified only where an out-of-memory run bounds it."""
        b = self.budget()
        note = "" if b.verified else ", unverified: no out-of-memory run measured"
        return GroupBudget(size=size, tokens=b.tokens, verified=b.verified, source=f"profile {self.name}{note}")

    def budget(self) -> Budget:
        """The budget the points without references imply: the largest run that fit, plus
        `safety_margin` of the gap to the smallest that ran out of memory (always below it)."""
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
        """The shape of `r`: its mode, canvas, and how many keyframes and references of each kind it has."""
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
        """Whether the shape carries any reference (image, video or audio)."""
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
            mode=self.mode,
            prompt="-",
            width=self.width,
            height=self.height,
            frames=frames,
            keyframes=keyframes,
            references=references,
        )


class Evidence(_Data):
    """What one job (or measured point) says about a budget: its token count, whether it ran or ran
    out of memory, and whether it had references."""

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
        contradictions = tuple((o, r) for o in sorted(oom, key=lambda e: e.tokens) for r in ran if o.tokens <= r.tokens)[:20]
        proposed = None
        if below is not None:
            proposed = below.tokens
            if above is not None and above.tokens > below.tokens:
                proposed += min(int(safety_margin * (above.tokens - below.tokens)), above.tokens - below.tokens - 1)
        out.append(
            Fit(
                references=refs,
                ran=len(ran),
                oom=len(oom),
                bound_below=below,
                bound_above=above,
                contradictions=contradictions,
                proposed_budget=proposed,
            )
        )
    return out


def evidence_points(points: Sequence[MeasuredPoint]) -> list[Evidence]:
    """A profile's measured points as `Evidence` (ids `profile:WxHxF`), to be fitted beside what jobs did."""
    return [
        Evidence(
            job_id=f"profile:{p.width}x{p.height}x{p.frames}", tokens=p.tokens, outcome=p.outcome, references=p.ref_images > 0
        )
        for p in points
    ]


def applicable(profiles: Sequence[CapacityProfile], caps: Capabilities) -> tuple[CapacityProfile | None, Capabilities]:
    """The profile describing this executor (its largest group), and its capabilities with each
    group's budget filled in from the first profile that describes that group. A budget the
    executor states itself (an operator's setting) is kept."""
    budgets = {}
    for group in caps.groups:
        found = next((p for p in profiles if p.describes(caps, group.size)), None)
        if found is not None:
            budgets[group.size] = found.group_budget(group.size)
    largest = max((g.size for g in caps.groups), default=1)
    primary = next((p for p in profiles if p.describes(caps, largest)), None)
    return primary, caps.with_budgets(budgets)
