"""The capacity probe's search and the profile it writes (pure: a fake measure stands for the device)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h3core.adapters.profiles import builtin_profiles, dump_profile
from h3core.domain.capacity import CapacityProfile
from h3core.domain.geometry import snap_frames
from h3core.domain.probe import SOURCE, Measurement, ProbeIdentity, frame_candidates, next_frames, probed_profile
from tests.profiles import examples

CANDIDATES = frame_candidates(1200)
IDENTITY = ProbeIdentity(
    device="NVIDIA H200",
    dtype="bfloat16",
    kernel="native",
    attention="native (asked auto)",
    model="minimax-h3",
    geometry="released",
)


def test_candidates_are_the_counts_the_model_makes_and_the_cap_itself():
    assert CANDIDATES[:3] == (22, 39, 56) and CANDIDATES[-2:] == (1195, 1200)
    assert all(snap_frames(f) == f for f in CANDIDATES[:-1]) and snap_frames(1200) == 1212
    assert frame_candidates(124) == tuple(range(22, 125, 17)) and frame_candidates(10) == (10,)
    assert frame_candidates(300, min_frames=100)[0] == 107


def run(boundary: int, *, start: int, growth: float = 2.0, precision: int = 17, candidates=CANDIDATES):
    """The search against a device on which exactly the counts up to `boundary` fit."""
    trials: dict[int, str] = {}
    order = []
    while (f := next_frames(candidates, trials, start=start, growth=growth, precision=precision)) is not None:
        assert f not in trials, "a point measured twice"
        trials[f] = "ran" if f <= boundary else "oom"
        order.append(f)
    return trials, order


@settings(max_examples=examples(100))
@given(boundary=st.integers(0, 1300), start=st.integers(1, 1300), growth=st.sampled_from([1.5, 2.0, 3.0]))
def test_the_search_ends_between_adjacent_counts_from_either_side(boundary, start, growth):
    trials, order = run(boundary, start=start, growth=growth)
    ran = [f for f, o in trials.items() if o == "ran"]
    oom = [f for f, o in trials.items() if o == "oom"]
    fits = [f for f in CANDIDATES if f <= boundary]
    # What ran is the largest count that fits; what did not is the next one (none past the cap).
    assert max(ran, default=None) == (fits[-1] if fits else None)
    above = [f for f in CANDIDATES if f > boundary]
    assert min(oom, default=None) == (above[0] if above else None)
    assert len(order) <= 30  # growth, then bisection: logarithmic, never a sweep


def test_the_search_grows_from_the_start_then_bisects():
    trials, order = run(480, start=124)
    assert order[:4] == [124, 260, 532, 396]  # x2 (snapped up) until an out-of-memory, then halves the gap
    assert max(f for f, o in trials.items() if o == "ran") == 464 and min(f for f, o in trials.items() if o == "oom") == 481


def test_a_start_that_runs_out_of_memory_shrinks_and_a_cap_that_runs_stops():
    _, order = run(60, start=600)
    assert order[:3] == [600, 294, 141]
    trials, order = run(5000, start=124)
    assert order[-1] == 1200 and set(trials.values()) == {"ran"}
    trials, order = run(10, start=124)
    assert order[-1] == 22 and set(trials.values()) == {"oom"}  # nothing fits: no budget


def test_precision_stops_the_bisection_early():
    trials, _ = run(480, start=124, precision=100)
    lo = max(f for f, o in trials.items() if o == "ran")
    hi = min(f for f, o in trials.items() if o == "oom")
    assert lo <= 480 < hi and hi - lo <= 100 and hi - lo > 17


def test_inputs_that_are_not_one_boundary_are_refused():
    with pytest.raises(ValueError, match="not one boundary"):
        next_frames(CANDIDATES, {124: "oom", 243: "ran"}, start=124)
    with pytest.raises(ValueError, match="not candidates"):
        next_frames(CANDIDATES, {125: "ran"}, start=124)
    with pytest.raises(ValueError, match="growth"):
        next_frames(CANDIDATES, {}, start=124, growth=1.0)


def m(frames: int, outcome: str, width: int = 1344, height: int = 768) -> Measurement:
    if outcome == "ran":
        return Measurement(
            width=width,
            height=height,
            frames=frames,
            outcome="ran",
            step_seconds=6.5,
            decode_seconds=7.0,
            step_peak_bytes=68 * 2**30,
            decode_peak_bytes=66 * 2**30,
        )
    return Measurement(
        width=width,
        height=height,
        frames=frames,
        outcome="oom",
        stage="denoise",
        error="CUDA out of memory. Tried to allocate 2 GiB",
    )


def test_the_profile_has_the_points_budget_and_names_where_it_was_probed():
    p = probed_profile(IDENTITY, [m(124, "ran"), m(464, "ran"), m(481, "oom")], api_max_frames=1200, resolutions=[(1344, 768)])
    b = p.budget()
    assert b.verified and b.largest_ran.frames == 464 and b.smallest_oom.frames == 481
    assert b.largest_ran_tokens <= b.tokens < b.smallest_oom_tokens
    assert p.source == SOURCE == "probed with random weights"
    assert p.name == "probed-1xnvidia-h200-native-minimax-h3"
    (match,) = p.match
    assert (match.executor, match.device, match.kernel, match.model, match.group_size) == (
        "pipeline",
        "NVIDIA H200",
        "native",
        "minimax-h3",
        1,
    )
    assert "step 6.50 s" in p.points[0].note and "68.00 GiB" in p.points[0].note
    assert "out of memory in denoise (CUDA out of memory" in p.points[2].note
    assert CapacityProfile.model_validate(__import__("tomllib").loads(dump_profile(p))) == p


def test_a_profile_without_an_oom_is_unverified_and_without_a_run_is_refused():
    assert not probed_profile(IDENTITY, [m(1200, "ran")], api_max_frames=1200, resolutions=[(1344, 768)]).budget().verified
    with pytest.raises(ValueError, match="at least one run"):
        probed_profile(IDENTITY, [m(22, "oom")], api_max_frames=1200, resolutions=[(1344, 768)])
    # Canvases whose points are not one token budget: no profile pretends they are.
    with pytest.raises(ValueError, match="contradict one budget"):
        probed_profile(IDENTITY, [m(464, "ran"), m(1200, "oom", 448, 256)], api_max_frames=1200, resolutions=[(1344, 768)])


@pytest.mark.parametrize("profile", builtin_profiles(), ids=lambda p: p.name)
def test_every_builtin_profile_survives_being_written_and_read(profile):
    import tomllib

    text = dump_profile(profile, header="a header\nof two lines")
    assert text.startswith("# a header\n# of two lines\n")
    assert CapacityProfile.model_validate(tomllib.loads(text)) == profile
