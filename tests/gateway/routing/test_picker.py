"""Power-of-two-choices and the balancing decision, on seeded RNGs."""

from __future__ import annotations

from collections import Counter
from random import Random

from gateway.routing.balance import choose
from gateway.routing.picker import pick_p2c, weighted_load
from tests.support import FakeUnit


def test_empty_and_single() -> None:
    rng = Random(1)
    assert pick_p2c([], rng) is None
    only = FakeUnit("a")
    assert pick_p2c([only], rng) is only


def test_lighter_of_two_wins() -> None:
    busy, idle = FakeUnit("busy", inflight=5), FakeUnit("idle", inflight=0)
    for seed in range(20):
        assert pick_p2c([busy, idle], Random(seed)) is idle


def test_never_picks_the_heaviest_of_three() -> None:
    units = [FakeUnit("a", 1), FakeUnit("b", 2), FakeUnit("c", 9)]
    picks = Counter(pick_p2c(units, Random(seed)).id for seed in range(300))  # type: ignore[union-attr]
    assert picks["c"] == 0
    assert picks["a"] > picks["b"] > 0


def test_weight_scales_load() -> None:
    heavy = FakeUnit("heavy", inflight=3, weight=4.0)
    light = FakeUnit("light", inflight=1, weight=1.0)
    assert weighted_load(heavy) < weighted_load(light)
    assert pick_p2c([heavy, light], Random(0)) is heavy


def test_load_spreads_when_placing_many() -> None:
    units = [FakeUnit(f"u{i}", cap=1000) for i in range(4)]
    rng = Random(7)
    for _ in range(400):
        unit = choose(units, (), None, 1.25, rng)
        assert unit is not None
        unit.inflight += 1
    loads = sorted(u.inflight for u in units)
    assert loads[-1] - loads[0] <= 2


def test_choose_skips_full_and_excluded_units() -> None:
    full = FakeUnit("full", inflight=10, cap=10)
    tried = FakeUnit("tried")
    free = FakeUnit("free", inflight=5)
    for seed in range(10):
        assert choose([full, tried, free], [tried], None, 1.25, Random(seed)) is free
    assert choose([full, tried], [tried], None, 1.25, Random(0)) is None


def test_the_others_requests_count_with_the_own() -> None:
    """Another replica's 6 on `shared` make it the heavier, though this gateway has 1 there."""
    shared = FakeUnit("shared", inflight=1, foreign=6)
    mine = FakeUnit("mine", inflight=3)
    for seed in range(10):
        assert pick_p2c([shared, mine], Random(seed)) is mine


def test_placing_many_fills_up_to_the_others_load() -> None:
    """Water-filling over own + reported: the own count is live, so one gateway's burst
    does not herd onto the unit that looked light at the last probe round."""
    units = [FakeUnit("a", foreign=10), FakeUnit("b")]
    rng = Random(3)
    for _ in range(30):
        unit = choose(units, (), None, 1.25, rng)
        assert unit is not None
        unit.inflight += 1
    assert [u.inflight for u in units] == [10, 20]
