"""Gang health end to end: real simulator processes, a real gateway, the prober deciding.

Detection times are measured from the fault to the `healthy` bit flipping (the registry's
change listener stamps it), with the default settings: every 0.25 s, 0.2 s timeout, fall 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config import UnitConfig
from gateway.health.kinds.unitgate import probe_node
from gateway.health.probe import Target
from gateway.health.supervisor import HealthSupervisor
from gateway.health_states import Health
from gateway.server import running
from gateway.upstream.pool import ConnectionPool
from tests.integration.probing import Traffic, all_probed_ok, probed, until
from tests.simunits.split import planned_units, start_part, units_toml
from tests.support import SimProcess, gateway_config, sim_stats, stop_process

# Times detection (a follower killed, ejected within 1 s): it runs alone in `make test`.
pytestmark = pytest.mark.serial

FAST = ("--ttft-ms", "5", "--itl-ms", "2", "--tokens", "8")


@dataclass
class Split:
    """u0 and u1, two nodes each; u0's follower runs alone in `lone`."""

    units: list[dict[str, Any]]
    main: SimProcess
    lone: SimProcess


@pytest.fixture
def split(tmp_path: Path) -> Iterator[Split]:
    units = planned_units([2, 2])
    config = tmp_path / "units.toml"
    config.write_text(units_toml(units))
    main = start_part(tmp_path, "main", config, "u0:0,u1:0,u1:1", *FAST)
    try:
        lone = start_part(tmp_path, "lone", config, "u0:1")
        try:
            yield Split(units, main, lone)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(lone.proc.pid, signal.SIGCONT)  # a stopped process ignores SIGTERM
            stop_process(lone.proc)
    finally:
        stop_process(main.proc)


@pytest.mark.slow
async def test_killed_follower_ejects_its_unit_within_a_second(
    split: Split, http: aiohttp.ClientSession
) -> None:
    async with probed(split.units) as p:
        await until(lambda: all_probed_ok(p), 2.0, "first probes")
        traffic = Traffic(p.gw.public_url, http)
        try:
            await until(lambda: len(traffic.sent) >= 10, 5.0, "traffic flowing")
            killed_at = asyncio.get_running_loop().time()
            split.lone.proc.kill()
            await until(lambda: not p.gw.units.units["u0"].healthy, 1.5, "u0 ejected")
            detection = p.flip_time("u0", False) - killed_at
            after = len(traffic.sent)
            await until(lambda: len(traffic.sent) >= after + 20, 5.0, "traffic after the flip")
        finally:
            await traffic.stop()
    print(f"\nSIGKILL of a follower -> unhealthy in {detection:.3f} s")
    assert detection < 1.0
    assert p.reason("u0").startswith(f"node 1 (follower {split.units[0]['nodes'][1]}): ")
    assert {status for _, status, _ in traffic.sent} == {200}
    flipped = p.flip_time("u0", False)
    assert {unit for sent, _, unit in traffic.sent if sent > flipped} == {"u1"}


@pytest.mark.slow
async def test_frozen_follower_is_ejected_and_readmitted(split: Split) -> None:
    async with probed(split.units) as p:
        await until(lambda: all_probed_ok(p), 2.0, "first probes")
        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
        os.kill(split.lone.proc.pid, signal.SIGSTOP)
        await until(lambda: not p.gw.units.units["u0"].healthy, 2.0, "u0 ejected")
        frozen = p.flip_time("u0", False) - stopped_at
        assert "no answer within 200 ms" in p.reason("u0")
        continued_at = loop.time()
        os.kill(split.lone.proc.pid, signal.SIGCONT)
        await until(lambda: p.gw.units.units["u0"].healthy, 2.0, "u0 readmitted")
        back = p.flip_time("u0", True) - continued_at
        assert p.reason("u0") == "all 2 nodes ok for 2 rounds"
    print(f"\nSIGSTOP -> unhealthy in {frozen:.3f} s; SIGCONT -> healthy in {back:.3f} s")
    assert frozen < 2.0
    assert back >= 0.25 * 0.9  # `rise` rounds, not the first good answer


@pytest.mark.slow
async def test_stalled_engine_is_ejected(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    u0 = clean_sim.units[0]
    async with probed(clean_sim.units[:2]) as p:
        await until(lambda: all_probed_ok(p), 2.0, "first probes")
        clean_sim.fault("u0", "stall", after_tokens=1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        pending = asyncio.create_task(
            http.post(u0["leader"] + "/v1/completions", json={"prompt": "x", "max_tokens": 8})
        )
        try:
            await until(lambda: not p.gw.units.units["u0"].healthy, 4.0, "u0 ejected")
            stalled = p.flip_time("u0", False) - started
            assert "engine stalled" in p.reason("u0") and "with 1 pending" in p.reason("u0")
        finally:
            pending.cancel()
            await asyncio.wait([pending], timeout=5)
        clean_sim.fault("u0", "none")
        await until(lambda: p.gw.units.units["u0"].healthy, 2.0, "u0 back once the request left")
    print(f"\nstalled engine -> unhealthy {stalled:.3f} s after the request was sent")
    assert (await sim_stats(http, clean_sim, "u0"))["in_flight"] == 0


async def test_miswired_nodes_are_named(clean_sim: SimProcess) -> None:
    u0, u1, u2 = (dict(u) for u in clean_sim.units)
    stray, leader = u1["nodes"][1], u1["nodes"][0]
    u0["nodes"] = [u0["nodes"][0], stray]  # u1's follower, configured as u0's
    u1["nodes"] = [leader, leader]  # the leader, configured as rank 1
    async with probed([u0, u1, u2]) as p:
        units = p.gw.units.units
        out = Health.UNHEALTHY
        await until(lambda: units["u0"].health is out and units["u1"].health is out, 2.0, "out")
        await until(lambda: units["u2"].healthy, 2.0, "u2 judged")
        assert units["u0"].hard and units["u1"].hard
        assert p.reason("u0") == (f"node 1 (follower {stray}): reports unit u1, expected u0")
        assert p.reason("u1") == (f"node 1 (follower {u1['nodes'][0]}): reports rank 0, expected 1")
        assert units["u2"].healthy and units["u0"].nodes[1].error == "reports unit u1, expected u0"


async def test_node_health_modes_flip_the_unit(clean_sim: SimProcess) -> None:
    async with probed(clean_sim.units[:2]) as p:
        unit = p.gw.units.units["u0"]
        await until(lambda: all_probed_ok(p), 2.0, "first probes")
        for mode, reason in (
            ("unhealthy", "HTTP 503 (status unhealthy)"),
            # Soft evidence, but nothing flows on the unit to vouch for it.
            (
                "unresponsive",
                "no answer within 200 ms; no live traffic on the unit to vouch for it",
            ),
        ):
            clean_sim.post("/units/u0/nodes/1/health", {"mode": mode})
            await until(lambda: not unit.healthy, 1.5, f"{mode} ejects")
            assert p.reason("u0") == f"node 1 (follower {unit.config.nodes[1]}): {reason}"
            clean_sim.post("/units/u0/nodes/1/health", {"mode": "ok"})
            await until(lambda: unit.healthy, 1.5, f"{mode} then ok readmits")
        whats = [e.what for e in p.events.recent(unit="u0")]
        assert whats == ["healthy", "unhealthy", "healthy", "unhealthy", "healthy"]
        assert p.gw.units.units["u1"].healthy
        text = p.gw.metrics.render().decode()
    assert 'unitgate_health_transitions_total{to="unhealthy",unit="u0"} 2.0' in text
    assert 'unitgate_probe_failures_total{rank="1",unit="u0"}' in text
    assert 'unitgate_unit_healthy{unit="u0"} 1.0' in text


async def test_failed_canary_ejects_the_unit(clean_sim: SimProcess) -> None:
    async with probed(clean_sim.units[:2], canary_every=1) as p:
        await until(lambda: all_probed_ok(p), 2.0, "first probes")
        clean_sim.fault("u0", "error", status=500)
        await until(lambda: not p.gw.units.units["u0"].healthy, 2.0, "u0 ejected")
        assert p.reason("u0").startswith("canary completion failed: HTTP 500")
        clean_sim.fault("u0", "none")
        await until(lambda: p.gw.units.units["u0"].healthy, 2.0, "u0 readmitted")


async def test_unit_added_at_run_time_is_probed_and_removed_unit_unprobed(
    clean_sim: SimProcess,
) -> None:
    u2 = clean_sim.units[2]
    async with probed(clean_sim.units[:2]) as p:
        registry = p.gw.units
        await until(lambda: all_probed_ok(p), 2.0, "first probes")
        clean_sim.post("/units/u2/nodes/1/health", {"mode": "unhealthy"})
        added = registry.add(UnitConfig(id="u2", leader=u2["leader"], nodes=tuple(u2["nodes"])))
        probed_in = await until(lambda: added.nodes[1].healthy is False, 1.0, "probed at once")
        samples = p.gw.metrics.registry
        labels = {"unit": "u2", "rank": "1"}
        await until(
            lambda: (samples.get_sample_value("unitgate_probe_failures_total", labels) or 0) >= 3,
            2.0,
            "three failed rounds",
        )
        assert not added.routable and added not in registry.routable("unitgate-sim")
        loop = asyncio.get_running_loop()
        fixed_at = loop.time()
        clean_sim.post("/units/u2/nodes/1/health", {"mode": "ok"})
        await until(lambda: added.routable, 2.0, "routable after passing probes")
        # Never routable before, so its first good round lets it in (no `rise` rounds).
        assert p.reason("u2") == "first probe round: all 2 nodes ok"
        assert p.flip_time("u2", True) - fixed_at < 0.25 * 1.1 + 0.2
        task = p.health.task("u2")
        assert task is not None
        registry.remove("u2")
        await until(task.done, 1.0, "prober of the removed unit ends")
        assert p.health.task("u2") is None
    print(f"\nunit added at run time: first probe answered after {probed_in:.3f} s")


async def test_disabled_health_starts_nothing(clean_sim: SimProcess) -> None:
    async with running(gateway_config(clean_sim.units[:1])) as gw:
        supervisor = HealthSupervisor(gw.config, gw.units, gw.health_signals)
        await supervisor.start()
        assert not supervisor.running and supervisor.task("u0") is None
        await supervisor.stop()


async def test_a_timed_out_or_cancelled_probe_closes_its_connection() -> None:
    loop = asyncio.get_running_loop()
    closed: list[asyncio.Event] = []

    class Silent(asyncio.Protocol):  # accepts, reads, never answers
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            closed.append(asyncio.Event())

        def connection_lost(self, exc: Exception | None) -> None:
            closed[-1].set()

    server = await loop.create_server(Silent, "127.0.0.1", 0)
    pool = ConnectionPool(1.0, 30.0, 0)
    target = Target(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        report = await probe_node(pool, target, 0.05)
        assert report.error == "no answer within 50 ms" and report.latency_ms is None
        await asyncio.wait_for(closed[0].wait(), 1.0)
        task = asyncio.create_task(probe_node(pool, target, 5.0))
        await until(lambda: len(closed) == 2, 1.0, "second probe connected")
        task.cancel()
        await asyncio.wait([task], timeout=1.0)
        assert task.cancelled()
        await asyncio.wait_for(closed[1].wait(), 1.0)
    finally:
        pool.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), 5.0)
