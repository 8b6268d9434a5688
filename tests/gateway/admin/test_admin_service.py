"""Admin actions on the registry: only the admin's bits, never routable mid-change, saved first."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.admin.errors import AdminError, AdminStartError
from gateway.admin.service import AdminService
from gateway.admin.state import AddedUnit
from gateway.admin.store import Store, StoreError
from gateway.config import config_from_dict
from gateway.health_states import Health
from gateway.observability.events import EventLog
from gateway.units import BitChange, UnitRegistry

UNITS = [{"id": f"u{i}", "leader": f"http://127.0.0.1:{9000 + i}"} for i in range(3)]


def make(**unit_overrides: object) -> tuple[AdminService, UnitRegistry, EventLog]:
    units = [dict(u, **unit_overrides) if u["id"] == "u2" else u for u in UNITS]
    config = config_from_dict({"gateway": {"models": ["m"]}, "units": units})
    registry = UnitRegistry(config)
    for unit_id in registry.units:  # judged by a prober that is not part of these tests
        registry.set_health(unit_id, Health.HEALTHY, "probed ok")
    events = EventLog(clock=lambda: 100.0)
    return AdminService(config, registry, events, clock=lambda: 42.0), registry, events


async def test_never_routable_between_the_two_bits() -> None:
    service, registry, _ = make()
    seen: list[tuple[str, bool, bool]] = []

    def watch(change: BitChange) -> None:
        seen.append((change.bit, change.value, change.unit.routable))

    registry.on_change(watch)
    for state in ("draining", "disabled", "draining", "enabled", "disabled", "enabled"):
        await service.set_state("u0", state, "r", "alice")  # type: ignore[arg-type]
        assert registry.units["u0"].routable is (state == "enabled")
    # Only the last change of each action may make the unit routable.
    routable_after = [r for _, _, r in seen]
    assert routable_after.count(True) == 2
    assert {bit for bit, _, _ in seen} == {"enabled", "draining"}


async def test_enable_does_not_override_probe_health() -> None:
    service, registry, _ = make()
    registry.set_health("u1", Health.UNHEALTHY, "probe failed", hard=True)
    await service.set_state("u1", "disabled", "maint", "alice")
    await service.set_state("u1", "enabled", "", "alice")
    unit = registry.units["u1"]
    assert unit.enabled and not unit.draining and not unit.healthy and not unit.routable
    assert unit.reasons["healthy"] == "probe failed"


async def test_repeating_the_current_state_changes_nothing() -> None:
    service, _, events = make()
    await service.set_state("u0", "disabled", "first", "alice")
    await service.set_state("u0", "disabled", "second", "bob")
    assert service.marks["u0"].reason == "first"
    assert [e.what for e in events.recent()] == ["disable"]


async def test_a_unit_disabled_in_the_config_starts_disabled() -> None:
    service, registry, _ = make(enabled=False)
    assert service.marks["u2"].state == "disabled" and service.marks["u2"].who == "config"
    assert not registry.units["u2"].routable


async def test_a_failed_save_changes_nothing(tmp_path: Path) -> None:
    service, registry, events = make()
    path = tmp_path / "s.sqlite3"
    store = await Store.open(path)
    await service.restore(store)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE marks")
    db.close()
    with pytest.raises(StoreError):
        await service.set_state("u0", "disabled", "maint", "alice")
    assert registry.units["u0"].routable and service.marks["u0"].state == "enabled"
    assert events.recent() == []
    await store.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("u9", "must be a JSON object"),
        ({"id": "u9"}, "missing required key [body].leader"),
        ({"id": "u9", "leader": "http://h:1", "models": ["m", "x"]}, "['x'] are not served"),
        ({"id": "u 9", "leader": "http://h:1"}, "[body].id"),
        ({"id": "u9", "leader": "http://h:1", "max_inflight": 0}, "[body].max_inflight"),
    ],
)
async def test_add_rejects_bad_units(body: object, message: str) -> None:
    service, registry, _ = make()
    with pytest.raises(AdminError) as caught:
        await service.add(body, "alice")
    assert caught.value.status == 400 and message in caught.value.message
    assert set(registry.units) == {"u0", "u1", "u2"}


async def test_restore_applies_every_override_once(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    service, _, _ = make()
    await service.restore(await Store.open(path))
    await service.add({"id": "u9", "leader": "http://h:1", "max_inflight": None}, "bob")
    await service.set_state("u9", "draining", "new", "bob")
    await service.remove("u1", "alice")
    await service.set_state("u0", "disabled", "disk", "alice")
    await service.set_state("u2", "draining", "", "carol")
    await service.set_state("u2", "enabled", "", "carol")  # as configured: nothing saved

    service, registry, events = make()
    await service.restore(await Store.open(path))
    assert sorted(registry.units) == ["u0", "u2", "u9"]
    assert service.marks["u9"].state == "draining" and not registry.units["u9"].healthy
    assert (service.marks["u0"].reason, service.marks["u0"].since) == ("disk", 42.0)
    restored = sorted((e.unit, e.reason, e.who) for e in events.recent())
    assert restored == [
        ("u0", "disabled: disk", "alice"),
        ("u1", "removed", "alice"),
        ("u9", "added, leader http://h:1", "bob"),
        ("u9", "draining: new", "bob"),
    ]


async def test_a_saved_unit_that_no_longer_validates_is_a_start_error(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = await Store.open(path)
    await store.add(
        "u9", AddedUnit({"id": "u9", "leader": "http://h:1", "models": ["gone"]}, "b", 1)
    )
    service, _, _ = make()
    with pytest.raises(AdminStartError, match=r"s\.sqlite3: saved unit u9: .*'gone'"):
        await service.restore(store)
    await store.close()


async def test_the_config_file_wins_over_a_saved_unit_of_the_same_id(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.sqlite3")
    await store.add("u1", AddedUnit({"id": "u1", "leader": "http://other:1"}, "bob", 1.0))
    service, registry, _ = make()
    await service.restore(store)
    assert registry.units["u1"].leader == "http://127.0.0.1:9001"
    await store.close()
