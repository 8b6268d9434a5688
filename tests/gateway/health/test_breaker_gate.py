"""The breaker gate on a real event loop: bits, trial cap, the ejection timer, events."""

from __future__ import annotations

import asyncio

from gateway.config import config_from_dict
from gateway.health.gate import BreakerGate
from gateway.observability.events import EventLog
from gateway.observability.health_observers import health_signals
from gateway.observability.metrics import Metrics
from gateway.units import UnitRegistry

UNITS = [{"id": f"u{i}", "leader": f"http://127.0.0.1:{9000 + i}"} for i in range(4)]


def make(**breaker: object) -> tuple[BreakerGate, UnitRegistry, EventLog]:
    config = config_from_dict(
        {"units": UNITS, "admission": {"unit_max_inflight": 50}, "breaker": breaker}
    )
    registry = UnitRegistry(config)
    events = EventLog()
    gate = BreakerGate(config, registry, health_signals(events, Metrics(registry, lambda: 0)))
    gate.start()
    return gate, registry, events


async def until(predicate, within: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_trip_eject_probe_recover() -> None:
    gate, registry, events = make(consecutive_failures=3, base_ejection=0.05, probe_requests=2)
    unit = registry.units["u0"]
    now = asyncio.get_running_loop().time
    for _ in range(3):
        gate.record(unit, False, now())
    assert not unit.admitting and not unit.routable
    assert unit.reasons["admitting"] == "3 consecutive failures"
    await until(lambda: unit.admitting)  # the timer moved it to probing
    assert gate.view("u0")["state"] == "probing"
    assert unit.cap == 2  # only trial requests
    gate.record(unit, True, now())
    gate.record(unit, True, now())
    assert gate.view("u0")["state"] == "admitting" and unit.cap == 50
    whats = [e.what for e in events.recent(unit="u0")]
    assert whats == ["breaker ejected", "breaker probing", "breaker admitting"]
    gate.stop()


async def test_failed_trial_ejects_again_with_longer_backoff() -> None:
    gate, registry, _ = make(consecutive_failures=1, base_ejection=0.05)
    unit = registry.units["u1"]
    now = asyncio.get_running_loop().time
    gate.record(unit, False, now())
    await until(lambda: unit.admitting)
    gate.record(unit, False, now())
    assert not unit.admitting
    view = gate.view("u1")
    assert view["state"] == "ejected" and view["consecutive_ejections"] == 2
    assert 0.05 < view["ejection_left"] <= 0.1 + 1e-6  # type: ignore[operator]
    gate.stop()


async def test_panic_cap_keeps_half_the_fleet() -> None:
    gate, registry, events = make(consecutive_failures=1, base_ejection=10.0)
    now = asyncio.get_running_loop().time
    for unit in registry.units.values():
        gate.record(unit, False, now())
    assert sum(not u.admitting for u in registry.units.values()) == 2
    assert any(e.what == "ejection suppressed" for e in events.recent())
    gate.stop()


async def test_outcomes_from_before_an_ejection_are_ignored() -> None:
    gate, registry, _ = make(consecutive_failures=1, base_ejection=0.05, probe_requests=1)
    unit = registry.units["u2"]
    loop = asyncio.get_running_loop()
    old_request = loop.time()
    gate.record(unit, False, loop.time())
    await until(lambda: unit.admitting)
    gate.record(unit, True, old_request)  # began before the ejection: not a trial
    assert gate.view("u2")["state"] == "probing"
    gate.stop()


async def test_removed_unit_is_forgotten() -> None:
    gate, registry, _ = make(consecutive_failures=1)
    unit = registry.remove("u3")
    gate.record(unit, False, asyncio.get_running_loop().time())  # in flight across the removal
    assert "u3" not in registry.units
    gate.stop()
