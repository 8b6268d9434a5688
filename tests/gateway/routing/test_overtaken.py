"""Probation on a fake clock: each unit's share of copies a hedge overtook, and which units
it puts on probation against the fleet."""

from __future__ import annotations

import pytest

from gateway.health_states import Lag
from gateway.routing.overtaken import LEAST, LEAST_KEPT, Overtaken, on_probation, probation
from gateway.routing.window import SlidingSums


def test_a_share_needs_enough_answers_and_slides_with_the_window() -> None:
    o = Overtaken(window=10.0)
    for _ in range(LEAST - 2):
        o.begun("a", 1.0)
    o.overtaken("a", 1.5)
    assert o.share("a", 2.0) is None  # LEAST - 1 counted
    o.overtaken("a", 2.0)
    assert o.share("a", 2.0) == pytest.approx(2 / LEAST)
    assert o.share("b", 2.0) is None  # never seen
    assert dict(o.shares(2.0)) == {"a": pytest.approx(2 / LEAST)}
    # 10 s on, the answers at 1.0 (and the copy at 1.5) fell out of the window.
    assert o.share("a", 11.5) is None
    o.drop("a")
    assert dict(o.shares(2.0)) == {}


def test_probation_takes_a_share_past_the_floor_and_three_times_the_median() -> None:
    fleet = {"a": 0.01, "b": 0.02, "c": 0.0, "d": 0.16}
    assert on_probation(fleet, 0.05) == {"d": 0.16}
    assert on_probation(fleet, 0.2) == {}  # under the floor
    assert on_probation(fleet, 0.0) == {}  # off
    # Stragglers everywhere: every unit alike, none on probation (hedging answers that).
    assert on_probation({"a": 0.08, "b": 0.07, "c": 0.09, "d": 0.1}, 0.05) == {}
    # Three times the median, not only the floor: 0.2 against a median of 0.08.
    assert on_probation({"a": 0.08, "b": 0.07, "c": 0.09, "d": 0.2}, 0.05) == {}
    assert on_probation({"a": 0.08, "b": 0.07, "c": 0.09, "d": 0.3}, 0.05) == {"d": 0.3}
    # Two units: one straggler would be half the median; nothing is judged.
    assert on_probation({"a": 0.0, "d": 0.5}, 0.05) == {}


def test_the_reason_names_the_share_and_the_median() -> None:
    fleet = {"a": 0.01, "b": 0.02, "c": 0.0, "d": 0.16}
    reason = (
        "a hedge overtook 16% of its first copies before they began (the fleet's median: 2%);"
        " on probation"
    )
    assert probation(fleet, "d", 0.05) == Lag(reason, 0.84)
    assert probation(fleet, "a", 0.05) is None


def test_on_probation_a_unit_keeps_the_share_of_its_copies_that_began() -> None:
    """Of slow_weight: a straggler overtaken in 16% of its copies keeps 84% of it, one whose
    every copy stalls keeps the least that still lets its share be measured."""
    calm = {"a": 0.0, "b": 0.01, "c": 0.0}
    kept = [probation({**calm, "d": share}, "d", 0.05) for share in (0.16, 0.5, 0.93, 1.0)]
    assert [lag.share for lag in kept if lag is not None] == [0.84, 0.5, 0.07, LEAST_KEPT]


def test_a_peek_is_the_total_without_moving_the_ring() -> None:
    sums, twin = SlidingSums(10.0, 1), SlidingSums(10.0, 1)
    for t in (0.5, 1.5, 4.0, 9.9, 10.5, 12.0, 19.0):
        sums.add(t, 0)
        twin.add(t, 0)
    for now in (19.0, 20.4, 21.0, 25.0, 29.5, 40.0):
        before = list(map(list, sums._counts)), sums._slot
        assert sums.peek(now, 0) == twin.total(now, 0), now
        assert (list(map(list, sums._counts)), sums._slot) == before  # nothing moved
