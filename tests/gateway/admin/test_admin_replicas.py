"""The fleet-wide drain rule, on reports alone: no Redis, no clock but the one passed in."""

from __future__ import annotations

import pytest

from gateway.admin.replicas import Fleet, Heartbeat, Report, decode, encode, fleet_unit, writer
from gateway.admin.shared import SharedStore
from gateway.config.state import StateConfig


def report(name: str, version: int, at: float = 100.0, **inflight: int) -> Report:
    return Report(name, version, at, inflight)


def test_quiet_needs_every_replica_current_and_idle() -> None:
    reports = {"a": report("a", 7), "b": report("b", 7, u0=2, u1=1)}
    assert (
        fleet_unit(reports, "u0", 7, 100.0).in_flight,
        fleet_unit(reports, "u0", 7, 100.0).quiet,
    ) == (2, False)
    assert fleet_unit(reports, "u2", 7, 100.0).quiet is True
    # b counted 0 on u2 before it applied version 8 (the drain): it may still admit there.
    assert fleet_unit(reports, "u2", 8, 100.0).quiet is False
    ahead = {"a": report("a", 8), "b": report("b", 9)}
    assert fleet_unit(ahead, "u0", 8, 100.0).quiet is True


def test_per_replica_view_and_ages() -> None:
    fleet = Fleet(3, {"b": report("b", 3, 99.5, u0=1), "a": report("a", 2, 101.0)}, 100.0)
    unit = fleet.unit("u0")
    assert list(unit.replicas) == ["a", "b"]
    assert unit.replicas["b"] == {"in_flight": 1, "version": 3, "age_s": 0.5}
    assert unit.replicas["a"]["age_s"] == 0.0  # a clock ahead of ours is not a negative age
    assert (unit.current, unit.in_flight) == (False, 1)


def test_reports_round_trip_and_junk_is_refused() -> None:
    original = report("a", 5, 12.5, u0=3)
    assert decode("a", encode(original)) == original
    with pytest.raises(ValueError):
        decode("a", b"not json")


def test_one_name_shared_by_two_live_gateways_is_logged_but_a_restart_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = StateConfig(replica="r")
    beat = Heartbeat(SharedStore(config), config, lambda: (0, {}))
    mine = writer(encode(beat.now(), beat._instance))
    beat._check_name("the-crashed-process")  # the first beat after a restart
    beat._check_name(mine)
    assert "another gateway" not in caplog.text
    for _ in range(3):  # someone else keeps writing under the name
        beat._check_name("other")
    assert caplog.text.count("another gateway reports as replica 'r'") == 1
    assert writer(b"junk") is None and writer(None) is None
