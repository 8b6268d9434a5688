"""Jain's fairness index over the tokens each tenant was served in a window (fake clock)."""

from __future__ import annotations

import pytest

from gateway.observability.fairness import TokenWindow, from_wire, index, jain, merged


def test_jain_is_one_for_equal_shares_and_one_over_n_for_a_monopoly() -> None:
    assert jain([5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert jain([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain([3.0, 1.0]) == pytest.approx(16 / 20)
    assert jain([7.0]) == 1.0
    assert jain([0.0, 0.0]) == 1.0  # nobody served: nobody got more
    assert jain([]) is None


def test_the_window_forgets_what_is_older_than_it() -> None:
    w = TokenWindow(window_s=60.0, buckets=6)  # buckets of 10 s: a window is 6 whole ones
    w.add(0.0, "batch", "a", 100)
    w.add(15.0, "batch", "b", 100)
    w.add(30.0, "interactive", "a", 10)
    assert w.shares(31.0) == {"batch": {"a": 100.0, "b": 100.0}, "interactive": {"a": 10.0}}
    assert w.shares(65.0) == {"batch": {"b": 100.0}, "interactive": {"a": 10.0}}
    w.add(100.0, "batch", "c", 1)
    assert w.shares(100.0) == {"batch": {"c": 1.0}}
    assert w.shares(200.0) == {}


def test_a_tenant_that_asked_and_got_nothing_pulls_the_index_down() -> None:
    w = TokenWindow()
    w.add(1.0, "batch", "a", 100)
    w.add(1.0, "batch", "b")  # refused or still without a token: counted at 0
    assert index(w.shares(2.0)) == {"batch": pytest.approx(0.5)}


def test_merged_sums_a_tenant_over_processes() -> None:
    one = {"batch": {"a": 10.0}}
    two = from_wire({"batch": {"a": 10, "b": 20}, "interactive": {"c": 1}})
    assert merged([one, two]) == {"batch": {"a": 20.0, "b": 20.0}, "interactive": {"c": 1.0}}
    assert index(merged([one, two]))["batch"] == pytest.approx(1.0)
