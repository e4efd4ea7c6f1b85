"""Byte ranges (RFC 9110 §14): every header gives a range inside the file, the whole file, or 416."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3core.service.ranges import Unsatisfiable, parse_range

numbers = st.one_of(st.integers(0, 2000).map(str), st.integers(0, 10**30).map(str), st.just("9" * 4301))
headers = st.one_of(
    st.builds(lambda a, b: f"bytes={a}-{b}", numbers | st.just(""), numbers | st.just("")),
    st.text(max_size=30),
)


@given(headers, st.integers(0, 1000))
def test_any_header_gives_a_range_inside_the_file_the_whole_file_or_416(header, size):
    try:
        span = parse_range(header, size)
    except Unsatisfiable:
        return
    if span is not None:
        first, last = span
        assert 0 <= first <= last < size


@given(st.integers(1, 1000), st.data())
def test_a_satisfiable_range_is_exactly_what_was_asked_clipped_to_the_end(size, data):
    first = data.draw(st.integers(0, size - 1))
    last = data.draw(st.integers(first, size + 100))
    assert parse_range(f"bytes={first}-{last}", size) == (first, min(last, size - 1))
    assert parse_range(f"bytes={first}-{last}", size, if_range='"abc"', etag='"abc"') == (first, min(last, size - 1))


@pytest.mark.parametrize(
    "header", ["bytes=5-3", "bytes=0-1,4-5", "items=0-1", "bytes=-", "nonsense", "bytes=99999999999999999999-1"]
)
def test_what_the_rfc_says_to_ignore_is_the_whole_file(header):
    assert parse_range(header, 100) is None


def test_a_stale_if_range_means_the_whole_file():
    assert parse_range("bytes=0-3", 100, if_range='"old"', etag='"new"') is None
    assert parse_range("bytes=0-3", 100, if_range="Wed, 21 Oct 2015 07:28:00 GMT", etag='"new"') is None


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=" + "9" * 4301 + "-", "bytes=-0"])
def test_past_the_end_is_416(header):
    with pytest.raises(Unsatisfiable):
        parse_range(header, 100)
