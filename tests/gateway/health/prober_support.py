"""The prober tests' harness: real `/health` servers on 127.0.0.1 (Node, each one node's
answer and, on a leader, the canary's completions endpoint), the unit's config, and a UnitProber
with what it writes to (Rig, built by the `rigs` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.config import Config, config_from_dict
from gateway.health.probe import probe_pool
from gateway.health.prober import UnitProber
from gateway.health.verdict import Round
from gateway.observability.events import EventLog
from gateway.observability.health_observers import health_signals
from gateway.observability.metrics import Metrics
from gateway.units import UnitRegistry, UnitState
from gateway.upstream.pool import ConnectionPool
from tests.gateway.servers import serve_app

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
    traffic_asked: list[tuple[str, float, float | None]] = field(default_factory=list)

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
        pools.append(probe_pool(c.health.timeout, 30.0))
        asked: list[tuple[str, float, float | None]] = []

        def traffic(unit_id: str, now: float, since: float | None = None) -> bool:
            asked.append((unit_id, now, since))
            return flowing

        unit = registry.units["u0"]
        prober = UnitProber(
            unit, registry, health_signals(events, metrics), pools[-1], c.health, Random(0), traffic
        )
        return Rig(prober, registry, events, metrics, asked)

    yield build
    for pool in pools:
        pool.close()


async def timed_round(rig: Rig) -> tuple[Round, float]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await rig.prober.probe_round()
    return result, loop.time() - start
