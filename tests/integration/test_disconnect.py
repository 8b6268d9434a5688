"""A client that goes away mid-stream makes the gateway close the upstream at once."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from gateway.server import Gateway
from tests.support import SimProcess, chat_body, sim_stats

pytestmark = pytest.mark.both_relays


async def test_disconnect_closes_upstream_within_100ms(
    gateway: Gateway, clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    for unit in clean_sim.units:
        clean_sim.post(f"/units/{unit['id']}/settings", {"itl_ms": 200, "tokens": 50})
    async with aiohttp.ClientSession() as client:
        resp = await client.post(gateway.public_url + "/v1/chat/completions", json=chat_body())
        unit_id = resp.headers["x-unitgate-unit"]
        await resp.content.readany()  # the stream is running
        before = await sim_stats(http, clean_sim, unit_id)
        assert before["in_flight"] == 1
        closed_at = time.time()
        resp.connection.transport.abort()  # type: ignore[union-attr]  # the client vanishes
        resp.close()
    deadline = time.monotonic() + 5
    while (stats := await sim_stats(http, clean_sim, unit_id))["cancelled"] == 0:
        assert time.monotonic() < deadline, "the unit never saw the abort"
        await asyncio.sleep(0.01)
    assert stats["last_cancel_time"] - closed_at < 0.1
    text = gateway.metrics.render().decode()
    assert f'unitgate_cancellations_total{{unit="{unit_id}"}} 1.0' in text
    assert gateway.units.units[unit_id].inflight == 0
    assert f'unitgate_upstream_failures_total{{unit="{unit_id}"' not in text
