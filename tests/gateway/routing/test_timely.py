"""To the unit predicted to answer soonest, a class's TTFT target first, within the load
bound."""

from __future__ import annotations

from random import Random

from gateway.routing.balance import choose, place
from gateway.routing.forecast import Estimate
from gateway.routing.timely import pick_timely
from tests.support import FakeUnit


def test_the_least_cost_wins() -> None:
    a, b, c = FakeUnit("a"), FakeUnit("b"), FakeUnit("c")
    found = {"a": Estimate(0.2, 0.5), "b": Estimate(0.1, 0.3), "c": Estimate(0.05, 0.6)}
    assert pick_timely(found, [a, b, c], 1.25, None) is b
    assert pick_timely({}, [a, b, c], 1.25, None) is None


def test_units_meeting_the_target_come_first_then_the_soonest_first_token() -> None:
    a, b, c = FakeUnit("a"), FakeUnit("b"), FakeUnit("c")
    found = {"a": Estimate(0.2, 0.5), "b": Estimate(0.1, 0.3), "c": Estimate(0.05, 0.6)}
    # b costs least but misses a 0.08 s target that c meets
    assert pick_timely(found, [a, b, c], 1.25, 0.08) is c
    # every unit misses 0.01 s: the soonest first token
    assert pick_timely(found, [a, b, c], 1.25, 0.01) is c
    # all meet 1 s: the cost decides
    assert pick_timely(found, [a, b, c], 1.25, 1.0) is b


def test_the_load_bound_and_room_guard_the_forecast() -> None:
    hot, cold = FakeUnit("hot", inflight=10), FakeUnit("cold", inflight=1)
    found = {"hot": Estimate(0.01, 0.02), "cold": Estimate(0.5, 0.9)}
    assert pick_timely(found, [hot, cold], 1.25, None) is cold  # hot is past its bound
    full = FakeUnit("full", inflight=2, cap=2)
    assert pick_timely({"full": Estimate(0.0, 0.0)}, [full], 100.0, None) is None


def test_choose_asks_the_forecast_first_and_falls_back_without_it() -> None:
    a, b = FakeUnit("a"), FakeUnit("b")
    found = {"a": Estimate(0.3, 0.3), "b": Estimate(0.1, 0.1)}
    rng = Random(1)
    # a holds the prefix, but b is predicted sooner: the forecast already counted the cache
    assert choose([a, b], [], None, 1.25, rng, {"a": 512}, found) is b
    assert choose([a, b], [], None, 1.25, rng, {"a": 512}, None) is a
    assert choose([a, b], [b], None, 1.25, rng, None, found) is a  # b was tried


def test_place_says_how_it_chose() -> None:
    a, b = FakeUnit("a"), FakeUnit("b")
    rng = Random(2)
    found = {"a": Estimate(0.3, 0.3), "b": Estimate(0.1, 0.1)}
    assert place([a, b], [], None, 1.25, rng, {"a": 512}, found) == (b, "predicted")
    assert place([a, b], [], None, 1.25, rng, {"a": 512}) == (a, "cached")
    assert place([a, b], [], 7, 1.25, rng)[1] == "affinity"
    assert place([a, b], [], None, 1.25, rng)[1] == "load"
    full = FakeUnit("full", inflight=1, cap=1)
    assert place([full], [], None, 1.25, rng) == (None, "load")
