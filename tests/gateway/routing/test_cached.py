"""To the unit that holds the most of a prompt's prefix, within the load bound."""

from __future__ import annotations

from collections import Counter
from random import Random

from gateway.routing.balance import choose
from gateway.routing.cached import pick_cached
from tests.support import FakeUnit


def test_the_deepest_holder_wins() -> None:
    a, b, c = FakeUnit("a"), FakeUnit("b"), FakeUnit("c")
    assert pick_cached({"a": 2, "b": 5}, [a, b, c], 1.25) is b
    assert pick_cached({}, [a, b, c], 1.25) is None
    assert pick_cached({"x": 3}, [a, b, c], 1.25) is None  # a unit not among the candidates


def test_among_equal_depths_the_least_loaded() -> None:
    a, b = FakeUnit("a", inflight=3), FakeUnit("b", inflight=1)
    assert pick_cached({"a": 4, "b": 4}, [a, b], 10.0) is b
    heavy = FakeUnit("heavy", inflight=3, weight=4.0)  # 1 per unit of weight
    assert pick_cached({"heavy": 4, "b": 4}, [heavy, b], 10.0) is heavy


def test_a_holder_past_the_bound_gives_way_to_the_next_deepest() -> None:
    hot = FakeUnit("hot", inflight=10)
    warm, cold = FakeUnit("warm", inflight=1), FakeUnit("cold", inflight=1)
    # 13 in flight with this one over 3 units: a fair share of 4.33, bound ceil(1.25 x) = 6
    assert pick_cached({"hot": 8, "warm": 3}, [hot, warm, cold], 1.25) is warm
    # every holder past the bound: nothing cached is picked, the caller places it
    assert pick_cached({"hot": 8}, [hot, warm, cold], 1.25) is None


def test_a_full_holder_is_passed_over() -> None:
    full, other = FakeUnit("full", inflight=2, cap=2), FakeUnit("other", inflight=2)
    assert pick_cached({"full": 9, "other": 1}, [full, other], 100.0) is other


def test_choose_prefers_the_cache_to_affinity_and_load() -> None:
    units = [FakeUnit("a"), FakeUnit("b"), FakeUnit("c")]
    # affinity keys that rank another unit first, so the cache alone can pick c
    keys = [k for k in range(50) if choose(units, (), k, 1.25, Random(0)) is not units[2]]
    assert len(keys) > 20
    for key in keys:
        assert choose(units, (), key, 1.25, Random(key), {"c": 2}) is units[2]


def test_choose_skips_a_tried_holder() -> None:
    a, b = FakeUnit("a"), FakeUnit("b")
    assert choose([a, b], [b], None, 1.25, Random(0), {"b": 7}) is a


def test_one_shared_prefix_spreads_once_its_holder_is_busy() -> None:
    """Every request shares one prefix held by `a` at first: `a` takes its bounded share and
    the overflow goes elsewhere (where, once cached there too, it would count as well)."""
    units = [FakeUnit(n) for n in "abc"]
    rng = Random(3)
    for _ in range(60):
        unit = choose(units, (), None, 1.25, rng, {"a": 4})
        assert unit is not None
        unit.inflight += 1
    counts = Counter({u.id: u.inflight for u in units})
    assert counts["a"] == max(counts.values()) <= 1.25 * 60 / 3 + 1
    assert counts["b"] > 0 and counts["c"] > 0


def test_a_holder_of_more_of_the_prompt_takes_more_before_it_gives_way() -> None:
    """Four in flight over two units (three and one, this one counted): 1.25x bounds a unit to
    three, so the holder at three gives way at the plain bound; holding the whole prompt it
    may take a fourth (2x: four), holding a quarter of it not (1.25 + 0.75 / 4 = 1.44x:
    ceil(2.875) = 3)."""
    holder, other = FakeUnit("holder", inflight=3), FakeUnit("other", inflight=0)
    units = [holder, other]
    assert pick_cached({"holder": 1024}, units, 1.25) is None
    assert pick_cached({"holder": 1024}, units, 1.25, 1024, 2.0) is holder
    assert pick_cached({"holder": 256}, units, 1.25, 1024, 2.0) is None
    # no prompt length, or no looser factor: the plain bound
    assert pick_cached({"holder": 1024}, units, 1.25, 0, 2.0) is None
    assert pick_cached({"holder": 1024}, units, 1.25, 1024, None) is None
    # past the looser bound too (over three units, five in flight: 2x of 5 / 3 is 4, and
    # this would be its fifth): nothing cached is picked
    holder.inflight = 4
    three = [holder, other, FakeUnit("third")]
    assert pick_cached({"holder": 1024}, three, 1.25, 1024, 2.0) is None


def test_a_wholly_cached_shared_prefix_spreads_past_the_looser_bound() -> None:
    units = [FakeUnit(n) for n in "abc"]
    rng = Random(3)
    for _ in range(60):
        unit = choose(units, (), None, 1.25, rng, {"a": 512}, prompt=512, cached_factor=2.0)
        assert unit is not None
        unit.inflight += 1
    assert units[0].inflight == max(u.inflight for u in units) <= 2.0 * 60 / 3 + 1
    assert units[0].inflight > 1.25 * 60 / 3 + 1  # more than the plain bound would give it
    assert units[1].inflight > 0 and units[2].inflight > 0
