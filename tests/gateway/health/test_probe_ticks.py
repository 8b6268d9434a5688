"""The probers' shared wake-ups (gateway/health/ticks.py): the plan on its own (pure), the
ticks on a real event loop, and the supervisor's probers sharing them."""

from __future__ import annotations

import asyncio
import math
from random import Random

import pytest

from gateway.config import config_from_dict
from gateway.health.supervisor import HealthSupervisor
from gateway.health.ticks import ProbeTicks, TickPlan
from gateway.observability.events import EventLog
from gateway.observability.health_observers import health_signals
from gateway.observability.metrics import Metrics
from gateway.units import UnitRegistry
from tests.gateway.health.prober_support import MODEL, Node, served
from tests.gateway.servers import until

CLOCK_S = 0.001  # uvloop's timer resolution

# -- the plan --------------------------------------------------------------------------------


def test_a_round_with_no_tick_in_its_window_plans_one_at_its_target() -> None:
    plan = TickPlan(cap=4)
    assert plan.choose(10.0, 11.0, 10.4) == (10.4, True)
    assert plan.choose(12.0, 13.0, 12.5) == (12.5, True)  # 10.4 lies outside [12, 13]
    assert len(plan) == 2 and plan.waiting(10.4) == plan.waiting(12.5) == 1


def test_a_round_joins_the_planned_tick_nearest_its_target() -> None:
    plan = TickPlan(cap=4)
    plan.choose(10.0, 10.2, 10.1)
    plan.choose(10.5, 10.7, 10.6)
    assert plan.choose(10.0, 11.0, 10.45) == (10.6, False)  # 0.15 away, not 0.35
    assert plan.choose(10.0, 11.0, 10.3) == (10.1, False)
    assert plan.waiting(10.1) == plan.waiting(10.6) == 2 and len(plan) == 2


def test_a_window_edge_counts_as_inside() -> None:
    plan = TickPlan(cap=4)
    plan.choose(10.0, 10.0, 10.0)
    assert plan.choose(9.0, 10.0, 9.0) == (10.0, False)
    assert plan.choose(10.0, 11.0, 11.0) == (10.0, False)


def test_a_full_tick_is_passed_over() -> None:
    plan = TickPlan(cap=2)
    plan.choose(10.0, 11.0, 10.5)
    assert plan.choose(10.0, 11.0, 10.6) == (10.5, False)
    assert plan.choose(10.0, 11.0, 10.7) == (10.7, True)  # 10.5 has its two
    assert plan.choose(10.0, 11.0, 10.5) == (10.7, False)  # the nearest with room


def test_a_new_tick_at_a_full_ticks_very_time_comes_just_after_it() -> None:
    plan = TickPlan(cap=1)
    plan.choose(10.0, 11.0, 10.5)
    when, new = plan.choose(10.0, 11.0, 10.5)
    assert new and when == math.nextafter(10.5, math.inf)
    assert plan.waiting(10.5) == plan.waiting(when) == 1


def test_the_target_is_clamped_to_the_window() -> None:
    plan = TickPlan()
    assert plan.choose(10.0, 11.0, 12.0) == (11.0, True)
    assert plan.choose(13.0, 14.0, 12.0) == (13.0, True)


def test_leaving_and_firing_forget_the_tick() -> None:
    plan = TickPlan(cap=4)
    plan.choose(10.0, 11.0, 10.5)
    plan.choose(10.0, 11.0, 10.6)
    assert plan.leave(10.5) is False and plan.waiting(10.5) == 1
    assert plan.leave(10.5) is True and plan.waiting(10.5) == 0 and len(plan) == 0
    plan.choose(10.0, 11.0, 10.2)
    plan.fired(10.2)
    assert len(plan) == 0
    assert plan.choose(10.0, 11.0, 10.7) == (10.7, True)  # nothing stale is joined
    plan.fired(99.0)  # no such tick: nothing happens
    assert len(plan) == 1


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="cap must be at least 1, not 0"):
        TickPlan(cap=0)
    with pytest.raises(ValueError, match="an empty window"):
        TickPlan().choose(11.0, 10.0, 10.5)


# -- on the event loop -----------------------------------------------------------------------


async def test_rounds_whose_windows_overlap_wake_on_one_timer() -> None:
    loop = asyncio.get_running_loop()
    ticks = ProbeTicks(loop)
    t = loop.time()
    woke: dict[str, float] = {}

    async def round_(name: str, lo: float, hi: float, target: float) -> None:
        await ticks.sleep_within(t + lo, t + hi, t + target)
        woke[name] = loop.time()

    a = asyncio.create_task(round_("a", 0.02, 0.06, 0.03))
    await asyncio.sleep(0)
    b = asyncio.create_task(round_("b", 0.025, 0.08, 0.07))
    await asyncio.sleep(0)
    assert len(ticks) == 1  # b joined a's tick
    await asyncio.wait_for(asyncio.gather(a, b), 2.0)
    assert ticks.fired == 1 and ticks.woken == 2 and len(ticks) == 0
    # Not before the shared tick's time (0.03 s). uvloop runs its timers on libuv's
    # whole-millisecond clock, so one may fire up to a millisecond before a float deadline
    # (CI saw one wake less than half a millisecond early); that much is allowed.
    assert min(woke.values()) >= t + 0.03 - CLOCK_S


async def test_a_full_tick_makes_the_next_round_plan_its_own() -> None:
    loop = asyncio.get_running_loop()
    ticks = ProbeTicks(loop, cap=1)
    t = loop.time()
    rounds = [asyncio.create_task(ticks.sleep_within(t + 0.01, t + 0.05, t + 0.02)) for _ in "ab"]
    await asyncio.sleep(0)
    assert len(ticks) == 2
    await asyncio.wait_for(asyncio.gather(*rounds), 2.0)
    assert ticks.fired == 2 and ticks.woken == 2


async def test_a_window_already_past_returns_at_once_without_a_tick() -> None:
    loop = asyncio.get_running_loop()
    ticks = ProbeTicks(loop)
    t = loop.time()
    await asyncio.wait_for(ticks.sleep_within(t - 0.2, t - 0.1, t - 0.15), 1.0)
    assert len(ticks) == 0 and ticks.fired == 0


async def test_cancelled_rounds_leave_their_tick_and_the_last_one_cancels_its_timer() -> None:
    loop = asyncio.get_running_loop()
    ticks = ProbeTicks(loop)
    t = loop.time()
    a = asyncio.create_task(ticks.sleep_within(t + 5.0, t + 6.0, t + 5.5))
    b = asyncio.create_task(ticks.sleep_within(t + 5.0, t + 6.0, t + 5.6))
    await asyncio.sleep(0)
    assert len(ticks) == 1 and ticks.plan.waiting(t + 5.5) == 2
    a.cancel()
    await asyncio.wait([a], timeout=1.0)
    assert a.cancelled() and len(ticks) == 1 and ticks.plan.waiting(t + 5.5) == 1
    b.cancel()
    await asyncio.wait([b], timeout=1.0)
    assert b.cancelled() and len(ticks) == 0 and len(ticks.plan) == 0
    assert ticks.fired == 0


async def test_close_cancels_every_waiting_round() -> None:
    loop = asyncio.get_running_loop()
    ticks = ProbeTicks(loop)
    t = loop.time()
    rounds = [asyncio.create_task(ticks.sleep_within(t + 5.0, t + 6.0, t + 5.5)) for _ in "ab"]
    await asyncio.sleep(0)
    ticks.close()
    done, _ = await asyncio.wait(rounds, timeout=1.0)
    assert done == set(rounds) and all(r.cancelled() for r in rounds)
    assert len(ticks) == 0 and len(ticks.plan) == 0


# -- the supervisor's probers ----------------------------------------------------------------


async def test_the_supervisors_probers_share_wake_ups() -> None:
    """Two units whose windows (0.05 s +- 50%) always overlap: after the first rounds, both
    units' rounds start on one tick, so about half as many ticks fire as rounds start."""
    async with served(Node(0), Node(0)) as urls:
        c = config_from_dict(
            {
                "gateway": {"models": [MODEL]},
                "units": [{"id": f"u{i}", "leader": u, "nodes": [u]} for i, u in enumerate(urls)],
                "health": {"enabled": True, "timeout": 1.0, "interval": 0.05, "jitter": 0.5},
            }
        )
        registry = UnitRegistry(c)
        supervisor = HealthSupervisor(
            c, registry, health_signals(EventLog(), Metrics(registry, lambda: 0)), Random(0)
        )
        await supervisor.start()
        ticks = supervisor.ticks
        assert ticks is not None
        try:
            await until(lambda: ticks.woken >= 30, 10.0, "30 rounds woken by ticks")
            assert ticks.fired <= 0.7 * ticks.woken, (ticks.fired, ticks.woken)
        finally:
            await supervisor.stop()
        assert len(ticks) == 0
