"""Failures before the first byte are retried on another unit; after it, never."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.server import running
from tests.support import (
    SimProcess,
    chat_body,
    gateway_config,
    session_ranking_first,
    sim_stats,
    sim_total,
)

pytestmark = pytest.mark.both_relays

CHAT = "/v1/chat/completions"


async def _post(
    http: aiohttp.ClientSession, url: str, session: str = "", **body: object
) -> tuple[int, str, bytes]:
    headers = {"x-session-id": session} if session else {}
    async with http.post(url + CHAT, json=chat_body(**body), headers=headers) as resp:  # type: ignore[arg-type]
        return resp.status, resp.headers.get("x-unitgate-unit", ""), await resp.read()


async def test_each_failure_kind_is_retried_elsewhere(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(
        clean_sim.units,
        timeouts={"first_byte": 0.3},
        retry={"budget_min_per_second": 10.0},
        routing={"affinity": "session"},
    )
    # A session that favours u0, so every first attempt meets the fault (no luck involved).
    session = session_ranking_first("u0", [u["id"] for u in clean_sim.units[1:]])
    async with running(config) as gw:
        for mode in ("error", "refuse", "hang"):
            clean_sim.post("/reset")
            clean_sim.fault("u0", mode)
            # A hung unit shows only in streams (first_byte); a whole answer may take `total`.
            for stream in (True, False) if mode != "hang" else (True,):
                for _ in range(6):
                    status, unit, body = await _post(http, gw.public_url, session, stream=stream)
                    assert status == 200, (mode, body)
                    assert unit != "u0"
        text = gw.metrics.render().decode()
    for kind in ("status", "connect", "first_byte_timeout"):
        assert f'unitgate_retries_total{{kind="{kind}"}}' in text, kind


async def test_upstream_4xx_is_passed_through_not_retried(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async with running(gateway_config(clean_sim.units[:1])) as gw:
        clean_sim.fault("u0", "error", status=422)
        status, unit, body = await _post(http, gw.public_url)
        assert (status, unit) == (422, "u0")
        assert b"error" in body
        assert (await sim_stats(http, clean_sim, "u0"))["requests"] == 1


async def test_retry_budget_caps_retries_in_a_brownout(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(
        clean_sim.units,
        retry={"max_attempts": 3, "budget_ratio": 0.2, "budget_min_per_second": 0.1},
    )
    async with running(config) as gw:
        for unit in clean_sim.units:
            clean_sim.fault(unit["id"], "error", status=503)
        statuses = [(await _post(http, gw.public_url))[0] for _ in range(50)]
        assert set(statuses) == {502}
        attempts = await sim_total(http, clean_sim, "requests")
        # 50 originals; retries <= 20% of them plus the floor (0.1/s x 10 s = 1).
        assert 50 < attempts <= 50 + 10 + 1, attempts
        assert "unitgate_retry_budget_exhausted_total 0.0" not in gw.metrics.render().decode()


async def test_all_attempts_fail_gives_a_clear_error(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async with running(gateway_config(clean_sim.units[:2])) as gw:
        clean_sim.fault("u0", "refuse")
        clean_sim.fault("u1", "refuse")
        async with http.post(gw.public_url + CHAT, json=chat_body()) as resp:
            assert resp.status == 502
            error = (await resp.json())["error"]
            assert error["type"] == "upstream_error" and error["code"] == "connect"
            assert "x-request-id" in resp.headers


async def test_no_retry_after_the_first_byte(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(clean_sim.units, resume={"enabled": False})
    async with running(config) as gw:
        for unit in clean_sim.units:
            clean_sim.fault(unit["id"], "drop", after_tokens=2)
        async with http.post(gw.public_url + CHAT, json=chat_body()) as resp:
            assert resp.status == 200
            text = await resp.text()
        assert '"tok1 "' in text or "tok1 " in text
        # An explicit SSE error event, then [DONE]: not a silent truncation.
        assert text.endswith('"code":"reset"}}\n\ndata: [DONE]\n\n')
        assert await sim_total(http, clean_sim, "requests") == 1
