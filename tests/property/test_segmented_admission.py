"""Admission of videos longer than one call (issue 42), for an executor that continues segments:
still monotone in frames, the ceilings still agree with the decisions, every segment of an
admitted plan is admitted as one call by the same rules, and the bound and ref2va are refused
naming why. An executor that does not continue segments admits exactly what it did."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from h3core.adapters.profiles import load_profile
from h3core.domain.admission import AdmissionRules, Admit
from h3core.domain.capabilities import Capabilities, FrameWindow
from h3core.domain.capacity import Shape, applicable

PROFILE = load_profile()
_, DEPLOYMENT = applicable([PROFILE], Capabilities(executor="comfyui", topology="raylight", model="minimax-h3"))
WINDOW = FrameWindow(max_seconds=15.0, source="model facts of minimax-h3")
ONE_CALL = AdmissionRules(DEPLOYMENT.model_copy(update={"window": WINDOW}), PROFILE)
LONG = AdmissionRules(DEPLOYMENT.model_copy(update={"window": WINDOW, "continues_segments": True}), PROFILE, max_video_seconds=60)

sides = st.integers(4, 48).map(lambda n: n * 32)
shapes = st.one_of(
    st.builds(Shape, mode=st.just("t2va"), width=sides, height=sides),
    st.builds(Shape, mode=st.just("fl2va"), width=sides, height=sides, keyframes=st.integers(1, 2)),
    st.builds(Shape, mode=st.just("ref2va"), width=sides, height=sides, ref_images=st.integers(1, 3)),
)
lengths = st.integers(1, 60 * 24 + 50)


@given(shapes, lengths)
def test_if_n_frames_are_refused_so_are_n_plus_one(shape, n):
    if not LONG.decide(shape.request(n)).admitted:
        assert not LONG.decide(shape.request(n + 1)).admitted


@given(shapes)
def test_ceilings_agree_with_the_decisions(shape):
    row = LONG.ceiling(shape)
    if row.max_frames:
        assert LONG.decide(shape.request(row.max_frames)).admitted
    past = LONG.decide(shape.request(row.max_frames + 1))
    assert not past.admitted and past.ceiling.max_frames == row.max_frames and past.ceiling.reason == row.reason


@given(shapes, lengths)
def test_each_segment_of_an_admitted_plan_is_admitted_as_one_call_and_they_add_up(shape, n):
    request = shape.request(n)
    decision = LONG.decide(request)
    if not isinstance(decision, Admit) or decision.plan is None:
        return
    plan = decision.plan
    assert plan.frames == n == decision.frames and sum(s.keep for s in plan.segments) == n
    parts = [LONG.segment_request(request, plan, s) for s in plan.segments]
    calls = [ONE_CALL.decide(p) for p in parts]
    assert all(isinstance(c, Admit) and c.plan is None for c in calls), calls
    assert decision.tokens == max(c.tokens for c in calls if isinstance(c, Admit))
    assert [p.mode for p in parts[1:]] == ["fl2va"] * (len(parts) - 1)  # each continues the one before


@given(shapes, lengths)
def test_one_call_admits_the_same_with_segments_or_without_and_segments_only_add(shape, n):
    request = shape.request(n)
    one, long = ONE_CALL.decide(request), LONG.decide(request)
    if one.admitted:  # what one call admits is still one call
        assert long.admitted and long.plan is None
    elif long.admitted:  # what segments add: past one call, within the bound, never ref2va
        assert long.plan is not None and n <= 60 * 24 and shape.mode != "ref2va"


def test_a_long_t2va_video_is_planned_up_to_the_bound_and_refused_past_it_naming_it():
    shape = Shape(width=832, height=480)
    admitted = LONG.decide(shape.request(60 * 24))
    assert isinstance(admitted, Admit) and admitted.plan is not None and len(admitted.plan.segments) == 5
    refused = LONG.decide(shape.request(60 * 24 + 1))
    assert not refused.admitted and refused.reason == "api_limit" and "at most 60 s (1440 frames)" in refused.detail
    ref = LONG.decide(Shape(mode="ref2va", width=832, height=480, ref_images=1).request(20 * 24))
    assert not ref.admitted and ref.reason == "model_window" and "not made as segments (its references" in ref.detail
    alone = ONE_CALL.decide(shape.request(20 * 24))  # without continuing, as before, saying why
    assert not alone.admitted and alone.reason == "model_window" and "does not make a longer video as segments" in alone.detail


@given(shapes, lengths)
def test_a_claim_judges_the_stored_plan_each_segment_as_one_call_on_the_claiming_node(shape, n):
    """A node admits a stored plan iff it continues segments and runs each of its calls: the plan is
    never made again where it is claimed (the claiming node's window may be another's)."""
    request = shape.request(n)
    decision = LONG.decide(request)
    if not isinstance(decision, Admit) or decision.plan is None:
        return
    plan = decision.plan
    assert LONG.why_not(request, decision.tokens, plan) is None
    refusal = ONE_CALL.why_not(request, decision.tokens, plan)
    assert refusal is not None and "does not continue a video as segments" in refusal
    longest = max(s.frames for s in plan.segments)
    narrow = FrameWindow(max_seconds=(longest - 1) / 24, source="a narrower model")
    smaller = AdmissionRules(DEPLOYMENT.model_copy(update={"window": narrow, "continues_segments": True}), PROFILE)
    why = smaller.why_not(request, decision.tokens, plan)
    assert why is not None and why.startswith("model_window: segment "), why
