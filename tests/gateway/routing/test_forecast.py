"""The fleet's latency forecast on a fake clock: what is queued where, what each unit learns
from its attempts, and what a placement is predicted to cost."""

from __future__ import annotations

import pytest

from gateway.routing.forecast import DECODE_HORIZON, FIGURES, Forecast, Placed
from gateway.routing.latency import lag_reason


def teach(forecast: Forecast, unit: str, ttft: float, gap: float, n: int = 25) -> None:
    """`n` sequential attempts on `unit`: each answered after `ttft` s, at `gap` s a token."""
    now = 1000.0 + 100.0 * len(forecast.units)
    for i in range(n):
        placed = Placed(unit, 500 + 40 * i, 0, None)
        forecast.sent(placed, 0, now)
        forecast.first_token(placed, now + ttft)
        forecast.finished(placed, gap, now + ttft + 1.0)
        now += 2.0


def test_a_units_queue_holds_what_was_sent_and_not_yet_answered() -> None:
    f = Forecast()
    one, two = Placed("a", 1000, 200, None), Placed("a", 300, 0, None)
    f.sent(one, 0, 1.0)
    f.sent(two, 1, 1.1)
    assert f.queued["a"] == 800 + 300
    assert (one.queued, two.queued) == (0, 800)  # what each found ahead of it
    f.first_token(one, 1.5)
    assert f.queued["a"] == 300
    f.unqueue(one)  # twice (its request ended, say): counted out once
    f.unqueue(two)
    assert f.queued["a"] == 0


def test_an_attempt_never_sent_or_on_a_dropped_unit_teaches_nothing() -> None:
    f = Forecast()
    f.first_token(Placed("a", 100, 0, None), 5.0)  # never sent
    assert "a" not in f.units
    placed = Placed("b", 100, 0, None)
    f.sent(placed, 0, 1.0)
    f.drop("b")  # removed from the fleet while its attempt was out
    f.first_token(placed, 2.0)
    f.finished(placed, 0.01, 3.0)
    assert "b" not in f.units and "b" not in f.queued


def test_no_estimate_until_every_candidate_has_learned() -> None:
    f = Forecast(least=20, learn_every=0.0)
    teach(f, "a", 0.1, 0.01, n=19)
    assert f.estimate("a", 500, 0) is None
    teach(f, "a", 0.1, 0.01, n=1)
    assert f.estimate("a", 500, 0) is not None
    assert f.estimates([("a", 0), ("b", 0)], 500, {}) is None  # b has not


def test_the_cost_is_the_predicted_ttft_plus_the_decode_horizon() -> None:
    f = Forecast(least=5, learn_every=0.0)
    teach(f, "fast", 0.05, 0.01)
    teach(f, "slow", 0.40, 0.02)
    found = f.estimates([("fast", 0), ("slow", 0)], 900, {})
    assert found is not None
    assert found["fast"].ttft == pytest.approx(0.05, rel=0.05)
    assert found["slow"].ttft == pytest.approx(0.40, rel=0.05)
    assert found["fast"].cost == pytest.approx(0.05 + DECODE_HORIZON * 0.01, rel=0.05)
    figures = f.figures(2000.0)["slow"]
    assert list(figures) == [*FIGURES, "queued_tokens"]
    assert figures["tpot_base"] + figures["tpot_per_running"] == pytest.approx(0.02, rel=0.05)


def test_a_learned_unit_learns_at_most_once_a_period_until_it_is_surprised() -> None:
    f = Forecast(least=5, learn_every=0.5)
    now = 1.0

    def answer(seconds: float) -> None:
        nonlocal now
        placed = Placed("a", 100, 0, None)
        f.sent(placed, 0, now)
        f.first_token(placed, now + seconds)
        now += 0.01

    for _ in range(10):  # until learned (5), every answer teaches; then one a half second
        answer(0.1)
    fit = f.units["a"].ttft
    assert fit.samples == 5 and f.queued["a"] == 0  # all answered
    now += 0.5
    answer(0.1)
    answer(0.5)  # five times the prediction, but within the half second: not seen
    assert fit.samples == 6
    now += 0.5
    answer(0.5)  # seen: a surprise, so the next answers all teach until it is settled
    answer(0.5)
    answer(0.5)  # the third surprise in a row resets the fit's certainty
    assert fit.samples == 9 and fit.surprised == 0


def test_a_lagging_unit_is_named_with_its_ratio() -> None:
    f = Forecast(least=5, learn_every=0.0)
    for unit, ttft in (("a", 0.1), ("b", 0.11), ("c", 0.12), ("d", 0.6)):
        teach(f, unit, ttft, 0.01)
    figures = f.figures(2000.0)
    assert figures["d"]["ttft_1k_idle"] == pytest.approx(0.6, rel=0.05)
    per_k = {unit: values["ttft_1k_idle"] for unit, values in figures.items()}
    why = lag_reason(per_k, "d", 2.0)
    assert why is not None and "0.6 s as learned from its answers, is 5.2x the fleet's" in why
    assert lag_reason(per_k, "a", 2.0) is None and lag_reason(per_k, "d", 6.0) is None


def test_a_units_overtaken_share_is_a_figure_once_enough_answers_are_counted() -> None:
    f = Forecast(least=5, learn_every=0.0, window=60.0)
    teach(f, "a", 0.1, 0.01, n=15)  # at 1000 + 2i: 15 answers begun, the last at 1028
    assert "overtaken_share" not in f.figures(1029.0)["a"]  # 15 counted, fewer than 20
    for _ in range(5):
        f.hedge_overtook("a", 1029.0)
    assert f.figures(1029.0)["a"]["overtaken_share"] == pytest.approx(0.25)  # 5 of 20
    # The window slides: a minute on, only the overtaken copies' bucket is left, too few.
    assert "overtaken_share" not in f.figures(1085.0)["a"]
    f.hedge_overtook("gone", 1029.0)  # a unit never sent to (it left the fleet): not counted
    assert "gone" not in f.overtaken._units
    f.drop("a")
    assert f.overtaken.share("a", 1029.0) is None


def test_a_unit_whose_every_copy_is_overtaken_has_its_share_before_a_model() -> None:
    """It never gets a first token to learn from: its share stands alone among its figures,
    and is what puts it on probation."""
    f = Forecast(least=5, learn_every=0.0, window=60.0)
    placed = Placed("s", 100, 0, None)
    f.sent(placed, 0, 1000.0)  # the unit is in the fleet: it was sent a copy
    for i in range(20):
        f.hedge_overtook("s", 1000.0 + i)
    assert f.figures(1020.0)["s"] == {"overtaken_share": 1.0}
