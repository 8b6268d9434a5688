"""The registry's routing snapshot: unknown until judged, slow at a lower weight, panic routing."""

from __future__ import annotations

from typing import Any

from gateway.config import config_from_dict
from gateway.health_states import Health
from gateway.units import PanicChange, UnitRegistry


def registry(n: int = 4, **health: Any) -> UnitRegistry:
    units = [{"id": f"u{i}", "leader": f"http://127.0.0.1:{9000 + i}"} for i in range(n)]
    config = config_from_dict({"gateway": {"models": ["m"]}, "health": health, "units": units})
    return UnitRegistry(config)


def routed(reg: UnitRegistry) -> list[str]:
    return sorted(u.id for u in reg.routable("m"))


def all_healthy(reg: UnitRegistry) -> UnitRegistry:
    for unit_id in reg.units:
        reg.set_health(unit_id, Health.HEALTHY, "ok")
    return reg


def test_units_are_unknown_and_unroutable_until_a_round_judges_them() -> None:
    reg = registry()
    assert all(u.health is Health.UNKNOWN for u in reg.units.values())
    assert not reg.any_routable() and reg.panic == {}
    assert reg.units["u0"].reasons["healthy"] == "waiting for its first probe round"
    reg.set_health("u2", Health.HEALTHY, "first probe round: all 1 nodes ok")
    assert routed(reg) == ["u2"]


def test_without_probers_units_start_healthy() -> None:
    assert routed(registry(enabled=False)) == ["u0", "u1", "u2", "u3"]


def test_a_slow_unit_stays_routable_at_a_lower_weight() -> None:
    reg = all_healthy(registry(slow_weight=0.25))
    reg.set_health("u1", Health.SLOW, "probes time out while its traffic flows")
    assert routed(reg) == ["u0", "u1", "u2", "u3"]
    assert reg.units["u1"].weight == 0.25 and reg.units["u0"].weight == 1.0
    reg.set_health("u1", Health.HEALTHY, "ok")
    assert reg.units["u1"].weight == 1.0


def test_a_slow_unit_keeps_its_share_of_the_slow_weight() -> None:
    """On probation a unit keeps only a share of slow_weight (routing/overtaken.py); the share
    follows each round, and weighs only while the unit is slow."""
    reg = all_healthy(registry(slow_weight=0.25))
    reg.set_slow_share("u1", 0.08)
    assert reg.units["u1"].weight == 1.0  # healthy: the share waits
    reg.set_health("u1", Health.SLOW, "on probation")
    assert reg.units["u1"].weight == 0.02
    before = reg.snapshot
    reg.set_slow_share("u1", 0.5)
    assert reg.units["u1"].weight == 0.125 and reg.snapshot is not before  # swapped
    same = reg.snapshot
    reg.set_slow_share("u1", 0.5)
    assert reg.snapshot is same  # nothing changed: nothing swapped
    reg.set_health("u1", Health.HEALTHY, "ok")
    assert reg.units["u1"].weight == 1.0


def test_panic_routes_across_units_out_for_soft_reasons_or_by_their_breaker() -> None:
    reg = all_healthy(registry())
    changes: list[PanicChange] = []
    reg.on_panic(changes.append)
    reg.set_health("u0", Health.UNHEALTHY, "timeouts, nothing flowing", hard=False)
    reg.set_bit("u1", "admitting", False, "5 consecutive failures", "breaker")
    assert routed(reg) == ["u2", "u3"] and not changes  # 2 of 4: at the threshold, not below
    reg.set_health("u2", Health.UNHEALTHY, "connection refused", hard=True)
    # 1 of 4 routable: the soft-out u0 and the ejected u1 come back, the refused u2 does not.
    assert routed(reg) == ["u0", "u1", "u3"]
    assert [(c.model, c.active) for c in changes] == [("m", True)]
    assert reg.units["u0"].panicked and not reg.units["u3"].panicked
    assert not reg.units["u2"].panicked
    assert "1 of 4 units in service routable" in reg.panic["m"]
    reg.set_health("u2", Health.HEALTHY, "ok")
    assert routed(reg) == ["u2", "u3"] and reg.panic == {}
    assert [(c.model, c.active) for c in changes] == [("m", True), ("m", False)]
    assert not reg.units["u0"].panicked


def test_panic_counts_units_in_service_only_and_never_brings_back_unknown_ones() -> None:
    reg = registry()
    reg.set_health("u0", Health.HEALTHY, "ok")
    reg.set_health("u1", Health.UNHEALTHY, "timeouts", hard=False)
    # u2 and u3 are unknown: never judged, so not brought back, yet they count as in service.
    assert routed(reg) == ["u0", "u1"] and "m" in reg.panic
    reg.set_bit("u2", "enabled", False, "maintenance", "ops")
    reg.set_bit("u3", "draining", True, "maintenance", "ops")
    assert routed(reg) == ["u0"] and reg.panic == {}  # 1 of 2 in service: not below half


def test_panic_threshold_zero_turns_it_off() -> None:
    reg = all_healthy(registry(panic_threshold=0.0))
    for unit_id in reg.units:
        reg.set_health(unit_id, Health.UNHEALTHY, "timeouts", hard=False)
    assert routed(reg) == [] and reg.panic == {}


def test_a_hard_fleet_outage_is_not_papered_over() -> None:
    reg = all_healthy(registry())
    for unit_id in reg.units:
        reg.set_health(unit_id, Health.UNHEALTHY, "connection refused", hard=True)
    assert routed(reg) == [] and not reg.any_routable() and reg.panic == {}
