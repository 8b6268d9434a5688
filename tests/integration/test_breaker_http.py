"""The circuit breaker fed by real traffic: 5xx trips it, 4xx does not, trials bring it back."""

from __future__ import annotations

import asyncio

import aiohttp

from gateway.server import running
from tests.support import SimProcess, chat_body, gateway_config, sim_stats

CHAT = "/v1/chat/completions"


async def _post(http: aiohttp.ClientSession, url: str) -> int:
    async with http.post(url + CHAT, json=chat_body()) as resp:
        await resp.read()
        return resp.status


async def test_5xx_trips_then_trials_restore(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    breaker = {
        "enabled": True,
        "consecutive_failures": 3,
        # long enough for ten requests on a loaded machine to see it ejected throughout
        "base_ejection": 2.0,
        "probe_requests": 2,
    }
    config = gateway_config(
        clean_sim.units[:2], breaker=breaker, retry={"budget_min_per_second": 10.0}
    )
    async with running(config) as gw:
        clean_sim.fault("u0", "error", status=500)
        u0 = gw.units.units["u0"]
        for _ in range(40):
            assert await _post(http, gw.public_url) == 200  # retried on u1
            if not u0.admitting:
                break
        assert not u0.admitting and u0.reasons["admitting"] == "3 consecutive failures"
        seen = (await sim_stats(http, clean_sim, "u0"))["requests"]
        for _ in range(10):
            assert await _post(http, gw.public_url) == 200
        assert gw.breakers.view("u0")["state"] == "ejected", "the test ran past the ejection"
        assert (await sim_stats(http, clean_sim, "u0"))["requests"] == seen  # ejected: no traffic
        clean_sim.post("/reset")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while gw.breakers.view("u0")["state"] != "admitting":
            assert loop.time() < deadline, gw.breakers.view("u0")
            assert await _post(http, gw.public_url) == 200  # trial requests reach u0 again
        events = [e.what for e in gw.events.recent(unit="u0")]
        assert events == ["breaker ejected", "breaker probing", "breaker admitting"]
        assert (
            'unitgate_breaker_transitions_total{to="ejected",unit="u0"} 1.0'
            in gw.metrics.render().decode()
        )


async def test_4xx_never_trips(clean_sim: SimProcess, http: aiohttp.ClientSession) -> None:
    config = gateway_config(
        clean_sim.units[:1], breaker={"enabled": True, "consecutive_failures": 2}
    )
    async with running(config) as gw:
        clean_sim.fault("u0", "error", status=422)
        assert [await _post(http, gw.public_url) for _ in range(6)] == [422] * 6
        assert gw.units.units["u0"].admitting
        assert gw.breakers.view("u0")["state"] == "admitting"
