"""The control plane's state as a worker applies it, the frames it travels in, and the
reports that come back (pure parts of gateway/workers/, no processes)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gateway.config import ConfigError, UnitConfig
from gateway.config.builder import build, table
from gateway.config.proxy import GatewayConfig
from gateway.health_states import Health
from gateway.units import BitChange, UnitRegistry
from gateway.workers import frames, state
from gateway.workers.reports import PEAK_S, SILENT_AFTER, Reports
from tests.support import gateway_config

UNITS = [{"id": f"u{i}", "leader": f"http://127.0.0.1:{9000 + i}", "nodes": []} for i in range(3)]


def registries() -> tuple[UnitRegistry, UnitRegistry]:
    config = gateway_config(UNITS, health={"enabled": True}, admission={"unit_max_inflight": 5})
    return UnitRegistry(config), UnitRegistry(config)


@pytest.mark.parametrize(("total", "count"), [(5, 2), (1, 3), (0, 2), (256, 7), (7, 1)])
def test_shares_sum_to_the_cap_exactly(total: int, count: int) -> None:
    shares = [state.share(total, count, i) for i in range(count)]
    assert sum(shares) == total and max(shares) - min(shares) <= 1


def test_a_worker_mirrors_every_bit_reason_and_its_cap_share() -> None:
    control, worker = registries()
    control.set_health("u0", Health.HEALTHY, "probes ok")
    control.set_health("u1", Health.UNHEALTHY, "refused", hard=True)
    control.set_health("u2", Health.SLOW, "probe timeouts, traffic flows")
    control.set_bit("u0", "draining", True, "maintenance", "alice")
    control.units["u2"].cap = 3  # a breaker's trial cap
    control.units["u0"].tied = True  # its leader announces its starts (the prober read it)
    changes: list[BitChange] = []
    worker.on_change(changes.append)
    state.apply(worker, state.encode(control, 1), count=2, index=1)
    for unit_id, unit in control.units.items():
        mirror = worker.units[unit_id]
        assert (mirror.health, mirror.hard, mirror.draining) == (
            unit.health,
            unit.hard,
            unit.draining,
        )
        assert mirror.reasons == unit.reasons
        assert mirror.tied == unit.tied
    assert worker.units["u2"].weight == control.units["u2"].weight  # slow: lowered weight
    assert [worker.units[u].cap for u in ("u0", "u1", "u2")] == [2, 2, 1]  # 5 -> 3+2, 3 -> 2+1
    assert {c.unit.id for c in changes if c.bit == "healthy"} == {"u0", "u1", "u2"}
    # u0 draining and u1 down are out; slow u2 routes, as in the control plane
    assert [u.id for u in worker.routable("unitgate-sim")] == ["u2"]
    assert [u.id for u in control.routable("unitgate-sim")] == ["u2"]
    count = len(changes)
    state.apply(worker, state.encode(control, 2), count=2, index=1)
    assert len(changes) == count  # the same state again changes nothing


def test_units_added_and_removed_at_run_time_reach_the_mirror() -> None:
    control, worker = registries()
    control.remove("u1")
    added = build(UnitConfig, {"id": "u9", "leader": "http://127.0.0.1:9999"}, "unit")
    control.add(added)
    control.set_health("u9", Health.HEALTHY, "probes ok")
    state.apply(worker, state.encode(control, 1), count=1, index=0)
    assert sorted(worker.units) == ["u0", "u2", "u9"]
    assert worker.units["u9"].config == added
    assert worker.units["u9"].routable


def test_state_survives_its_frame() -> None:
    control, _ = registries()
    message = state.encode(control, 7)

    async def roundtrip() -> dict[str, object] | None:
        reader = asyncio.StreamReader()
        reader.feed_data(frames.encode(message))
        reader.feed_eof()
        first = await frames.read(reader)
        assert await frames.read(reader) is None  # then a clean EOF
        return first

    assert asyncio.run(roundtrip()) == message


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x00\x00", "EOF inside a frame header"),
        (b"\x00\x00\x00\x05ab", "EOF inside a frame"),
        (b"\x00\x00\x00\x02{]", "not JSON"),
        (b"\x00\x00\x00\x02[]", "not a message object"),
        (b"\xff\xff\xff\xff", "over the"),
    ],
)
def test_what_is_not_a_frame_is_refused(data: bytes, problem: str) -> None:
    async def read() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        await frames.read(reader)

    with pytest.raises(frames.FrameError, match=problem):
        asyncio.run(read())


def test_reports_merge_flowing_and_in_flight_over_workers() -> None:
    """A worker reports how long each unit's streams keep vouching (by their pace); the
    control plane counts it down while reports are due, and holds it while one is late."""
    reports = Reports()
    reports.update(0, 10.0, {"flowing": {"u0": 0.2}, "inflight": {"u0": 2}, "requests": 5})
    reports.update(1, 10.0, {"flowing": {}, "inflight": {"u0": 1, "u1": 4}, "requests": 7})
    assert reports.flowing("u0", 10.1) and not reports.flowing("u1", 10.1)
    assert not reports.flowing("u0", 10.25)  # on time, and the streams looked quiet by now
    reports.update(0, 11.0, {"flowing": {"u0": 1.0}, "inflight": {"u0": 2}, "requests": 5})
    # the next report is late (the worker's loop is behind): the horizon holds...
    assert reports.flowing("u0", 11.0 + 5.0)
    # ...until the worker has been silent for SILENT_AFTER: hung, it vouches for nothing
    assert not reports.flowing("u0", 11.0 + SILENT_AFTER)
    assert (reports.inflight("u0"), reports.inflight("u1")) == (3, 4)
    reports.forget(1)  # that worker exited: its streams went with it
    assert (reports.inflight("u0"), reports.inflight("u1")) == (2, 0)
    reports.forget(0)
    assert not reports.flowing("u0", 11.1)


def test_reports_sum_each_classs_waiting_and_in_flight_over_workers() -> None:
    """The control plane's class gauges and status page see the workers' admission."""
    reports = Reports()
    base = {"flowing": {}, "inflight": {}, "requests": 0}
    reports.update(0, 10.0, {**base, "classes": {"batch": [3, 1], "interactive": [0, 2]}})
    reports.update(1, 10.0, {**base, "classes": {"batch": [1, 1]}})
    assert reports.by_class() == {"batch": (4, 2), "interactive": (0, 2)}
    reports.forget(0)
    assert reports.by_class() == {"batch": (1, 1)}


def test_workers_config() -> None:
    assert build(GatewayConfig, {"workers": "auto"}, "gateway").worker_count >= 1
    assert build(GatewayConfig, {"workers": 3}, "gateway").worker_count == 3
    for bad in ("many", 0, 1.5, True):
        with pytest.raises(ConfigError, match=r"\[gateway\]\.workers"):
            build(GatewayConfig, {"workers": bad}, "gateway")


def test_the_config_crosses_to_a_worker_intact() -> None:
    config = gateway_config(UNITS, gateway={"workers": 2, "port": 8123})
    assert build(type(config), table(config), "") == config
    assert dataclasses.replace(config.gateway, port=0).workers == 2


def test_a_worker_takes_the_others_load_and_forgets_what_is_not_listed() -> None:
    _, worker = registries()
    worker.units["u2"].foreign = 9  # from an earlier answer
    state.apply_load(worker, {"t": "load", "others": {"u0": 4}})
    assert [worker.units[u].foreign for u in ("u0", "u1", "u2")] == [4, 0, 0]


def test_the_probers_own_count_is_the_workers_recent_peak() -> None:
    """A burst rising between reports must not make this gateway's own requests look like
    other replicas' at the leader: the probers subtract the peak of the last PEAK_S."""
    control, _ = registries()
    unit = control.units["u0"]
    reports = Reports()
    reports.update(0, 10.0, {"flowing": {}, "inflight": {"u0": 40}, "requests": 0})
    reports.update(1, 10.05, {"flowing": {}, "inflight": {"u0": 30}, "requests": 0})
    reports.update(0, 10.1, {"flowing": {}, "inflight": {"u0": 5}, "requests": 0})
    unit.inflight = 35
    assert reports.peak(unit) == 70  # 40 + 30 at 10.05
    reports.update(1, 10.1 + PEAK_S + 0.01, {"flowing": {}, "inflight": {}, "requests": 0})
    unit.inflight = 5
    assert reports.peak(unit) == 5  # the old sums have aged out


def test_reports_merge_each_units_last_progress_over_workers() -> None:
    """Asked for progress since a loop time (a follower's probe timed out while its leader
    answered), the control plane reads how long ago each worker last saw the unit's data."""
    reports = Reports()
    base = {"flowing": {}, "inflight": {}, "requests": 0}
    reports.update(0, 10.0, {**base, "progress": {"u0": 0.3}})
    reports.update(1, 10.05, {**base, "progress": {"u0": 0.02, "u1": 0.5}})
    assert reports.flowing("u0", 10.1, since=10.0)  # worker 1 saw data at 10.03
    assert not reports.flowing("u0", 10.1, since=10.04)
    assert not reports.flowing("u1", 10.1, since=9.6)
    assert not reports.flowing("u2", 10.1, since=0.0)
    reports.forget(1)
    assert not reports.flowing("u0", 10.1, since=10.0)
    reports.update(0, 10.1, {**base})  # a report without progress (an older worker's)
    assert not reports.flowing("u0", 10.2, since=0.0)
