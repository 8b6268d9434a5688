"""Each unit's observed times to first token, the hedge delay's stand-in before its latency
model has learned: the nearest-rank 90th percentile of similar prompts, kept bounded."""

from __future__ import annotations

import pytest

from gateway.routing.forecast import Forecast, Placed
from gateway.routing.observed import KEPT, LEAST, ObservedTtft


def test_the_90th_percentile_of_similar_prompts_once_there_are_enough() -> None:
    seen = ObservedTtft()
    for i in range(LEAST - 1):
        seen.add("a", 100, 0.01 * (i + 1))
    assert seen.p90("a", 100) is None  # one short of LEAST
    seen.add("a", 100, 0.05)
    assert seen.p90("a", 100) == 0.05  # of five, the fifth (nearest rank)
    for i in range(5):
        seen.add("a", 100, 0.10 + 0.01 * i)
    assert seen.p90("a", 100) == pytest.approx(0.13)  # of ten, the ninth
    assert seen.p90("b", 100) is None  # another unit's are its own


def test_only_prompts_of_a_similar_length_count() -> None:
    seen = ObservedTtft()
    for _ in range(LEAST):
        seen.add("a", 4000, 2.0)  # long prompts: slow
        seen.add("a", 40, 0.03)  # short ones: quick
    assert seen.p90("a", 50) == 0.03
    assert seen.p90("a", 3000) == 2.0
    assert seen.p90("a", 800) is None  # neither is about 800 tokens


def test_the_ring_keeps_the_latest_and_a_dropped_unit_keeps_nothing() -> None:
    seen = ObservedTtft()
    for _ in range(KEPT):
        seen.add("a", 10, 5.0)  # an old regime
    for _ in range(KEPT):
        seen.add("a", 10, 0.02)
    assert seen.p90("a", 10) == 0.02
    seen.drop("a")
    assert seen.p90("a", 10) is None


def test_the_forecast_answers_from_its_model_once_learned_and_from_what_it_saw_before() -> None:
    f = Forecast(least=20, learn_every=0.0)
    assert f.ttft("a", 10, 0) is None
    now = 100.0
    for _ in range(LEAST):
        placed = Placed("a", 10, 0, None)
        f.sent(placed, 0, now)
        f.first_token(placed, now + 0.03)
        f.finished(placed, 0.005, now + 0.1)
        now += 1.0
    assert f.estimate("a", 10, 0) is None  # 5 answers: the model is not learned
    assert f.ttft("a", 10, 0) == pytest.approx(0.03)  # what it saw stands in
    f.drop("a")
    assert f.ttft("a", 10, 0) is None
