"""Honest readiness and panic routing, end to end: a gateway must not claim, or route to,
what no probe round has judged, and must keep serving when health would take out everyone on
soft evidence alone.
"""

from __future__ import annotations

import asyncio

import aiohttp

from gateway.base.ports import free_ports
from gateway.config import UnitConfig
from gateway.health_states import Health
from gateway.proxy.call import Call
from gateway.signals import Observer
from gateway.units import UnitState
from tests.integration.probing import Traffic, all_probed_ok, probed, until
from tests.support import SimProcess, chat_body


async def test_readyz_is_never_200_while_every_unit_is_dead(http: aiohttp.ClientSession) -> None:
    """Nothing listens at either unit: /readyz must say so from the very first request on,
    and requests get 503 no_routable_unit (never a connect error from a unit tried blind)."""
    dead = [
        {"id": f"d{i}", "leader": f"http://127.0.0.1:{port}", "nodes": [f"http://127.0.0.1:{port}"]}
        for i, port in enumerate(free_ports(2))
    ]
    async with probed(dead) as p:
        loop = asyncio.get_running_loop()
        until_judged = loop.time() + 2.0
        statuses = []
        while loop.time() < until_judged or not all(u.hard for u in p.gw.units.units.values()):
            async with http.get(p.gw.public_url + "/readyz") as resp:
                statuses.append(resp.status)
            assert loop.time() < until_judged + 3.0, "units never judged"
            await asyncio.sleep(0.01)
        async with http.post(
            p.gw.public_url + "/v1/chat/completions", json=chat_body(stream=False)
        ) as resp:
            answer = (resp.status, (await resp.json())["error"]["code"])
    assert len(statuses) > 50 and set(statuses) == {503}
    assert answer == (503, "no_routable_unit")


class Routed(Observer):
    """When the gateway sent each attempt, and to which unit: the moment routing decided,
    which for a request the client began just before a flip can be just after it."""

    def __init__(self) -> None:
        self.attempts: list[tuple[float, str]] = []

    def attempt_started(self, call: Call, unit: UnitState) -> None:
        self.attempts.append((asyncio.get_running_loop().time(), unit.config.id))


async def test_a_unit_added_at_run_time_gets_no_request_before_its_first_good_round(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    u1 = clean_sim.units[1]
    routed = Routed()
    async with probed(clean_sim.units[:1]) as p:
        p.gw.signals.subscribe(routed)
        await until(lambda: all_probed_ok(p), 2.0, "first probes")
        traffic = Traffic(p.gw.public_url, http)
        try:
            await until(lambda: len(traffic.sent) >= 10, 5.0, "traffic flowing")
            config = UnitConfig(id="u1", leader=u1["leader"], nodes=tuple(u1["nodes"]))
            p.gw.units.add(config)
            await until(lambda: p.gw.units.units["u1"].routable, 2.0, "u1 routable")
            let_in = p.flip_time("u1", True)
            sent = len(traffic.sent)
            await until(lambda: len(traffic.sent) >= sent + 30, 5.0, "traffic after")
        finally:
            await traffic.stop()
    early = [unit for at, unit in routed.attempts if at < let_in and unit == "u1"]
    assert early == []
    assert "u1" in {unit for at, unit in routed.attempts if at > let_in}
    assert "u1" in {unit for _, _, unit in traffic.sent}
    assert {status for _, status, _ in traffic.sent} == {200}


async def test_panic_routing_keeps_serving_when_probes_time_out_everywhere(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    """Both units idle, then every probe times out: nothing vouches for them, so they go out
    on soft evidence, and panic routing keeps them serving. The traffic it lets through then
    vouches for them: they come back as slow, and the panic ends."""
    units = clean_sim.units[:2]
    async with probed(units, timeout=0.1) as p:
        await until(lambda: all_probed_ok(p), 2.0, "first probes")
        for unit in units:
            for rank in range(len(unit["nodes"])):
                clean_sim.post(
                    f"/units/{unit['id']}/nodes/{rank}/health", {"mode": "slow", "delay_ms": 300}
                )
        registry = p.gw.units
        await until(lambda: "unitgate-sim" in registry.panic, 3.0, "panic routing")
        assert all(u.health is Health.UNHEALTHY and not u.hard for u in registry.units.values())
        text = p.gw.metrics.render().decode()
        assert 'unitgate_panic_routing{model="unitgate-sim"} 1.0' in text
        traffic = Traffic(p.gw.public_url, http)
        try:
            await until(lambda: len(traffic.sent) >= 20, 5.0, "served under panic")
            await until(
                lambda: all(u.health is Health.SLOW for u in registry.units.values()),
                5.0,
                "back as slow once their traffic vouches for them",
            )
            assert registry.panic == {}
        finally:
            await traffic.stop()
        whats = [e.what for e in p.events.recent(unit="model:unitgate-sim")]
    assert whats[:2] == ["panic", "panic over"]
    assert {status for _, status, _ in traffic.sent} == {200}
