"""Routing by each unit's learned latency, against real simulated units behind a real gateway:
the units predicted soonest get the requests, a unit far slower than the fleet turns `slow`
with its own reason, and the fitted figures are exported."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp

from gateway.server import Gateway, running
from tests.gateway.servers import until
from tests.support import SimProcess, chat_body, gateway_config, until_routable

CHAT = "/v1/chat/completions"
SLOW_TTFT_MS = 150


async def send(http: aiohttp.ClientSession, gw: Gateway) -> str:
    async with http.post(gw.public_url + CHAT, json=chat_body()) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers["x-unitgate-unit"]


async def load(http: aiohttp.ClientSession, gw: Gateway, clients: int, each: int) -> Counter[str]:
    served: Counter[str] = Counter()

    async def client() -> None:
        for _ in range(each):
            served[await send(http, gw)] += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return served


async def test_the_soonest_units_get_the_requests_and_a_lagging_one_turns_slow(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    clean_sim.post("/units/u2/settings", {"ttft_ms": SLOW_TTFT_MS})
    config = gateway_config(
        clean_sim.units,
        health={"enabled": True, "interval": 0.2, "timeout": 1.0},
        routing={"latency_model": "route"},
    )
    async with running(config) as gw:
        await until_routable(gw, within=10.0)
        forecast = gw.knowledge.forecast
        assert forecast is not None
        # Until every unit has learned, requests go by load alone, a third of them to u2.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while len(gw.knowledge.latency_figures()) < 3:
            assert loop.time() < deadline, f"not learned: {gw.knowledge.latency_figures()}"
            await load(http, gw, 9, 3)
        figures = gw.knowledge.latency_figures()
        assert figures["u2"]["ttft_1k_idle"] > 5 * figures["u0"]["ttft_1k_idle"]
        assert 0.1 < figures["u2"]["ttft_1k_idle"] < 0.5  # its 150 ms, and the relay's
        # Learned: the slow unit gets what exploration and the load bound send it.
        served = await load(http, gw, 6, 10)
        assert served["u2"] <= 10, served
        # Its prefill lags the fleet's: slow (routed at slow_weight), with that reason.
        u2 = gw.units.units["u2"]
        await until(lambda: u2.health.value == "slow", 10.0, "u2 slow")
        assert "fleet's median" in u2.reasons["healthy"], u2.reasons
        assert gw.units.units["u0"].health.value == "healthy"
        async with http.get(gw.metrics_url + "/metrics") as resp:
            text = await resp.text()
        assert 'unitgate_unit_latency_fit{figure="ttft_1k_idle",unit="u2"}' in text
        assert 'unitgate_ttft_prediction_ratio_bucket{le="1.1",unit="u0"}' in text
        assert 'unitgate_routing_decisions_total{how="predicted"}' in text
        # The unit recovers: exploration's requests teach its model, and it is healthy again.
        clean_sim.post("/units/u2/settings", {"ttft_ms": 5})

        async def recovered() -> bool:
            await load(http, gw, 6, 5)
            return u2.health.value == "healthy"

        deadline = loop.time() + 60.0
        while not await recovered():
            assert loop.time() < deadline, gw.knowledge.latency_figures()["u2"]
