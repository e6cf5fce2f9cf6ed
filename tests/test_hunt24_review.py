"""Hunt 24 review: what the merged hunt-24 branches refused or did otherwise for a legitimate
user, each failing on the merge before its fix."""

from __future__ import annotations

import pytest

from tokdyn.schedule import explicit_schedule, geometric_schedule


@pytest.mark.parametrize("steps", [{300, 100, 200}, frozenset({100, 200, 300}), {100: "a", 200: "b", 300: "c"}.keys()],
                         ids=["set", "frozenset", "dict keys"])  # fmt: skip
def test_an_explicit_schedule_of_a_set_is_its_steps_sorted(steps):
    """explicit_schedule took any iterable of steps (np.asarray(list(steps))); hunt 24's as_values
    read a set or dict keys as one object ('expected integers, got dtype object')."""
    assert explicit_schedule(steps).tolist() == sorted(steps)


def test_a_schedule_made_by_a_union_of_schedules():
    """The union of a geometric schedule and extra steps, written as sets, is a schedule."""
    extra = {250, 750}
    assert explicit_schedule(set(geometric_schedule(1000, 5).tolist()) | extra).tolist() == sorted(
        set(geometric_schedule(1000, 5).tolist()) | extra)
