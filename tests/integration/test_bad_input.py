"""Malformed requests get a 4xx OpenAI-style error and never reach a unit; what only the unit
can judge reaches it, and its own answer comes through."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from gateway.server import Gateway
from tests.support import MODEL, SimProcess, chat_body, sim_total

pytestmark = pytest.mark.both_relays

CHAT = "/v1/chat/completions"
USER = b'"messages": [{"role": "user", "content": "x"}]'
BAD = [
    (b"{oops", 400, "not valid JSON"),
    (b'{"model": "unitgate-sim", "messages": [{"role": "user", "content": "\xff"}]}', 400, "UTF-8"),
    (b'{"model": 1, "messages": []}', 400, "'model' must be a string"),
    (b'{"model": "gpt-9", ' + USER + b"}", 404, "does not exist"),
    (b'"just a string"', 400, "JSON object"),
]
# The gateway needs neither to route: the unit judges them (a stock vLLM unit as vLLM does).
THE_UNITS = [
    (b"{" + USER + b"}", 200, None),  # no model: the gateway's only model
    (b'{"model": "unitgate-sim"}', 400, "messages"),
    (b'{"model": "unitgate-sim", "max_tokens": "9", ' + USER + b"}", 400, "max_tokens"),
]


@pytest.mark.parametrize(("raw", "status", "needle"), BAD)
async def test_bad_input_is_refused(
    gateway: Gateway,
    clean_sim: SimProcess,
    http: aiohttp.ClientSession,
    raw: bytes,
    status: int,
    needle: str,
) -> None:
    headers = {"Content-Type": "application/json"}
    async with http.post(gateway.public_url + CHAT, data=raw, headers=headers) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
        assert needle in error["message"]
        assert error["type"] == "invalid_request_error"
    assert await sim_total(http, clean_sim, "requests") == 0
    async with http.post(gateway.public_url + CHAT, json=chat_body()) as resp:  # still serving
        assert resp.status == 200
        await resp.read()


async def test_body_over_the_limit_gives_413(
    gateway: Gateway, clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    big = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x" * (gateway.config.gateway.max_body_bytes)}],
    }
    async with http.post(gateway.public_url + CHAT, json=big) as resp:
        assert resp.status == 413
        assert (await resp.json())["error"]["code"] == "body_too_large"
    assert await sim_total(http, clean_sim, "requests") == 0


@pytest.mark.parametrize("over", [True, False])
async def test_a_chunked_body_is_held_to_the_limit_too(
    gateway: Gateway, clean_sim: SimProcess, http: aiohttp.ClientSession, over: bool
) -> None:
    """Without a Content-Length the size is known only once the body is in (here, with the
    head: the path that reads it without waiting)."""
    limit = gateway.config.gateway.max_body_bytes
    body = orjson.dumps(chat_body())
    body += b" " * (limit + 1 - len(body) if over else 0)  # JSON allows trailing spaces
    headers = {"Content-Type": "application/json"}
    async with http.post(
        gateway.public_url + CHAT, data=body, headers=headers, chunked=True
    ) as resp:
        assert resp.status == (413 if over else 200)
        if over:
            assert (await resp.json())["error"]["code"] == "body_too_large"
        else:
            await resp.read()
    assert await sim_total(http, clean_sim, "requests") == (0 if over else 1)


async def test_unknown_route_and_method_are_json(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(gateway.public_url + "/v1/nothing") as resp:
        assert resp.status == 404
        assert "error" in await resp.json()
    async with http.get(gateway.public_url + CHAT) as resp:
        assert resp.status == 405
        assert "POST" in resp.headers["Allow"]
        assert "error" in await resp.json()


@pytest.mark.parametrize(("raw", "status", "needle"), THE_UNITS)
async def test_what_only_the_unit_judges_reaches_it_once(
    gateway: Gateway,
    clean_sim: SimProcess,
    http: aiohttp.ClientSession,
    raw: bytes,
    status: int,
    needle: str | None,
) -> None:
    headers = {"Content-Type": "application/json"}
    async with http.post(gateway.public_url + CHAT, data=raw, headers=headers) as resp:
        assert resp.status == status
        assert resp.headers["x-unitgate-unit"] in {u["id"] for u in clean_sim.units}  # it answered
        answer = await resp.read()
    if needle is not None:
        assert needle in orjson.loads(answer)["error"]["message"]
    # Served once, or refused by the unit's own validation (which the simulator does not count).
    assert await sim_total(http, clean_sim, "requests") == (1 if status == 200 else 0)
