"""The plan of a long video's segments (h3core.domain.segments): what the segments keep adds up to
exactly the frames asked, each call fits the window, the fewest calls are made and they are even;
a video inside the window is one segment, and a plan that does not add up is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from h3core.domain.frames import snap_frames
from h3core.domain.geometry import FPS
from h3core.domain.segments import JOINT_FRAMES, Segment, SegmentPlan, plan_segments, segments_needed

windows = st.integers(min_value=2, max_value=400)
lengths = st.integers(min_value=1, max_value=24 * 120)


@given(frames=lengths, most=windows)
def test_the_segments_keep_exactly_the_frames_asked_each_fits_and_they_are_fewest_and_even(frames, most):
    plan = plan_segments(frames, most)
    segments = plan.segments
    assert plan.frames == frames and sum(s.keep for s in segments) == frames
    assert all(1 <= s.frames <= most for s in segments)
    assert max(s.frames for s in segments) - min(s.frames for s in segments) <= 1
    assert [s.skip for s in segments] == [0] + [JOINT_FRAMES] * (len(segments) - 1)
    assert [s.start for s in segments] == [sum(t.keep for t in segments[:i]) for i in range(len(segments))]
    # The fewest: one segment fewer cannot hold the frames.
    n = len(segments)
    assert n == segments_needed(frames, most)
    assert n == 1 or most + (n - 2) * (most - JOINT_FRAMES) < frames


@given(frames=lengths, most=windows)
def test_a_video_inside_the_window_is_one_segment_and_one_past_it_is_several(frames, most):
    plan = plan_segments(frames, most)
    assert (len(plan.segments) == 1) == (frames <= most)
    if len(plan.segments) == 1:
        assert plan.segments[0] == Segment(index=0, frames=frames, skip=0, start=0) and plan.joints == ()


@given(seconds=st.integers(min_value=16, max_value=60))
def test_a_long_video_on_the_model_s_window_trims_at_most_a_clip_per_segment(seconds):
    most = 15 * FPS - (15 * FPS - 5) % 17  # the longest 17n+5 request inside a 15 s window: 355
    plan = plan_segments(seconds * FPS, most)
    assert all(snap_frames(s.frames) <= most and snap_frames(s.frames) - s.frames < 17 for s in plan.segments)
    assert sum(s.keep for s in plan.segments) / FPS == seconds


def test_thirty_seconds_on_a_window_of_241_frames_is_three_segments_joined_where_each_begins():
    plan = plan_segments(720, 241)  # 241 + 240 + 240 frames at most: three are needed
    assert [(s.frames, s.skip, s.keep, s.start) for s in plan.segments] == [
        (241, 0, 241, 0),
        (241, 1, 240, 241),
        (240, 1, 239, 481),
    ]
    assert plan.joints == (241, 481)
    assert plan.describe() == "3 segments of 10.04, 10 and 9.958 s, joined at 10.04 s and 20.04 s"


def test_a_plan_that_does_not_add_up_or_continue_is_refused():
    one = Segment(index=0, frames=10, skip=0, start=0)
    with pytest.raises(ValidationError, match="keep 10 frames, not the 11 asked"):
        SegmentPlan(frames=11, segments=(one,))
    with pytest.raises(ValidationError, match="does not continue"):
        SegmentPlan(frames=19, segments=(one, Segment(index=1, frames=10, skip=0, start=10)))  # no joint frame
    with pytest.raises(ValidationError, match="does not continue"):
        SegmentPlan(frames=19, segments=(one, Segment(index=1, frames=10, skip=1, start=9)))  # overlaps
    assert SegmentPlan(frames=19, segments=(one, Segment(index=1, frames=10, skip=1, start=10))).joints == (10,)
    with pytest.raises(ValueError, match="cannot continue"):
        segments_needed(10, 1)
