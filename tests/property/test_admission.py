"""Admission by measured capacity: monotone, consistent with /v1/ceilings, true to the evidence."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from h3core.adapters.profiles import ProfileError, load_profile
from h3core.domain.admission import AdmissionRules
from h3core.domain.capabilities import Capabilities
from h3core.domain.capacity import CapacityProfile, Shape, applicable
from h3core.domain.request import GenerationRequest

PROFILE = load_profile()
# The deployment the built-in profile describes: ComfyUI + Raylight, no clip window of its own.
PROFILE_SAYS, DEPLOYMENT = applicable([PROFILE], Capabilities(executor="comfyui", topology="raylight", model="minimax-h3"))
POLICY = AdmissionRules(DEPLOYMENT, PROFILE_SAYS)


def test_the_profile_describes_the_deployment_and_gives_its_budget():
    assert PROFILE_SAYS is PROFILE
    assert [(g.size, g.tokens, g.verified) for g in DEPLOYMENT.groups] == [(1, 133_236, True)]


sides = st.integers(1, 64).map(lambda n: n * 32)
shapes = st.one_of(
    st.builds(Shape, mode=st.just("t2va"), width=sides, height=sides),
    st.builds(Shape, mode=st.just("fl2va"), width=sides, height=sides, keyframes=st.integers(1, 2)),
    st.builds(Shape, mode=st.just("ref2va"), width=sides, height=sides, ref_images=st.integers(1, 9)),
)
listed = st.sampled_from([row.shape for row in POLICY.ceilings()])


def admitted(shape: Shape, frames: int) -> bool:
    return POLICY.decide(shape.request(frames)).admitted


@given(st.one_of(shapes, listed), st.integers(1, 1300))
def test_if_n_frames_are_refused_so_are_n_plus_one(shape, n):
    if not admitted(shape, n):
        assert not admitted(shape, n + 1)


@given(shapes, st.integers(0, 20), st.integers(0, 20), st.integers(1, 1300))
def test_a_larger_canvas_is_refused_where_a_smaller_one_is(shape, dw, dh, n):
    bigger = shape.model_copy(update={"width": shape.width + 32 * dw, "height": shape.height + 32 * dh})
    assume(bigger.width <= 4096 and bigger.height <= 4096)
    # Quality caps are per resolution (docs/design.md §5), and equal to the API cap in the default
    # profile, so they cannot make a larger canvas look more admissible.
    if not admitted(shape, n):
        assert not admitted(bigger, n)


@given(listed)
def test_ceilings_agree_with_submission_decisions(shape):
    row = POLICY.ceiling(shape)
    if row.max_frames > 0:
        assert admitted(shape, row.max_frames)
    refusal = POLICY.decide(shape.request(row.max_frames + 1))
    assert not refusal.admitted
    assert refusal.ceiling.max_frames == row.max_frames and refusal.ceiling.reason == row.reason
    assert str(row.max_frames) in refusal.detail


def test_every_measured_run_is_admitted_and_every_oom_refused():
    for p in PROFILE.points + PROFILE.references.points:
        decision = POLICY.decide(p.request())
        if p.outcome == "oom":
            assert not decision.admitted and decision.ceiling.reason == ("unverified" if p.ref_images else "vram"), p
            assert decision.ceiling.max_frames < p.frames
        elif p.frames <= PROFILE.api_max_frames:
            assert decision.admitted, (p, decision)
        else:  # 448x256x3000 ran, but is past the quality and API caps: refused for those only
            assert not decision.admitted and decision.ceiling.reason != "vram", (p, decision)


def test_the_default_ceilings_table():
    table = {(r.shape.width, r.shape.height): (r.max_frames, r.reason) for r in POLICY.ceilings() if r.shape.mode == "t2va"}
    assert table == {
        (832, 480): (1127, "vram"),
        (1024, 576): (753, "vram"),
        (1344, 768): (430, "vram"),
        (448, 256): (1200, "quality"),
    }
    assert PROFILE.budget().tokens == 133_236


def test_reference_limits_say_they_are_unverified():
    row = POLICY.ceiling(Shape(mode="ref2va", width=1344, height=768, ref_images=3))
    assert row.verified is False
    refusal = POLICY.decide(Shape(mode="ref2va", width=1344, height=768, ref_images=3).request(362))
    assert not refusal.admitted and refusal.ceiling.verified is False and "unverified" in refusal.detail


def test_a_rejecting_reference_policy_refuses_every_reference_request():
    profile = PROFILE.model_copy(update={"references": PROFILE.references.model_copy(update={"policy": "reject"})})
    policy = AdmissionRules(DEPLOYMENT, profile)
    decision = policy.decide(GenerationRequest(prompt="p", mode="ref2va", references={"images": ["a"]}, frames=5))
    assert not decision.admitted and "no measured memory budget" in decision.detail
    assert decision.ceiling.max_frames == 0 and decision.ceiling.verified is False and decision.reason == "unverified"


@given(st.integers(0, 99).map(lambda m: m / 100))
def test_the_budget_stays_between_the_evidence_whatever_the_margin(margin):
    budget = PROFILE.model_copy(update={"safety_margin": margin}).budget()
    assert budget.largest_ran_tokens <= budget.tokens < budget.smallest_oom_tokens


def test_a_profile_whose_points_contradict_one_budget_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    text = (
        'name="x"\nhardware="h"\nattention="a"\napi_max_frames=1200\nresolutions=[[832,480]]\n'
        '[[points]]\nwidth=832\nheight=480\nframes=1125\noutcome="ran"\n'
        '[[points]]\nwidth=832\nheight=480\nframes=500\noutcome="oom"\n'
    )
    bad.write_text(text)
    with pytest.raises(ProfileError, match="contradict one budget"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="api_max_frames"):
        (tmp_path / "b2.toml").write_text(text.replace("api_max_frames=1200\n", ""))
        load_profile(tmp_path / "b2.toml")


def test_profiles_are_data():
    assert isinstance(PROFILE, CapacityProfile) and PROFILE.name == "4x2080ti-sage-fp16"
