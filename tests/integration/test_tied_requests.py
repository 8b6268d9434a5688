"""Tied requests end to end: a real gateway, its prober and two real builtin engines (tiny
models, one KV slot each, steps slowed to 20 ms), the first copy's unit busy with a request
sent to it directly. The prober learns from each leader's health that it announces its
starts; the gateway sends both copies at once; the idle unit starts its copy and wins; the
busy unit's copy is closed while it waits in its queue and is never prefilled; the metrics say
a tied twin went, the second copy won, and nothing was wasted."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest

from engine.runtime.leader import LeaderEngine
from gateway.server import running
from tests.integration.test_hedging import counted
from tests.leader_support import tiny_leaders
from tests.support import MODEL, chat_body, gateway_config, session_ranking_first, until_routable

CHAT = "/v1/chat/completions"
HEDGE = {"enabled": True, "min_delay": 1.0, "max_delay": 2.0, "budget_share": 1.0}
STEP_S = 0.02


@pytest.fixture
async def leaders() -> AsyncIterator[list[tuple[LeaderEngine, dict[str, object]]]]:
    async with tiny_leaders(2, slots=1, model=MODEL, step_s=STEP_S) as made:
        yield [
            (e, {"id": f"u{i}", "leader": url, "nodes": [url]}) for i, (e, url) in enumerate(made)
        ]


async def test_the_idle_unit_starts_the_tied_copy_and_the_busy_one_never_prefills_its_own(
    leaders: list[tuple[LeaderEngine, dict[str, object]]], http: aiohttp.ClientSession
) -> None:
    (busy, u0), (idle, u1) = leaders
    config = gateway_config(
        [u0, u1],
        routing={"affinity": "session"},
        hedge=HEDGE,
        health={"enabled": True, "interval": 0.25, "timeout": 1.0},
    )
    session = session_ranking_first("u0", ["u1"])  # the first copy goes to the busy u0
    hog = chat_body(stream=True, max_tokens=400, ignore_eos=True)
    async with running(config) as gw:
        await until_routable(gw)
        assert gw.units.units["u0"].tied and gw.units.units["u1"].tied
        held = await http.post(str(u0["leader"]) + CHAT, json=hog)  # u0's one slot
        await held.content.readany()
        queried = busy.health()["prefix_cache_queries"]
        loop = asyncio.get_running_loop()
        began = loop.time()
        body = chat_body(stream=True, max_tokens=4)
        headers = {"x-session-id": session}
        async with http.post(gw.public_url + CHAT, json=body, headers=headers) as resp:
            text = await resp.text()
            assert resp.status == 200 and resp.headers["x-unitgate-unit"] == "u1"
        assert loop.time() - began < 1.0  # not after a delayed hedge's 1 s
        assert text.count("data: [DONE]") == 1 and '"error"' not in text
        assert len(re.findall(r'"role":\s*"assistant"', text)) == 1
        deadline = loop.time() + 5.0
        while busy.health()["pending"] != 1:  # u0's copy left its queue: aborted there
            assert loop.time() < deadline, "u0's copy still waits in its queue"
            await asyncio.sleep(0.01)
        metrics = gw.metrics.render().decode()
        held.close()
    assert busy.health()["prefix_cache_queries"] == queried, "u0 prefilled its copy"
    assert idle.health()["prefix_cache_queries"] > 0
    assert counted(metrics, "unitgate_hedges_total", outcome="tied") == 1
    assert counted(metrics, "unitgate_hedges_total", outcome="fired") == 0
    assert counted(metrics, "unitgate_hedges_total", outcome="second") == 1
    assert counted(metrics, "unitgate_hedge_prefill_tokens_total", kind="sent") == 0
    assert counted(metrics, "unitgate_hedge_prefill_tokens_total", kind="wasted") == 0
    assert counted(metrics, "unitgate_unit_hedges_total", unit="u0", role="hedged") == 1
    assert counted(metrics, "unitgate_unit_hedges_total", unit="u0", role="lost") == 1
    assert counted(metrics, "unitgate_unit_hedges_total", unit="u1", role="won") == 1
