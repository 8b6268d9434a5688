"""The prober's task over time (the harness of test_prober.py, in
tests/gateway/health/prober_support.py): rounds repeat every interval, a round that raises does
not end it, cancelling it ends it at once, and the supervisor starts one per unit and ends them
(on stop, or when a unit is removed), each ending cleanly with no task left behind."""

from __future__ import annotations

import asyncio
import logging
from random import Random
from typing import Any

import pytest

from gateway.health.supervisor import HealthSupervisor
from gateway.health.verdict import Round
from gateway.health_states import Health
from gateway.observability.events import EventLog
from gateway.observability.health_observers import health_signals
from gateway.observability.metrics import Metrics
from gateway.units import UnitRegistry
from tests.gateway.health import prober_support
from tests.gateway.health.prober_support import Build, Node, config, served
from tests.gateway.servers import RawServer, never, until

# The shared fixture (prober_support.rigs), registered in this module: the dispatcher tests
# have a `rigs` of their own, so it cannot live in tests/gateway/conftest.py.
rigs = prober_support.rigs


def assert_no_tasks_left() -> None:
    """Only the test's own task runs (and the test servers' connection handlers)."""
    ours = {asyncio.current_task()}
    left = [t for t in asyncio.all_tasks() - ours if not _aiohttp_server_task(t)]
    assert left == []


def _aiohttp_server_task(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/aiohttp/" in code.co_filename


async def test_rounds_repeat_every_interval_until_cancelled(rigs: Build) -> None:
    leader = Node(0)
    async with served(leader) as urls:
        rig = rigs(urls, interval=0.02)
        loop = asyncio.get_running_loop()
        start = loop.time()
        task = asyncio.create_task(rig.prober.run(first_after=0.0))
        await until(lambda: rig.prober.rounds >= 3, 2.0, "three rounds")
        # Start to start one interval apart: not a busy loop.
        assert loop.time() - start >= 2 * 0.02 - 0.005
        assert rig.unit.health is Health.HEALTHY
        task.cancel()
        await asyncio.wait([task], timeout=1.0)
        assert task.cancelled()
        assert_no_tasks_left()


async def test_a_prober_cancelled_mid_probe_ends_at_once_and_closes_its_connection(
    rigs: Build,
) -> None:
    async with RawServer(never) as silent:
        rig = rigs([silent.url], timeout=5.0)
        task = asyncio.create_task(rig.prober.run())
        await until(lambda: bool(silent.peers and silent.peers[0].requests), 1.0, "probed")
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=1.0)
        assert task in done and task.cancelled()
        await asyncio.wait_for(silent.peers[0].closed.wait(), 1.0)
        assert rig.prober.rounds == 0 and rig.unit.health is Health.UNKNOWN
        assert_no_tasks_left()


async def test_a_round_that_raises_does_not_end_the_prober(
    rigs: Build, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with served(Node(0)) as urls:
        rig = rigs(urls, interval=0.01)
        real = rig.prober.probe_round
        calls = 0

        async def flaky() -> Round:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug")
            return await real()

        monkeypatch.setattr(rig.prober, "probe_round", flaky)
        with caplog.at_level(logging.ERROR, "unitgate.health"):
            task = asyncio.create_task(rig.prober.run())
            await until(lambda: rig.unit.health is Health.HEALTHY, 2.0, "a later round")
        assert not task.done()
        assert "prober of unit u0: probe round failed" in caplog.text
        task.cancel()
        await asyncio.wait([task], timeout=1.0)
        assert task.cancelled()


async def test_the_supervisor_starts_a_prober_per_unit_and_stop_ends_them_all() -> None:
    async with served(Node(0)) as urls:
        c = config(urls, interval=0.02)
        registry = UnitRegistry(c)
        supervisor = HealthSupervisor(
            c, registry, health_signals(EventLog(), Metrics(registry, lambda: 0)), Random(0)
        )
        await supervisor.start()
        task = supervisor.task("u0")
        assert task is not None and not task.done()
        await until(lambda: registry.units["u0"].healthy, 2.0, "probed healthy")
        await supervisor.stop()
        assert task.cancelled()
        assert not supervisor.running
        assert supervisor.task("u0") is None
        assert_no_tasks_left()


async def test_removing_a_unit_ends_its_prober() -> None:
    async with served(Node(0)) as urls:
        c = config(urls, interval=0.02)
        registry = UnitRegistry(c)
        async with HealthSupervisor(
            c, registry, health_signals(EventLog(), Metrics(registry, lambda: 0))
        ) as sup:
            task = sup.task("u0")
            assert task is not None
            registry.remove("u0")
            await until(task.done, 1.0, "the removed unit's prober ends")
            assert task.cancelled() and sup.task("u0") is None
        assert_no_tasks_left()
