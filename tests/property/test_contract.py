"""The admission contract (profile x executor capabilities): each limit an executor states is
applied at submission, in both directions, and /v1/ceilings says exactly what submission does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from h3core.adapters.profiles import load_profile
from h3core.domain.admission import AdmissionRules
from h3core.domain.capabilities import Capabilities, FrameWindow, GroupBudget, ModeReadiness
from h3core.domain.capacity import Shape, applicable
from h3core.domain.fleet import ceilings_across, decide_across
from h3core.domain.geometry import FPS, count_tokens, snap_frames, text_rows_bound
from h3core.domain.request import GenerationRequest

windows = st.builds(
    FrameWindow,
    min_seconds=st.sampled_from([0.0, 1.0, 5.0, 7.5]),
    max_seconds=st.one_of(st.none(), st.sampled_from([5.0, 10.0, 15.0, 30.0, 50.0])),
    least=st.sampled_from([1, 5, 30]),
    most=st.one_of(st.none(), st.sampled_from([100, 3600])),
)
sides = st.integers(1, 48).map(lambda n: n * 32)
shapes = st.one_of(
    st.builds(Shape, mode=st.just("t2va"), width=sides, height=sides),
    st.builds(Shape, mode=st.just("fl2va"), width=sides, height=sides, keyframes=st.integers(1, 2)),
    st.builds(Shape, mode=st.just("ref2va"), width=sides, height=sides, ref_images=st.integers(1, 4)),
)
budgets = st.one_of(st.none(), st.integers(2_000, 200_000))
capabilities = st.builds(
    Capabilities,
    executor=st.just("x"),
    window=st.one_of(st.none(), windows),
    groups=st.lists(
        st.builds(GroupBudget, size=st.integers(1, 4), tokens=budgets, verified=st.booleans()), min_size=1, max_size=3
    ).map(tuple),
    max_tokens=st.one_of(st.none(), st.integers(2_000, 200_000)),
    modes=st.lists(st.sampled_from(["t2va", "fl2va", "ref2va"]), unique=True).map(
        lambda off: tuple(
            ModeReadiness(mode=m, served=m not in off, ready=m not in off, reason="off" if m in off else None)
            for m in ("t2va", "fl2va", "ref2va")
        )
    ),
)


@given(windows, st.integers(1, 2000))
def test_a_window_admits_exactly_the_frames_between_its_ends(window, frames):
    seconds = snap_frames(frames) / FPS
    inside = window.min_seconds <= seconds and (window.max_seconds is None or seconds <= window.max_seconds)
    inside = inside and window.least <= frames and (window.most is None or frames <= window.most)
    assert window.admits(frames) == inside
    top = window.max_frames
    assert inside == (window.min_frames <= frames and (top is None or frames <= top))


@given(capabilities, shapes, st.integers(1, 1400))
def test_every_stated_limit_is_applied_in_both_directions(caps, shape, frames):
    request = shape.request(frames)
    decision = AdmissionRules(caps).decide(request)
    tokens = count_tokens(request).total
    best = max(caps.groups, key=lambda g: (g.tokens is None, g.tokens or 0))
    sequence = tokens + text_rows_bound(request)
    within = (
        caps.mode(shape.mode).served
        and (caps.window is None or caps.window.admits(frames))
        and frames <= 1200
        and (caps.max_tokens is None or sequence <= caps.max_tokens)
        and (best.tokens is None or tokens <= best.tokens)
    )
    assert decision.admitted == within, decision
    if not within:
        assert decision.reason in ("mode_unavailable", "model_window", "api_limit", "vram", "unverified")
        if not caps.mode(shape.mode).served:
            assert decision.reason == "mode_unavailable" and decision.ceiling.max_frames == 0


@given(capabilities, shapes)
def test_the_ceiling_is_what_submission_admits(caps, shape):
    contract = AdmissionRules(caps)
    row = contract.ceiling(shape)
    if row.max_frames:
        assert contract.decide(shape.request(row.min_frames)).admitted
        assert contract.decide(shape.request(row.max_frames)).admitted
        if row.min_frames > 1:
            assert not contract.decide(shape.request(row.min_frames - 1)).admitted
    refused = contract.decide(shape.request(row.max_frames + 1))
    assert not refused.admitted
    assert (refused.ceiling.max_frames, refused.ceiling.reason) == (row.max_frames, row.reason)


@given(capabilities, shapes, st.integers(1, 1300))
def test_above_the_window_start_a_refused_length_stays_refused(caps, shape, n):
    contract = AdmissionRules(caps)
    low = caps.window.min_frames if caps.window is not None else 1
    if n >= low and not contract.decide(shape.request(n)).admitted:
        assert not contract.decide(shape.request(n + 1)).admitted


def test_a_mode_that_is_served_but_not_ready_is_admitted_to_wait():
    caps = Capabilities(executor="x", modes=(ModeReadiness(mode="t2va", ready=False, reason="server down"),))
    contract = AdmissionRules(caps)
    assert contract.decide(GenerationRequest(prompt="p", frames=48)).admitted
    refused = contract.decide(GenerationRequest(prompt="p", mode="fl2va", keyframes={"first": "k"}, frames=48))
    assert refused.reason == "mode_unavailable" and "not served" in refused.detail
    assert caps.waiting_reason("t2va") == "x not ready for t2va: server down"


def test_upload_slots_and_reference_rules_are_the_executors():
    caps = Capabilities(executor="x", media={"references.videos": 0, "keyframes.last": 0}, max_references=3, audio_alone=False)
    contract = AdmissionRules(caps)

    def refs(**kw):
        return contract.decide(GenerationRequest(prompt="p", mode="ref2va", references=kw, frames=48))

    assert refs(images=["a", "b", "c"]).admitted
    assert refs(images=["a"], audios=["s"]).admitted
    for refused, field in (
        (refs(videos=["v"]), "references.videos"),
        (refs(images=["a", "b"], audios=["s", "t"]), "references"),
        (refs(audios=["s"]), "references.audios"),
    ):
        assert not refused.admitted and refused.reason == "mode_unavailable" and field in refused.detail
    last = contract.decide(GenerationRequest(prompt="p", mode="fl2va", keyframes={"first": "a", "last": "b"}, frames=48))
    assert last.reason == "mode_unavailable" and "keyframes.last" in last.detail


def test_the_kernel_limit_and_an_unverified_budget_name_themselves():
    caps = Capabilities(executor="x", max_tokens=10_000, max_tokens_reason="only MATH runs here")
    refused = AdmissionRules(caps).decide(GenerationRequest(prompt="p", width=832, height=480, frames=200))
    assert refused.reason == "vram" and "10000-token limit" in refused.detail and "only MATH" in refused.detail
    assert "with the prompt's" in refused.detail
    caps = Capabilities(executor="x", groups=(GroupBudget(size=1, tokens=10_000, verified=False, source="probe"),))
    refused = AdmissionRules(caps).decide(GenerationRequest(prompt="p", width=832, height=480, frames=200))
    assert refused.reason == "unverified" and refused.ceiling.verified is False


def test_a_job_goes_to_any_group_it_fits_so_the_largest_budget_binds():
    caps = Capabilities(
        executor="x",
        groups=(GroupBudget(size=1, tokens=20_000, verified=True), GroupBudget(size=2, tokens=60_000, verified=True)),
    )
    contract = AdmissionRules(caps)
    assert contract.decide(GenerationRequest(prompt="p", width=832, height=480, frames=300)).admitted  # ~36k: the 2-group
    assert not contract.decide(GenerationRequest(prompt="p", width=832, height=480, frames=600)).admitted


def test_profiles_give_budgets_only_to_what_they_describe():
    profile = load_profile(name="1xh200-bf16")
    h200 = Capabilities(
        executor="pipeline", hardware="NVIDIA H200", model="minimax-h3", groups=(GroupBudget(size=1), GroupBudget(size=2))
    )
    found, caps = applicable([profile], h200)
    assert found is None  # it describes groups of one; the largest group here has two
    assert [(g.size, g.tokens, g.verified) for g in caps.groups] == [(1, 73_386, False), (2, None, False)]
    found, caps = applicable([profile], h200.model_copy(update={"groups": (GroupBudget(size=1),)}))
    assert found is profile and caps.groups[0].tokens == 73_386
    for other in (h200.model_copy(update={"hardware": "cpu"}), h200.model_copy(update={"model": "minimax-h3-tiny"})):
        assert applicable([profile], other.model_copy(update={"groups": (GroupBudget(size=1),)}))[0] is None


@given(shapes, st.integers(1, 1200), st.integers(-3, 3), st.booleans(), st.sampled_from(["kernel", "group"]))
def test_token_limits_hold_to_the_token(shape, frames, delta, verified, where):
    """Budgets drawn at the request's own token count (give or take a few): the boundary itself is tested."""
    request = shape.request(frames)
    tokens = count_tokens(request).total
    if where == "kernel":  # the kernel bounds the whole sequence: the prompt's rows too
        tokens += text_rows_bound(request)
    limit = tokens + delta
    if where == "kernel":
        caps = Capabilities(executor="x", max_tokens=limit)
    else:
        caps = Capabilities(executor="x", groups=(GroupBudget(size=1, tokens=limit, verified=verified),))
    decision = AdmissionRules(caps).decide(request)
    assert decision.admitted == (tokens <= limit)
    if not decision.admitted:
        assert decision.reason == ("vram" if where == "kernel" or verified else "unverified")


profiles_or_none = st.sampled_from([None, "1xh200-bf16"]).map(lambda name: name and load_profile(name=name))


@given(capabilities, profiles_or_none, shapes, st.integers(1, 1400), st.one_of(st.none(), st.integers(0, 250_000)))
def test_the_claims_pre_filter_never_drops_a_job_the_node_would_run(caps, profile, shape, frames, tokens):
    """A queued job (with the tokens its admission stored, or none) that the node's exact judgement
    runs passes the store's pre-filter; and the judgement of a job is admission's for its request."""
    contract = AdmissionRules(caps, profile)
    request = shape.request(frames)
    if contract.why_not(request, tokens) is None:
        assert contract.queue_filter().passes(frames, tokens)
    assert (contract.why_not(request) is None) == contract.decide(request).admitted


@given(windows, st.integers(1, 1400), st.one_of(st.none(), st.integers(0, 250_000)))
def test_without_token_limits_the_pre_filter_is_the_judgement_of_frames(window, frames, tokens):
    """The other direction: where only the window and the API cap bound a job, the pre-filter drops
    exactly what the judgement refuses (`FrameWindow.admits(f)` iff `min_frames <= f <= max_frames`)."""
    contract = AdmissionRules(Capabilities(executor="x", window=window))
    request = GenerationRequest(prompt="p", width=64, height=64, frames=frames)
    assert contract.queue_filter().passes(frames, tokens) == (contract.why_not(request, tokens) is None)


@given(st.lists(capabilities, min_size=1, max_size=3), shapes, st.integers(1, 1400))
def test_across_nodes_a_request_is_admitted_iff_one_node_admits_it_else_the_largest_ceiling_refuses(caps, shape, frames):
    nodes = [(f"n{i}", AdmissionRules(c)) for i, c in enumerate(caps)]
    request = shape.request(frames)
    each = [contract.decide(request) for _, contract in nodes]
    decision = decide_across(nodes, request)
    assert decision.admitted == any(d.admitted for d in each)
    if decision.admitted:
        assert decision == next(d for d in each if d.admitted)  # the first that can: its tokens and frames
    else:
        best = max(d.ceiling.max_frames for d in each)
        closest = next(i for i, d in enumerate(each) if d.ceiling.max_frames == best)
        assert decision.ceiling == each[closest].ceiling and f"node n{closest}: " in decision.detail
    rows = ceilings_across(nodes)
    for i, row in enumerate(rows):
        assert row.max_frames == max(contract.ceilings()[i].max_frames for _, contract in nodes)


def test_a_quality_level_the_executor_does_not_run_is_refused_naming_the_field():
    exact_only = AdmissionRules(Capabilities(executor="comfyui"))
    assert exact_only.decide(GenerationRequest(prompt="p", frames=48)).admitted
    refused = exact_only.decide(GenerationRequest(prompt="p", frames=48, quality="fast"))
    assert not refused.admitted and refused.reason == "mode_unavailable" and refused.field == "quality"
    assert "quality fast is not run by comfyui: it runs exact" in refused.detail
    every = AdmissionRules(Capabilities(executor="pipeline", qualities=("exact", "balanced", "fast")))
    assert every.decide(GenerationRequest(prompt="p", frames=48, quality="fast")).admitted
