import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from h3core.domain.topology import GroupPlan, Topology, can_ever_fit, fits, place


def test_four_devices_split_three_ways():
    assert [g.devices for g in Topology.uniform(4, 4).groups()] == [(0, 1, 2, 3)]
    assert [g.devices for g in Topology.uniform(4, 2).groups()] == [(0, 1), (2, 3)]
    assert [g.devices for g in Topology.uniform(4, 1).groups()] == [(0,), (1,), (2,), (3,)]
    assert [g.devices for g in Topology.parse(4, "2,1,1").groups()] == [(0, 1), (2,), (3,)]


@pytest.mark.parametrize(
    ("devices", "size", "message"),
    [
        (4, "3", "group_size: 3 does not divide devices \\(4\\)"),
        (4, "2,1", "use 3 devices, but devices is 4"),
        (2, "two", "group_size: 'two' is not a size"),
        (2, "0", "group_size: 0 does not divide"),
        (2, "2,0", "at least one device"),
    ],
)
def test_bad_topologies_name_the_setting(devices, size, message):
    with pytest.raises((ValueError, ValidationError), match=message):
        Topology.parse(devices, size)


def test_the_smallest_idle_group_that_fits_is_chosen():
    groups = Topology.parse(4, "2,1,1").groups()
    budgets = {1: 1000, 2: 5000}
    assert place(800, groups, budgets).index == 1  # a small job leaves the big group free
    assert place(3000, groups, budgets).index == 0  # only the 2-rank group holds it
    assert place(3000, groups[1:], budgets) is None  # it waits for the big group
    assert place(None, groups, budgets).index == 1
    assert place(9000, groups, {}).index == 1  # nothing measured: everything fits
    assert not can_ever_fit(6000, groups, budgets) and can_ever_fit(5000, groups, budgets)


plans = st.lists(st.integers(1, 8), min_size=1, max_size=8).map(
    lambda sizes: [GroupPlan(index=i, devices=tuple(range(s))) for i, s in enumerate(sizes)]
)


@given(
    st.one_of(st.none(), st.integers(0, 100_000)),
    plans,
    st.dictionaries(st.integers(1, 8), st.integers(0, 100_000), max_size=8),
)
def test_placement_picks_a_fitting_group_no_larger_than_any_other_that_fits(tokens, idle, budgets):
    chosen = place(tokens, idle, budgets)
    fitting = [g for g in idle if fits(tokens, g.size, budgets)]
    if not fitting:
        assert chosen is None
    else:
        assert chosen in fitting and chosen.size == min(g.size for g in fitting)
