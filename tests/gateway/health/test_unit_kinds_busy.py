"""The vLLM probe's witness of a busy engine (`NodeReport.busy_at`), against a vLLM-shaped server
on a real socket: stamped when the read that showed work moving was asked for, carried as it
is by the rounds that reuse that read, None when the work stands still or there is none; while
/health times out a due /metrics read goes beside it, and a read that got no answer is retried
once at the next round."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.health.kinds.vllm import VllmProbe
from gateway.upstream.pool import ConnectionPool
from tests.gateway.servers import serve_app


class BusyVllm:
    """vLLM's /health and /metrics (both its exact and its filtered path): `running` requests,
    and an engine step per /metrics read while `moving`; each answer after its delay."""

    def __init__(self) -> None:
        self.running, self.waiting = 3, 1
        self.moving = True
        self.steps = 100
        self.health_delay = self.metrics_delay = 0.0
        self.metrics_asked = 0
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/metrics/", self.metrics)
        self.app = app

    async def health(self, _: web.Request) -> web.Response:
        await asyncio.sleep(self.health_delay)
        return web.Response()

    async def metrics(self, _: web.Request) -> web.Response:
        self.metrics_asked += 1
        await asyncio.sleep(self.metrics_delay)
        self.steps += self.moving
        return web.Response(text=metrics_text(self.running, self.waiting, self.steps))


def metrics_text(running: int, waiting: int, steps: int) -> str:
    labels = '{engine="0",model_name="smol"}'
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{labels} {running}.0\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{labels} {waiting}.0\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{labels} 0.25\n"
        "# TYPE vllm:iteration_tokens_total histogram\n"
        f"vllm:iteration_tokens_total_count{labels} {steps}.0\n"
    )


@pytest.fixture
async def stock() -> AsyncIterator[tuple[BusyVllm, str, ConnectionPool]]:
    server = BusyVllm()
    async with serve_app(server.app) as url:
        pool = ConnectionPool(1.0, 30.0, 0)
        try:
            yield server, url, pool
        finally:
            pool.close()


async def test_busy_at_is_when_the_read_showing_work_moving_was_asked_for(
    stock: tuple[BusyVllm, str, ConnectionPool],
) -> None:
    server, url, pool = stock
    loop = asyncio.get_running_loop()
    probe = VllmProbe("v0", url, b"", interval=0.0)
    first = await probe(pool, 1.0)
    assert first.pending == 4 and first.busy_at is None  # one read: nothing to compare with
    before = loop.time()
    second = await probe(pool, 1.0)
    assert second.busy_at is not None and before <= second.busy_at <= loop.time()
    # Rounds that reuse the load carry its stamp as read, never the round's own time.
    probe.interval = 3600.0
    reused = await probe(pool, 1.0)
    assert not reused.fresh and reused.busy_at == second.busy_at
    server.health_delay = 1.0
    timed_out = await probe(pool, 0.1)
    assert timed_out.timed_out and timed_out.busy_at == second.busy_at
    assert timed_out.step is None  # the witness only: no load on a report without an answer
    # Progress standing still with work waiting, or no work at all: no witness.
    server.health_delay, server.moving, probe.interval = 0.0, False, 0.0
    assert (await probe(pool, 1.0)).busy_at is None
    server.moving = True
    assert (await probe(pool, 1.0)).busy_at is not None
    server.running = server.waiting = 0
    idle = await probe(pool, 1.0)
    assert idle.pending == 0 and idle.busy_at is None


async def test_while_health_times_out_a_due_read_goes_beside_it(
    stock: tuple[BusyVllm, str, ConnectionPool],
) -> None:
    """A leader that answers /metrics but not /health in time renews its witness; the round
    still takes one probe timeout, not two."""
    server, url, pool = stock
    loop = asyncio.get_running_loop()
    probe = VllmProbe("v0", url, b"", interval=0.0)
    await probe(pool, 1.0)
    server.health_delay = 1.0
    first = await probe(pool, 0.1)  # /health alone: a read follows only a 200
    assert first.timed_out and first.busy_at is None and server.metrics_asked == 1
    # A probe timeout long beside what a loaded machine adds to it (CI saw 0.3 s take 0.61):
    # one timeout takes about 1 s, one for each at least 2.
    server.health_delay = 3.0
    started = loop.time()
    beside = await probe(pool, 1.0)
    assert loop.time() - started < 1.0 + 0.8  # not a timeout for each
    assert beside.timed_out and server.metrics_asked == 2
    # read beside /health, not after its timeout
    assert beside.busy_at is not None and started <= beside.busy_at < started + 0.9
    # /metrics as late as /health (a lagging server, or a frozen one): the witness ages.
    server.metrics_delay = 1.0
    aged = await probe(pool, 0.1)
    assert aged.timed_out and aged.busy_at == beside.busy_at and server.metrics_asked == 3


async def test_a_read_without_an_answer_is_retried_once_at_the_next_round(
    stock: tuple[BusyVllm, str, ConnectionPool],
) -> None:
    server, url, pool = stock
    probe = VllmProbe("v0", url, b"", interval=3600.0)
    server.metrics_delay = 1.0
    missed = await probe(pool, 0.1)
    assert missed.error is None and missed.step is None and server.metrics_asked == 1
    await probe(pool, 0.1)
    assert server.metrics_asked == 2  # retried once at the next round
    await probe(pool, 0.1)
    assert server.metrics_asked == 2  # then back to its own interval
    server.metrics_delay = 0.0
    probe.interval = 0.0
    read = await probe(pool, 0.1)
    assert read.fresh and read.pending == 4 and probe.misses == 0
