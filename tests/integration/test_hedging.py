"""Hedged requests end to end: a real gateway in front of the simulated units, one of which
stalls before its first token. The client gets the other unit's answer, once, soon after the
delay; the stalled unit sees its copy cancelled; the tokens are counted once."""

from __future__ import annotations

import asyncio
import re

import aiohttp

from gateway.server import running
from tests.support import (
    SimProcess,
    chat_body,
    gateway_config,
    session_ranking_first,
    sim_stats,
    until_routable,
)

CHAT = "/v1/chat/completions"
HEDGE = {"enabled": True, "min_delay": 0.05, "max_delay": 0.2, "budget_share": 1.0}


def counted(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of `name` with (at least) `labels`, 0 if none."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_stalled_first_token_is_hedged_and_the_client_gets_one_answer(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    clean_sim.post("/units/u0/settings", {"stall_rate": 1.0, "stall_ms": 10_000})
    config = gateway_config(clean_sim.units[:2], routing={"affinity": "session"}, hedge=HEDGE)
    session = session_ranking_first("u0", ["u1"])  # every first copy goes to the stalled u0
    loop = asyncio.get_running_loop()
    async with running(config) as gw:
        for _ in range(3):
            began = loop.time()
            headers = {"x-session-id": session}
            body = chat_body(stream=True)
            async with http.post(gw.public_url + CHAT, json=body, headers=headers) as resp:
                text = await resp.text()
                assert resp.status == 200 and resp.headers["x-unitgate-unit"] == "u1"
            assert loop.time() - began < 2.0  # not the 10 s stall
            assert text.count("data: [DONE]") == 1 and '"error"' not in text
            assert len(re.findall(r'"role":\s*"assistant"', text)) == 1  # one answer, not two
        metrics = gw.metrics.render().decode()
        deadline = loop.time() + 5.0
        while (await sim_stats(http, clean_sim, "u0"))["cancelled"] < 3:
            assert loop.time() < deadline, "u0 never saw its copies cancelled"
            await asyncio.sleep(0.05)
    assert counted(metrics, "unitgate_hedges_total", outcome="fired") == 3
    assert counted(metrics, "unitgate_hedges_total", outcome="second") == 3
    assert counted(metrics, "unitgate_retries_total") == 0  # a hedge is not a retry
    # By unit: u0's first copies were hedged and lost, u1's copies won.
    assert counted(metrics, "unitgate_unit_hedges_total", unit="u0", role="hedged") == 3
    assert counted(metrics, "unitgate_unit_hedges_total", unit="u0", role="lost") == 3
    assert counted(metrics, "unitgate_unit_hedges_total", unit="u1", role="won") == 3
    assert counted(metrics, "unitgate_unit_hedges_total", unit="u1", role="lost") == 0
    # The budget's state: each second copy's prefill against every first copy's
    base = counted(metrics, "unitgate_hedge_prefill_tokens_total", kind="base")
    sent = counted(metrics, "unitgate_hedge_prefill_tokens_total", kind="sent")
    assert base > 0 and sent == base  # every request was hedged: as much again
    completion = counted(metrics, "unitgate_tokens_total", unit="u1", type="completion")
    assert completion == 3 * 8  # counted once, from the answer the client got
    assert counted(metrics, "unitgate_tokens_total", unit="u0", type="completion") == 0
    stats = await sim_stats(http, clean_sim, "u0")
    assert stats["completed"] == 0


async def test_a_unit_whose_copies_a_hedge_keeps_overtaking_is_put_on_probation(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    """A straggler's overtaken copies are cancelled before their first token, so its latency
    model never sees them; counted apart, they put it on probation: `slow`, with that reason,
    at its slow weight. It leaves probation once they stop."""
    clean_sim.post("/units/u0/settings", {"stall_rate": 0.3, "stall_ms": 10_000})
    health = {"enabled": True, "interval": 0.1, "timeout": 1.0}
    hedge = {**HEDGE, "budget_window": 5.0}  # the shares' window too: a quick recovery
    config = gateway_config(clean_sim.units, health=health, hedge=hedge)
    loop = asyncio.get_running_loop()
    async with running(config) as gw:
        await until_routable(gw, within=10.0)
        u0 = gw.units.units["u0"]

        async def client(each: int) -> None:
            for _ in range(each):
                body = chat_body(stream=True)
                async with http.post(gw.public_url + CHAT, json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()

        deadline = loop.time() + 30.0
        while u0.health.value != "slow":
            assert loop.time() < deadline, gw.knowledge.latency_figures()
            await asyncio.gather(*(client(5) for _ in range(6)))
        assert "a hedge overtook" in u0.reasons["healthy"], u0.reasons
        figures = gw.knowledge.latency_figures()
        assert figures["u0"]["overtaken_share"] > 0.1, figures
        # It keeps the share of slow_weight that its copies which began make (overtaken.py).
        assert u0.slow_share < 1.0 and u0.weight < config.health.slow_weight, u0.weight
        assert all(gw.units.units[u].health.value == "healthy" for u in ("u1", "u2"))
        # Its stalls stop: the copies it still gets begin, and it is healthy again.
        clean_sim.post("/units/u0/settings", {"stall_rate": 0.0})
        deadline = loop.time() + 60.0
        while u0.health.value != "healthy":
            assert loop.time() < deadline, gw.knowledge.latency_figures()
            await asyncio.gather(*(client(5) for _ in range(6)))
        assert u0.weight == 1.0
