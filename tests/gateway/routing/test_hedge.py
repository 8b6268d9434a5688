"""Hedging's rules on a fake clock: the delay per request, the budget in prefill tokens, the
overload rule; and the second copy's slot, taken at once or not at all."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, config_from_dict
from gateway.config.hedge import HedgeConfig
from gateway.routing.admission import Admission
from gateway.routing.hedge import FleetNow, Hedging

CALM = FleetNow(queued=0, units=4, unroutable=0)


def test_the_delay_is_a_multiple_of_the_prediction_within_its_bounds() -> None:
    h = Hedging(HedgeConfig(delay_factor=2.0, min_delay=0.05, max_delay=2.0))
    assert h.delay(0.3) == pytest.approx(0.6)
    assert h.delay(0.001) == 0.05  # an idle unit's short prompt: soon, but not at once
    assert h.delay(5.0) == 2.0  # a long prefill: never later than max_delay
    assert h.delay(None) == 2.0 and h.delay(0.0) == 2.0  # nothing predicted: the longest


def test_the_delay_is_the_sooner_of_its_unit_and_the_best_other() -> None:
    """A unit that stalls every request learns a long time to first token: its own
    prediction alone would wait as long as its stalls before hedging them."""
    h = Hedging(HedgeConfig(delay_factor=2.0, min_delay=0.05, max_delay=5.0))
    assert h.delay(2.0, 0.03) == pytest.approx(0.06)  # the straggler: hedged soon
    assert h.delay(0.03, 2.0) == pytest.approx(0.06)  # a slower fleet does not delay it
    assert h.delay(None, 0.3) == pytest.approx(0.6)  # its own model still learning
    assert h.delay(0.3, None) == pytest.approx(0.6)
    assert h.delay(None, None) == 5.0 and h.delay(0.0, 0.0) == 5.0


def test_the_budget_is_a_share_of_prefill_tokens_over_the_window() -> None:
    h = Hedging(HedgeConfig(budget_share=0.05, budget_window=10.0))
    for t in range(10):
        h.prefill(1_000, now=float(t))  # 10,000 tokens: 500 may be hedged
    assert h.refusal(400, CALM, now=9.5) is None
    h.spend(400, now=9.5)
    why = h.refusal(200, CALM, now=9.6)
    assert why is not None and why.startswith("budget:")
    assert h.refusal(100, CALM, now=9.6) is None  # what is left still fits
    assert h.refusal(101, CALM, now=9.6) is not None  # and no more: 400 + 101 > 500
    # The window moves on: the old traffic and the old hedges leave it together.
    assert h.refusal(1, CALM, now=30.0) is not None  # no traffic: nothing to hedge on
    h.prefill(1_000, now=30.0)
    assert h.refusal(50, CALM, now=30.0) is None  # the old hedges are gone too


def test_one_long_prompt_costs_what_many_short_ones_do() -> None:
    h = Hedging(HedgeConfig(budget_share=0.1))
    h.prefill(100_000, now=0.0)
    assert h.refusal(30_000, CALM, now=0.1) is not None  # 30% of the prefill in one hedge
    assert h.refusal(9_000, CALM, now=0.1) is None


@pytest.mark.parametrize(
    ("fleet", "reason"),
    [
        (FleetNow(queued=1, units=4, unroutable=0), "overloaded: requests wait"),
        (FleetNow(queued=0, units=4, unroutable=2), "overloaded: too many units"),
    ],
)
def test_no_hedge_under_overload(fleet: FleetNow, reason: str) -> None:
    h = Hedging(HedgeConfig(max_queued=0, max_unroutable_share=0.25))
    h.prefill(10**6, now=0.0)
    why = h.refusal(10, fleet, now=0.0)
    assert why is not None and why.startswith(reason)
    assert h.refusal(10, FleetNow(queued=0, units=4, unroutable=1), now=0.0) is None


def test_no_hedge_while_attempts_fail() -> None:
    h = Hedging(HedgeConfig(max_failure_rate=0.1, budget_window=10.0))
    h.prefill(10**6, now=0.0)
    for i in range(20):
        h.attempted(failed=i < 3, now=1.0)  # 15% failed
    why = h.refusal(10, CALM, now=1.0)
    assert why is not None and why.startswith("overloaded: attempts fail")
    for _ in range(20):
        h.attempted(failed=False, now=2.0)  # 7.5%
    assert h.refusal(10, CALM, now=2.0) is None


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"min_delay": 3.0, "max_delay": 2.0}, "min_delay"),
        ({"budget_share": 1.5}, "budget_share"),
        ({"max_failure_rate": -0.1}, "max_failure_rate"),
        ({"delay_factor": 0}, "delay_factor"),
    ],
)
def test_config_errors_name_the_key_and_value(table: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"hedge": table})
    (message,) = caught.value.messages()
    assert f"[hedge].{key}" in message and str(table[key]) in message, message


def test_the_interactive_class_hedges_by_default() -> None:
    config = config_from_dict({"priority": {}})
    assert config.priority is not None
    assert {c.name: c.hedge for c in config.priority.classes} == {
        "interactive": True, "standard": False, "batch": False
    }  # fmt: skip
    assert config.hedge.enabled is False


class _Unit:
    def __init__(self) -> None:
        self.inflight = 0


async def test_the_second_copy_takes_a_free_slot_or_none() -> None:
    admission = Admission(queue_size=8, queue_timeout=1.0, retry_after=1, limit=2)
    unit = _Unit()
    assert admission.try_acquire(lambda: unit) is unit
    assert (unit.inflight, admission.inflight) == (1, 1)
    assert admission.try_acquire(lambda: None) is None  # no unit with room
    assert admission.try_acquire(lambda: unit) is unit
    assert admission.try_acquire(lambda: unit) is None  # the gateway's limit: not queued
    assert admission.queued == 0
    admission.release(unit)
    admission.release(unit)
    assert (unit.inflight, admission.inflight) == (0, 0)
