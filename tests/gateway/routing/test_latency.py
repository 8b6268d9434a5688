"""The per-unit latency model on generated observations (a seeded RNG; no clock is read)."""

from __future__ import annotations

from random import Random

import pytest

from gateway.routing.latency import (
    MAX_VARIANCE,
    PRIOR_VARIANCE,
    Rls,
    UnitLatency,
    lag_reason,
    slow_prefill,
)


def feed(model: UnitLatency, rng: Random, per_k: float, n: int, base: float = 0.02) -> None:
    """`n` first tokens of a unit computing `per_k` s per thousand uncached tokens, with 0.4
    of that per thousand queued, and 5% noise."""
    for _ in range(n):
        uncached, queued = rng.randint(0, 4000), rng.randint(0, 8000)
        true = base + per_k * uncached / 1000 + 0.4 * per_k * queued / 1000
        model.first_token(uncached, queued, 0, true * rng.uniform(0.95, 1.05))


def test_it_learns_two_units_of_different_speeds() -> None:
    rng = Random(1)
    fast, slow = UnitLatency(), UnitLatency()
    feed(fast, rng, 0.5, 300)
    feed(slow, rng, 1.5, 300)
    for uncached, queued in ((500, 0), (2000, 1000), (4000, 6000)):
        want_fast = 0.02 + 0.5 * uncached / 1000 + 0.2 * queued / 1000
        want_slow = 0.02 + 1.5 * uncached / 1000 + 0.6 * queued / 1000
        assert fast.predict_ttft(uncached, queued) == pytest.approx(want_fast, rel=0.1)
        assert slow.predict_ttft(uncached, queued) == pytest.approx(want_slow, rel=0.1)
    assert fast.prefill_per_ktoken == pytest.approx(0.5, rel=0.1)


def test_no_prediction_before_enough_observations() -> None:
    model = UnitLatency(least=20)
    feed(model, Random(2), 1.0, 19)
    assert model.predict_ttft(1000, 0) is None and model.prefill_per_ktoken is None
    feed(model, Random(3), 1.0, 1)
    assert model.predict_ttft(1000, 0) is not None


def test_it_forgets_an_old_regime() -> None:
    """A unit that slows from 0.5 to 2 s per thousand tokens is relearned within a few
    hundred requests."""
    rng = Random(4)
    model = UnitLatency(forget=0.99)
    feed(model, rng, 0.5, 1000)
    feed(model, rng, 2.0, 400)
    assert model.prefill_per_ktoken == pytest.approx(2.0, rel=0.1)


def test_time_per_token_follows_the_running_requests() -> None:
    rng = Random(5)
    model = UnitLatency()
    for _ in range(200):
        running = rng.randint(1, 32)
        model.token_gap(running, (0.01 + 0.002 * running) * rng.uniform(0.97, 1.03))
    assert model.predict_tpot(8) == pytest.approx(0.026, rel=0.05)
    assert model.predict_tpot(30) == pytest.approx(0.07, rel=0.05)


def test_it_flags_the_unit_whose_prefill_drifts_above_the_fleets() -> None:
    rng = Random(6)
    units = {name: UnitLatency() for name in "abcd"}
    for name, per_k in zip("abcd", (0.5, 0.55, 0.6, 1.8), strict=True):
        feed(units[name], rng, per_k, 200)
    per_k = {name: f for name, m in units.items() if (f := m.prefill_per_ktoken) is not None}
    flagged = slow_prefill(per_k)
    assert set(flagged) == {"d"} and flagged["d"] == pytest.approx(1.8 / 0.575, rel=0.15)
    assert slow_prefill({k: per_k[k] for k in "ad"}) == {}  # two units: no fleet to judge by
    reason = lag_reason(per_k, "d", 2.0)
    assert reason is not None and "x the fleet's median" in reason
    assert lag_reason(per_k, "a", 2.0) is None and lag_reason(per_k, "d", 0.0) is None


def test_one_length_of_prompt_keeps_the_fit_bounded() -> None:
    """Every prompt the same length, nothing queued: the unexcited directions' variance is
    capped and the prediction at that point stays right."""
    model = UnitLatency()
    for _ in range(5000):
        model.first_token(1000, 0, 0, 0.52)
    assert max(model.ttft.p[i][i] for i in range(4)) <= MAX_VARIANCE * 1.0001
    assert model.predict_ttft(1000, 0) == pytest.approx(0.52, rel=1e-3)


def test_bad_values_are_ignored_and_bad_settings_refused() -> None:
    rls = Rls(2)
    rls.update((1.0, float("nan")), 1.0)
    rls.update((1.0, 1.0), float("inf"))
    assert rls.samples == 0
    with pytest.raises(ValueError, match="forget"):
        Rls(2, forget=0.2)


def test_an_abrupt_change_is_relearned_within_a_few_observations() -> None:
    """A unit that was 4x slower recovers: three surprises in a row reset the fit's certainty,
    and a handful more observations bring it to the new speed (forgetting alone would take
    hundreds)."""
    rng = Random(7)
    model = UnitLatency(forget=0.99)
    feed(model, rng, 2.0, 500)
    feed(model, rng, 0.5, 12)
    assert model.prefill_per_ktoken == pytest.approx(0.52, rel=0.25)
    steady = UnitLatency(forget=0.99)
    feed(steady, rng, 0.5, 500)
    feed(steady, rng, 0.5, 12)  # noise within 5% never resets it
    assert steady.ttft.surprised == 0 and steady.ttft.p[0][0] < PRIOR_VARIANCE / 10
