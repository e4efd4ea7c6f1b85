"""Admission: may this request become a job? A pure judgement over the request alone.

A refused request never becomes a job: the caller gets the reason and the limit instead.
`AdmissionRules` is the one judgement of the service: the capacity profile (what fits in memory on
measured hardware) and the executor's capabilities (its modes, its model's clip window, its
groups' budgets, its kernel's limit, its upload slots) together. `/v1/ceilings` is computed by
the same code: `ceiling(shape)` is, by construction, the largest frame count `decide` admits for
that shape, and a refusal carries the same ceiling with the reason that binds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from h3core.domain.capabilities import Capabilities, GroupBudget
from h3core.domain.capacity import CapacityProfile, Shape
from h3core.domain.events import Admitted, Body, Planned
from h3core.domain.geometry import CLIP, FPS, Media, count_tokens, snap_frames, text_rows_bound
from h3core.domain.request import MAX_SEED, GenerationRequest, Keyframes
from h3core.domain.segments import Segment, SegmentPlan, plan_segments

CeilingReason = Literal["vram", "unverified", "quality", "model_window", "mode_unavailable", "api_limit"]

# The API's hard cap where no profile sets one (docs/design.md §5: the old API's cap, 50 s at 24 fps).
DEFAULT_API_MAX_FRAMES = 1200
# The longest video made as segments where the operator sets no bound (H3_MAX_VIDEO_SECONDS).
DEFAULT_MAX_VIDEO_SECONDS = 60.0
# What a segment after the first names as its first keyframe when admission judges it: the frame
# the segment before makes, an upload only once that one is made.
CONTINUED_FRAME = "previous-segment"
# The canvases the console offers (docs/design.md §5), listed where no profile names its own.
DEFAULT_RESOLUTIONS: tuple[tuple[int, int], ...] = ((832, 480), (1024, 576), (1344, 768), (448, 256))


class Ceiling(BaseModel):
    """The frame counts admitted for a request's shape, and what sets the largest."""

    model_config = ConfigDict(frozen=True)

    max_frames: int
    reason: CeilingReason
    verified: bool = True  # False where no measurement backs the limit, or that what it admits fits in memory
    min_frames: int = 1


class Admit(BaseModel):
    """An admitted request: it may become a job (with its token count and the frames it will make,
    where the policy knows them)."""

    model_config = ConfigDict(frozen=True)

    admitted: Literal[True] = True
    tokens: int | None = None  # the request's sequence length, when the policy computed it (a plan's: its longest segment's)
    frames: int | None = None  # the frames the executor will make of it, when the policy knows (else the model's count)
    plan: SegmentPlan | None = None  # a video longer than the window, as the segments that make it


class Refuse(BaseModel):
    """A refused request: it never becomes a job. `detail` says why in words, `reason` names the
    limit it broke, and `ceiling` what is admitted for its shape."""

    model_config = ConfigDict(frozen=True)

    admitted: Literal[False] = False
    detail: str
    ceiling: Ceiling | None = None
    reason: CeilingReason | None = None  # the limit this request broke (the ceiling's may differ)
    field: str = "frames"  # the request's field the limit bounds (a 422's `errors` names it)


Decision = Admit | Refuse


def admission_events(admit: Admit) -> list[Body]:
    """What an admission writes: `admitted`, and the plan of a video made as segments (`planned`)."""
    return [Admitted(tokens=admit.tokens), *([Planned(plan=admit.plan)] if admit.plan is not None else [])]


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides a request. Must be pure and deterministic: the same request, the same answer."""

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        """`media`: what is known of the request's uploads (dimensions, duration), by id."""
        ...


class AdmitAll:
    """Admits every valid request."""

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        """Always `Admit()`, with no token count."""
        return Admit()


class CeilingRow(BaseModel):
    """One row of `/v1/ceilings`: the frame counts admitted for a shape, the limit that sets the
    largest, and the tokens and budget behind it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: Shape
    min_frames: int
    max_frames: int
    reason: CeilingReason
    verified: bool
    tokens_at_max: int | None  # the sequence length of a request at the ceiling
    budget_tokens: int | None  # the largest budget of a group that can take this shape
    why: str  # the binding limit in words


class QueueFilter(BaseModel):
    """A necessary condition for a queued job to run on a node, cheap enough for a store to apply
    to its stored states (a claim's pre-filter): a job it drops, the node's `AdmissionRules` would refuse.
    The exact judgement stays `AdmissionRules.why_not`; this only keeps unrunnable rows out of the read."""

    model_config = ConfigDict(frozen=True)

    min_frames: int = 1
    max_frames: int | None = None
    max_tokens: int | None = None  # a job whose count was not stored passes

    def passes(self, frames: int, tokens: int | None) -> bool:
        """Whether a job of `frames` requested frames and `tokens` (None: not stored, it passes) may
        run here; a job that fails it, the node's `AdmissionRules` would refuse."""
        return (
            self.min_frames <= frames
            and (self.max_frames is None or frames <= self.max_frames)
            and (self.max_tokens is None or tokens is None or tokens <= self.max_tokens)
        )


class _Limit(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: CeilingReason
    why: str
    field: str = "frames"
    verified: bool = True


class RulesStatement(BaseModel):
    """What an `AdmissionRules` judges by, whole, as a node states it to the others that admit for
    it (`h3core.adapters.store.nodes.NodeInfo.rules`): its capabilities, each group's budget filled
    in from the capacity profiles that describe it, and the profile that describes the executor
    (quality caps, the API's limit, its canvases, the references policy); None where none does."""

    model_config = ConfigDict(frozen=True)

    capabilities: Capabilities
    profile: CapacityProfile | None = None
    max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS  # the longest video made as segments


class AdmissionRules:
    """What is admitted is what the executor will run. Pure: a function of its inputs."""

    def __init__(
        self,
        capabilities: Capabilities,
        profile: CapacityProfile | None = None,
        *,
        max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS,
    ) -> None:
        """`max_video_seconds`: the longest video an executor that continues segments is asked for."""
        self.caps = capabilities
        self.profile = profile
        self.api_max_frames = profile.api_max_frames if profile is not None else DEFAULT_API_MAX_FRAMES
        self.resolutions = profile.resolutions if profile is not None else DEFAULT_RESOLUTIONS
        self.max_video_seconds = max_video_seconds
        self._one_calls: dict[tuple[Shape, str], int] = {}  # `_one_call`'s answers, by shape and quality

    def statement(self) -> RulesStatement:
        """What these rules judge by, for another process to judge as they do (`of`)."""
        return RulesStatement(capabilities=self.caps, profile=self.profile, max_video_seconds=self.max_video_seconds)

    @classmethod
    def of(cls, statement: RulesStatement) -> AdmissionRules:
        """The rules a `statement` describes: they decide every request as the stating ones do."""
        return cls(statement.capabilities, statement.profile, max_video_seconds=statement.max_video_seconds)

    # -- long videos ---------------------------------------------------------------------------

    def plan(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> SegmentPlan | None:
        """The segments of a request longer than one call of this executor admits, where it continues
        segments and the request is within the bound on a video's length; None: one call (or
        refused as one). Each segment is as long as one call of its own shape admits at most (the
        first without the request's last keyframe, the rest fl2va from the frame before, the last
        with the request's last keyframe), so each is admitted by construction, and whether a long
        request is admitted does not depend on its length below the bound: admission stays
        monotone in frames, as the ceilings' walk needs."""
        media = media or {}
        window = self.caps.window
        if window is None or window.max_frames is None or not self.caps.continues_segments or request.mode == "ref2va":
            return None
        if request.frames > self.max_video_frames or request.frames <= self._one_call(request, media):
            return None
        shapes = [self._first_part(request), self._continued_part(request, with_last=False)]
        if request.keyframes is not None and request.keyframes.last is not None:
            shapes.append(self._continued_part(request, with_last=True))
        most = min([window.max_frames, *(self._one_call(s, media) for s in shapes)])
        return plan_segments(request.frames, most) if most >= 2 else None

    def _one_call(self, like: GenerationRequest, media: Mapping[str, Media]) -> int:
        """The most frames one call admits for requests like `like` (0: none), cached per shape."""
        key = (Shape.of(like), like.quality) if not media else None
        if key is not None and key in self._one_calls:
            return self._one_calls[key]
        best = self._walk(like, media)[0]
        if key is not None:
            self._one_calls[key] = best
        return best

    @staticmethod
    def _first_part(request: GenerationRequest) -> GenerationRequest:
        """The first segment's shape: the request without its last keyframe (that one ends the video)."""
        first = request.keyframes.first if request.keyframes is not None else None
        if first is None:
            return request.model_copy(update={"mode": "t2va", "keyframes": None})
        return request.model_copy(update={"mode": "fl2va", "keyframes": Keyframes.model_construct(first=first, last=None)})

    @staticmethod
    def _continued_part(request: GenerationRequest, *, with_last: bool) -> GenerationRequest:
        """A later segment's shape: fl2va from the frame before (and the request's last keyframe on the last)."""
        last = request.keyframes.last if with_last and request.keyframes is not None else None
        keyframes = Keyframes.model_construct(first=CONTINUED_FRAME, last=last)
        return request.model_copy(update={"mode": "fl2va", "keyframes": keyframes})

    @property
    def max_video_frames(self) -> int:
        """The most frames a video made as segments has (the bound, in whole frames)."""
        return int(self.max_video_seconds * FPS + 1e-9)

    @staticmethod
    def segment_request(
        request: GenerationRequest, plan: SegmentPlan, segment: Segment, *, continued_from: str = CONTINUED_FRAME
    ) -> GenerationRequest:
        """What the model is asked for one segment: its frames, fl2va from the frame the segment
        before kept last (`continued_from`: the upload holding it; `CONTINUED_FRAME` until that one
        is made), the request's own first keyframe on the first segment and its last on the last;
        t2va where neither applies. Each segment draws its own noise (the seed plus its index): the
        same noise again would repeat the first segment's motion."""
        keyframes = request.keyframes
        first = continued_from if segment.index else (keyframes.first if keyframes is not None else None)
        last = keyframes.last if keyframes is not None and segment.index == len(plan.segments) - 1 else None
        update: dict[str, object] = {"frames": segment.frames, "seed": (request.seed + segment.index) % (MAX_SEED + 1)}
        if first is None and last is None:
            return request.model_copy(update={**update, "mode": "t2va", "keyframes": None})
        continued = Keyframes.model_construct(first=first, last=last)
        return request.model_copy(update={**update, "mode": "fl2va", "keyframes": continued})

    # -- the one judgement -------------------------------------------------------------------

    def _judge(
        self, request: GenerationRequest, media: Mapping[str, Media], tokens: int, *, segments: bool = True
    ) -> _Limit | None:
        """None if `request` is admissible, else the limit it breaks; `segments`: as segments where
        one call cannot make it (False: as one call, what `plan` measures segments by)."""
        caps, shape = self.caps, Shape.of(request)
        mode = caps.mode(request.mode)
        if not mode.served:
            return _Limit(
                reason="mode_unavailable",
                why=f"mode {request.mode} is not served by {caps.executor}: {mode.reason or 'not offered'}",
                field="mode",
            )
        if request.quality not in caps.qualities:
            return _Limit(
                reason="mode_unavailable",
                why=f"quality {request.quality} is not run by {caps.executor}: it runs {', '.join(caps.qualities)}",
                field="quality",
            )
        for name, ids in request.uploads().items():
            most, count = caps.media.get(name), len(ids)
            if most is not None and count > most:
                return _Limit(
                    reason="mode_unavailable",
                    why=f"{name}: {caps.executor} takes at most {most} here, the request has {count}",
                    field=name,
                )
        refs = request.references
        if refs is not None and caps.max_references is not None and refs.count() > caps.max_references:
            return _Limit(
                reason="mode_unavailable",
                why=f"references: at most {caps.max_references} in all, the request has {refs.count()}",
                field="references",
            )
        if refs is not None and not caps.audio_alone and refs.audios and not (refs.images or refs.videos):
            return _Limit(
                reason="mode_unavailable",
                why="references.audios: an audio reference needs an image or video reference beside it",
                field="references.audios",
            )
        if segments and self.plan(request, media) is not None:
            return None  # each segment admitted by construction
        window = caps.window
        if segments and caps.continues_segments and request.mode != "ref2va" and request.frames > self.max_video_frames:
            return _Limit(
                reason="api_limit",
                why=f"a video made as segments is at most {self.max_video_seconds:g} s ({self.max_video_frames} frames)",
            )
        if window is not None and not window.admits(request.frames):
            snapped = snap_frames(request.frames)
            why = f"{request.frames} frames snap to {snapped} ({snapped / FPS:.2f} s), outside the {window.describe()} window"
            if segments and window.max_frames is not None and request.frames > window.max_frames:
                why += f"; {self._no_segments(request)}"
            return _Limit(reason="model_window", why=why)
        cap = self._quality_cap(shape)
        if cap is not None and request.frames > cap:
            return _Limit(reason="quality", why=f"the quality cap at {shape.width}x{shape.height} is {cap} frames")
        if request.frames > self.api_max_frames:
            return _Limit(reason="api_limit", why=f"the API limit is {self.api_max_frames} frames")
        # The kernel bounds the whole packed sequence, the prompt's rows included (budgets count
        # video and audio only, as they were measured).
        if caps.max_tokens is not None and (sequence := tokens + text_rows_bound(request)) > caps.max_tokens:
            kernel = f" ({caps.max_tokens_reason})" if caps.max_tokens_reason else ""
            return _Limit(
                reason="vram",
                why=f"its sequence may reach {sequence} tokens with the prompt's, "
                f"over the attention kernel's {caps.max_tokens}-token limit{kernel}",
            )
        budget = self._budget(shape)
        if budget is not None and (budget.tokens is not None and tokens > budget.tokens):
            reason: CeilingReason = "vram" if budget.verified else "unverified"
            return _Limit(
                reason=reason,
                verified=budget.verified,
                why=f"it needs {tokens} tokens, over the {budget.tokens}-token budget ({budget.source})",
            )
        if budget is None:
            assert self.profile is not None
            policy = self.profile.references
            return _Limit(
                reason="unverified",
                verified=False,
                why=f"requests with references have no measured memory budget on {self.profile.name}, and this profile "
                f"rejects them ({policy.note or 'references.policy = reject'})",
                field="references",
            )
        return None

    def _no_segments(self, request: GenerationRequest) -> str:
        """Why a request past one call is not made as segments here."""
        if not self.caps.continues_segments:
            return f"{self.caps.executor} does not make a longer video as segments"
        if request.mode == "ref2va":
            return "a ref2va video is not made as segments (its references condition one call)"
        return "its segments do not fit one call each here"

    def _quality_cap(self, shape: Shape) -> int | None:
        if self.profile is None:
            return None
        caps = [c.max_frames for c in self.profile.quality_caps if (c.width, c.height) == (shape.width, shape.height)]
        return min(caps) if caps else None

    def _largest_group(self) -> GroupBudget:
        return max(self.caps.groups, key=lambda g: (g.tokens is None, g.tokens or 0))  # no budget at all is the largest

    def _budget(self, shape: Shape) -> GroupBudget | None:
        """The budget a request of this shape is held to: the largest group's (a job may go to
        any group it fits). None: such requests are refused outright (references, where the
        profile rejects them)."""
        best = self._largest_group()
        if shape.has_references and self.profile is not None:
            refs = self.profile.references
            if refs.policy == "reject":
                return None
            tokens = refs.budget_tokens if best.tokens is None else min(refs.budget_tokens or 0, best.tokens)
            return GroupBudget(
                size=best.size, tokens=tokens, verified=False, source=f"references budget of {self.profile.name}, unverified"
            )
        return best

    # -- what callers see --------------------------------------------------------------------

    def why_not(self, request: GenerationRequest, tokens: int | None = None, plan: SegmentPlan | None = None) -> str | None:
        """Can a job of `request` run here? None if so, else the limit it breaks. `tokens`: the
        count its admission stored (None: counted here, without what is known of its uploads).
        `plan`: the segments its admission planned: each is judged as the one call it is (this
        node's window or budget may differ from the admitting node's: a plan is never made again)."""
        if plan is not None:
            if not self.caps.continues_segments:
                return f"mode_unavailable: {self.caps.executor} does not continue a video as segments"
            for segment in plan.segments:
                part = self.segment_request(request, plan, segment)
                limit = self._judge(part, {}, count_tokens(part, {}).total, segments=False)
                if limit is not None:
                    n = len(plan.segments)
                    return f"{limit.reason}: segment {segment.index + 1} of {n} ({segment.frames} frames): {limit.why}"
            return None
        if tokens is None:
            tokens = count_tokens(request, {}).total
        limit = self._judge(request, {}, tokens)
        return None if limit is None else f"{limit.reason}: {limit.why}"

    def queue_filter(self) -> QueueFilter:
        """What every job `why_not` admits satisfies: its requested frames inside the window's
        range and the API cap (`FrameWindow.admits(f)` iff `min_frames <= f <= max_frames`), its
        tokens within the kernel's limit and the largest group's budget (what binds any shape)."""
        window = self.caps.window
        top = self.api_max_frames if window is None or window.max_frames is None else min(self.api_max_frames, window.max_frames)
        if self.caps.continues_segments and window is not None and window.max_frames is not None:
            top = max(top, self.max_video_frames)  # a long video, as segments (each call's tokens within the budget)
        bounds = [t for t in (self.caps.max_tokens, self._largest_group().tokens) if t is not None]
        return QueueFilter(
            min_frames=window.min_frames if window is not None else 1, max_frames=top, max_tokens=min(bounds) if bounds else None
        )

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        """`Admit` with the request's token count and the frames it will make, or `Refuse` with the
        limit it breaks and the ceiling of its shape. `media`: what is known of its uploads, by
        id."""
        media = media or {}
        tokens = count_tokens(request, media).total
        limit = self._judge(request, media, tokens)
        if limit is None:
            plan = self.plan(request, media)
            if plan is not None:  # its largest call's count: what a node's budget must hold
                longest = max(count_tokens(self.segment_request(request, plan, s), media).total for s in plan.segments)
                return Admit(tokens=longest, frames=request.frames, plan=plan)
            return Admit(tokens=tokens, frames=self.caps.frames_made(request))
        row = self.ceiling(request, media)
        ceiling = Ceiling(max_frames=row.max_frames, reason=row.reason, verified=row.verified, min_frames=row.min_frames)
        shape = Shape.of(request)
        where = f"{shape.width}x{shape.height} {shape.mode}"
        if row.max_frames == 0:
            admitted = "no frame count is admitted for this shape"
        else:
            admitted = f"{row.min_frames}-{row.max_frames} frames are admitted ({row.reason})"
        detail = f"{request.frames} frames at {where} refused ({limit.reason}): {limit.why}; {admitted}"
        return Refuse(detail=detail, ceiling=ceiling, reason=limit.reason, field=limit.field)

    def _walk(self, template: GenerationRequest, media: Mapping[str, Media]) -> tuple[int, _Limit]:
        """The most frames one call admits for requests like `template` (0: none) and the limit
        just past it."""
        shape = Shape.of(template)

        def judge(frames: int) -> _Limit | None:
            request = template.model_copy(update={"frames": frames})
            return self._judge(request, media, count_tokens(request, media).total, segments=False)

        window = self.caps.window
        low = window.min_frames if window is not None else 1
        top = self.api_max_frames
        for bound in (self._quality_cap(shape), window.max_frames if window is not None else None):
            if bound is not None:
                top = min(top, bound)
        # Tokens and the window only change at snapped counts (17n + 5); caps in frames cut
        # anywhere. From the window's start admission is monotone in frames: walk the snapped
        # counts (and the top itself) upwards until the first refusal.
        best = 0
        refusal = judge(low)
        if refusal is None:
            best = low
            for frames in [*range(snap_frames(low), top, CLIP), top, top + 1]:
                if frames <= best:
                    continue
                refusal = judge(frames)
                if refusal is not None:
                    break
                best = frames
        assert refusal is not None  # top + 1 breaks whatever set top
        return best, refusal

    def ceiling(self, like: Shape | GenerationRequest, media: Mapping[str, Media] | None = None) -> CeilingRow:
        """The frame counts admitted for requests like `like` (all but its length)."""
        media = media or {}
        template = like.request(1) if isinstance(like, Shape) else like
        shape = Shape.of(template)

        best, refusal = self._walk(template, media)
        window = self.caps.window
        low = window.min_frames if window is not None else 1
        long = template.model_copy(update={"frames": self.max_video_frames})
        plan = self.plan(long, media) if best and self.max_video_frames > best else None
        if plan is not None:  # past one call, segments up to the bound
            best = self.max_video_frames
            past = self._judge(long.model_copy(update={"frames": best + 1}), media, 0)
            assert past is not None  # the bound
            refusal = past
            parts = [self.segment_request(long, plan, s) for s in plan.segments]
            tokens: int | None = max(count_tokens(p, media).total for p in parts)
        else:
            tokens = count_tokens(template.model_copy(update={"frames": best}), media).total if best else None
        budget = self._budget(shape)
        # Verified: a measurement backs the limit that binds, and that what it admits fits in memory.
        verified = refusal.verified and budget is not None and budget.verified
        return CeilingRow(
            shape=shape,
            min_frames=low if best else 0,
            max_frames=best,
            reason=refusal.reason,
            verified=verified,
            tokens_at_max=tokens,
            budget_tokens=budget.tokens if budget is not None else None,
            why=refusal.why,
        )

    def ceilings(self, resolutions: Sequence[tuple[int, int]] | None = None) -> list[CeilingRow]:
        """The table the console reads: every offered resolution, for each mode."""
        rows = []
        for w, h in resolutions or self.resolutions:
            for shape in (
                Shape(mode="t2va", width=w, height=h),
                Shape(mode="fl2va", width=w, height=h, keyframes=1),
                Shape(mode="fl2va", width=w, height=h, keyframes=2),
                Shape(mode="ref2va", width=w, height=h, ref_images=1),
            ):
                rows.append(self.ceiling(shape))
        return rows
