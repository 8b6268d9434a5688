"""The prober built on its own (no gateway): rounds over a unit's nodes on real `/health`
servers on 127.0.0.1, what a refused, silent, failing or misidentified node makes of a round,
the canary, the flip applied once, and the prober's task ending cleanly when stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.config import Config, config_from_dict
from gateway.health.probe import Target, probe_node
from gateway.health.prober import UnitProber
from gateway.health.states import Health, Outcome
from gateway.health.supervisor import HealthSupervisor
from gateway.health.verdict import Flip, Round
from gateway.observability.events import EventLog
from gateway.observability.metrics import Metrics
from gateway.proxy.connection import ConnectionPool
from gateway.units import UnitRegistry, UnitState
from tests.gateway.servers import RawServer, never, refused_url, serve_app, until

MODEL = "m"


class Node:
    """One node's `/health` (and, on a leader, the canary's completions endpoint)."""

    def __init__(self, rank: int) -> None:
        role = "leader" if rank == 0 else "follower"
        self.doc: dict[str, Any] = {
            "status": "ok",
            "unit": "u0",
            "role": role,
            "rank": rank,
            "pid": 1000 + rank,
            "step": 7,
            "pending": 0,
        }
        self.status = 200
        self.body: bytes | None = None  # sent instead of the doc
        self.before: Callable[[], Awaitable[None]] | None = None  # awaited before answering
        self.peers: list[int] = []  # the client port of each probe
        self.completions: list[tuple[str, dict[str, Any]]] = []  # (x-request-id, body)
        self.completion_status = 200

    async def health(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        if self.before is not None:
            await self.before()
        body = orjson.dumps(self.doc) if self.body is None else self.body
        return web.Response(status=self.status, body=body, content_type="application/json")

    async def completion(self, request: web.Request) -> web.Response:
        self.completions.append((request.headers["x-request-id"], await request.json()))
        return web.json_response(
            {"error": "no"} if self.completion_status != 200 else {}, status=self.completion_status
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.completion)
        return app


@contextlib.asynccontextmanager
async def served(*nodes: Node) -> AsyncIterator[list[str]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(serve_app(node.app())) for node in nodes]


def config(urls: list[str], **health: Any) -> Config:
    return config_from_dict(
        {
            "gateway": {"models": [MODEL]},
            "units": [{"id": "u0", "leader": urls[0], "nodes": urls}],
            "health": {"enabled": True, "timeout": 1.0, "jitter": 0.0, **health},
        }
    )


@dataclass
class Rig:
    prober: UnitProber
    registry: UnitRegistry
    events: EventLog
    metrics: Metrics
    traffic_asked: list[tuple[str, float]] = field(default_factory=list)

    @property
    def unit(self) -> UnitState:
        return self.prober.unit

    def counted(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"unit": "u0", **labels})
        return 0.0 if value is None else value


Build = Callable[..., Rig]


@pytest.fixture
async def rigs() -> AsyncIterator[Build]:
    """Builds a UnitProber (and what it writes to) for unit u0 on `urls`; closes its pool."""
    pools: list[ConnectionPool] = []

    def build(urls: list[str], flowing: bool = False, **health: Any) -> Rig:
        c = config(urls, **health)
        registry = UnitRegistry(c)
        events = EventLog()
        metrics = Metrics(registry, lambda: 0)
        pools.append(ConnectionPool(c.health.timeout, 30.0, 0))
        asked: list[tuple[str, float]] = []

        def traffic(unit_id: str, now: float) -> bool:
            asked.append((unit_id, now))
            return flowing

        unit = registry.units["u0"]
        prober = UnitProber(
            unit, registry, events, metrics, pools[-1], c.health, Random(0), traffic
        )
        return Rig(prober, registry, events, metrics, asked)

    yield build
    for pool in pools:
        pool.close()


def assert_no_tasks_left() -> None:
    """Only the test's own task runs (and the test servers' connection handlers)."""
    ours = {asyncio.current_task()}
    left = [t for t in asyncio.all_tasks() - ours if not _aiohttp_server_task(t)]
    assert left == []


def _aiohttp_server_task(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and "/aiohttp/" in code.co_filename


async def timed_round(rig: Rig) -> tuple[Round, float]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await rig.prober.probe_round()
    return result, loop.time() - start


async def test_a_round_probes_every_node_at_once_and_records_what_each_said(
    rigs: Build,
) -> None:
    nodes = [Node(0), Node(1), Node(2)]
    arrived = asyncio.Event()

    async def all_three_in() -> None:  # sequential probes would never get past this
        if sum(len(n.peers) for n in nodes) == 3:
            arrived.set()
        await arrived.wait()

    for node in nodes:
        node.before = all_three_in
    async with served(*nodes) as urls:
        rig = rigs(urls)
        unit = rig.unit
        assert (unit.health, unit.routable) == (Health.UNKNOWN, False)
        result, _ = await timed_round(rig)
        assert result.outcome is Outcome.GOOD and result.nodes == (None, None, None)
        assert result.flip == Flip(Health.HEALTHY, "first probe round: all 3 nodes ok")
        assert rig.unit.health is Health.HEALTHY and rig.unit.routable
        assert rig.registry.routable(MODEL) == (rig.unit,)
        for rank, status in enumerate(rig.unit.nodes):
            assert status.healthy and status.error is None
            assert status.latency_ms is not None and status.latency_ms > 0
            assert (status.pid, status.step, status.pending) == (1000 + rank, 7, 0)
        [event] = rig.events.recent()
        assert (event.unit, event.what, event.who) == ("u0", "healthy", "prober")
        assert rig.counted("unitgate_health_transitions_total", to="healthy") == 1
        assert rig.traffic_asked == []  # asked only when a probe timed out

        for node in nodes:
            node.before = None
        second, _ = await timed_round(rig)
        assert second.outcome is Outcome.GOOD and second.flip is None
        assert len(rig.events.recent()) == 1  # steady state records nothing
        assert rig.prober.rounds == 2
        # Each node was probed once per round, the second time on the kept connection.
        for node in nodes:
            assert len(node.peers) == 2 and node.peers[0] == node.peers[1]


async def test_a_round_records_the_others_requests_the_leader_reports(rigs: Build) -> None:
    """The leader's queue and KV slots beyond this gateway's own requests are the others'."""
    leader = Node(0)
    leader.doc.update(pending=2, kv_slots_used=7)
    async with served(leader, Node(1)) as urls:
        rig = rigs(urls)
        rig.unit.inflight = 3
        await timed_round(rig)
        assert rig.unit.foreign == 6
        leader.doc.update(pending=0, kv_slots_used=1)
        await timed_round(rig)
        assert rig.unit.foreign == 0  # never below 0: the gateway counts its own first
        del leader.doc["pending"]
        rig.unit.foreign = 5
        await timed_round(rig)
        assert rig.unit.foreign == 0  # an engine that reports no load: own counts only


async def test_a_refused_node_is_hard_evidence_against_the_unit(rigs: Build) -> None:
    async with served(Node(0)) as urls:
        with refused_url() as dead:
            rig = rigs([*urls, dead])
            result, _ = await timed_round(rig)
            assert result.outcome is Outcome.BAD and result.hard
            assert result.nodes == (None, "connection refused")
            assert result.problem == f"node 1 (follower {dead}): connection refused"
            assert rig.unit.health is Health.UNHEALTHY and rig.unit.hard
            assert not rig.unit.rescuable  # panic routing never brings it back
            leader, follower = rig.unit.nodes
            assert leader.healthy and not follower.healthy
            assert follower.error == "connection refused" and follower.latency_ms is None
            assert rig.counted("unitgate_probe_failures_total", rank="1") == 1
            assert rig.counted("unitgate_probe_failures_total", rank="0") == 0
            [event] = rig.events.recent()
            assert event.what == "unhealthy" and "connection refused" in event.reason

            # The same verdict again is not a new flip: one event, but every failure counted.
            again, _ = await timed_round(rig)
            assert again.flip is None and len(rig.events.recent()) == 1
            assert rig.counted("unitgate_probe_failures_total", rank="1") == 2
            assert rig.traffic_asked == []  # nothing soft to vouch for


async def test_a_probe_that_times_out_is_soft_evidence() -> None:
    pool = ConnectionPool(1.0, 30.0, 0)
    try:
        async with RawServer(never) as silent:
            report = await probe_node(pool, Target(silent.url), 0.05)
            assert report.timed_out and report.latency_ms is None
            assert report.error == "no answer within 50 ms"
            await asyncio.wait_for(silent.peers[0].closed.wait(), 1.0)  # never reused
        with refused_url() as dead:
            refused = await probe_node(pool, Target(dead), 0.05)
            assert not refused.timed_out and refused.error == "connection refused"
    finally:
        pool.close()


@pytest.mark.parametrize("flowing", [False, True])
async def test_a_silent_node_makes_the_unit_slow_only_while_its_traffic_flows(
    rigs: Build, flowing: bool
) -> None:
    async with served(Node(0)) as urls, RawServer(never) as silent:
        rig = rigs([*urls, silent.url], flowing=flowing, timeout=0.05)
        result, took = await timed_round(rig)
        assert took < 0.05 + 0.5  # one probe timeout bounds the round
        assert not result.hard and result.nodes == (None, "no answer within 50 ms")
        [(unit_id, _)] = rig.traffic_asked
        assert unit_id == "u0"
        if flowing:
            assert result.outcome is Outcome.SLOW
            assert rig.unit.health is Health.SLOW and rig.unit.routable
        else:
            assert result.outcome is Outcome.BAD
            assert result.problem is not None
            assert result.problem.endswith("no live traffic on the unit to vouch for it")
            assert rig.unit.health is Health.UNHEALTHY and not rig.unit.hard
            assert rig.unit.rescuable  # soft: panic routing may still use it


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (503, orjson.dumps({"status": "loading"}), "HTTP 503 (status loading)"),
        (500, b"Internal Server Error", "HTTP 500 without a JSON object body"),
        (200, b"ok", "HTTP 200 without a JSON object body"),
        (200, b"[1, 2]", "HTTP 200 without a JSON object body"),
    ],
)
async def test_a_bad_status_or_body_is_hard_evidence(
    rigs: Build, status: int, body: bytes, problem: str
) -> None:
    follower = Node(1)
    follower.status, follower.body = status, body
    async with served(Node(0), follower) as urls:
        rig = rigs(urls)
        result, _ = await timed_round(rig)
    assert result.outcome is Outcome.BAD and result.hard
    assert result.nodes == (None, problem)
    assert rig.unit.health is Health.UNHEALTHY and rig.unit.hard
    assert rig.unit.nodes[1].error == problem and rig.unit.nodes[1].latency_ms is not None


@pytest.mark.parametrize(
    ("rank", "change", "problem"),
    [
        (0, {"unit": "u9"}, "reports unit u9, expected u0"),
        (1, {"unit": None}, "reports unit None, expected u0"),
        (0, {"rank": 1}, "reports rank 1, expected 0"),
        (1, {"rank": True}, "reports rank None, expected 1"),  # a bool is not a rank
        (1, {"role": "leader"}, "reports role leader, expected follower"),
        (0, {"status": "draining"}, "status 'draining'"),
    ],
)
async def test_a_node_that_is_not_the_one_configured_is_hard_evidence(
    rigs: Build, rank: int, change: dict[str, Any], problem: str
) -> None:
    nodes = [Node(0), Node(1)]
    nodes[rank].doc.update(change)
    async with served(*nodes) as urls:
        rig = rigs(urls)
        result, _ = await timed_round(rig)
    expected: list[str | None] = [None, None]
    expected[rank] = problem
    assert result.nodes == tuple(expected)
    assert result.outcome is Outcome.BAD and result.hard
    assert rig.unit.health is Health.UNHEALTHY and rig.unit.hard


async def test_the_canary_runs_every_kth_round_on_the_leader(rigs: Build) -> None:
    leader = Node(0)
    async with served(leader) as urls:
        rig = rigs(urls, canary_every=2, canary_timeout=1.0)
        first, _ = await timed_round(rig)
        assert first.outcome is Outcome.GOOD
        assert leader.completions == [
            ("unitgate-canary", {"model": MODEL, "prompt": "ping", "max_tokens": 1})
        ]
        await rig.prober.probe_round()  # round 1: no canary
        assert len(leader.completions) == 1
        leader.completion_status = 500
        failed, _ = await timed_round(rig)  # round 2: a canary that fails
        assert len(leader.completions) == 2
        assert failed.outcome is Outcome.BAD and failed.hard
        assert failed.nodes == (None,)  # /health itself was fine
        assert failed.problem is not None
        assert failed.problem.startswith("canary completion failed: HTTP 500")


async def test_a_flip_for_a_unit_removed_meanwhile_is_not_applied(rigs: Build) -> None:
    async with served(Node(0)) as urls:
        rig = rigs(urls)
        rig.registry.remove("u0")
        result, _ = await timed_round(rig)
    assert result.flip is not None and result.flip.health is Health.HEALTHY
    assert rig.unit.health is Health.UNKNOWN  # nobody's business now
    assert rig.events.recent() == []
    assert rig.counted("unitgate_health_transitions_total", to="healthy") == 0


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
            c, registry, EventLog(), Metrics(registry, lambda: 0), Random(0)
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
        async with HealthSupervisor(c, registry, EventLog(), Metrics(registry, lambda: 0)) as sup:
            task = sup.task("u0")
            assert task is not None
            registry.remove("u0")
            await until(task.done, 1.0, "the removed unit's prober ends")
            assert task.cancelled() and sup.task("u0") is None
        assert_no_tasks_left()
