"""CORS on the public API (`[gateway].cors_origins`), with real requests through a real gateway
in front of the simulator: preflights, plain and streamed answers, errors, and origins that are
not on the list."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.config import ConfigError
from gateway.cors import allow_headers, allowed_origin
from gateway.server import Gateway, running
from tests.support import SimProcess, chat_body, gateway_config, sse_events

pytestmark = pytest.mark.both_relays

APP = "https://app.example"
CHAT = "/v1/chat/completions"
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
}


@pytest.fixture
async def gateway(clean_sim: SimProcess) -> AsyncIterator[Gateway]:
    config = gateway_config(clean_sim.units, gateway={"cors_origins": [APP]})
    async with running(config) as gw:
        yield gw


def cors(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith("access-control-")}


async def test_a_preflight_from_an_allowed_origin_is_answered(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    async with http.options(gateway.public_url + CHAT, headers=PREFLIGHT) as resp:
        assert resp.status == 204
        got = cors(resp.headers)
        assert "Origin" in resp.headers["Vary"]
    assert got["access-control-allow-origin"] == APP
    assert {"POST", "GET", "OPTIONS"} <= set(got["access-control-allow-methods"].split(", "))
    allowed = {h.lower() for h in got["access-control-allow-headers"].split(", ")}
    assert {"authorization", "content-type", "x-stainless-os"} <= allowed
    assert int(got["access-control-max-age"]) > 0


async def test_a_stream_carries_cors_headers_before_its_first_byte(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    url = gateway.public_url + CHAT
    async with http.post(url, json=chat_body(), headers={"Origin": APP}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["Access-Control-Allow-Origin"] == APP
        assert "Origin" in resp.headers["Vary"]
        assert "X-Request-Id" in resp.headers["Access-Control-Expose-Headers"]
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    async with http.post(url, json=chat_body(stream=False), headers={"Origin": APP}) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == APP


async def test_errors_and_gets_carry_them_too(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    base, origin = gateway.public_url, {"Origin": APP}
    async with http.get(base + "/v1/models", headers=origin) as resp:
        assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == APP
    async with http.post(base + CHAT, json={"model": "nope"}, headers=origin) as resp:
        assert resp.status == 404 and resp.headers["Access-Control-Allow-Origin"] == APP
    async with http.get(base + "/nowhere", headers=origin) as resp:
        assert resp.status == 404 and resp.headers["Access-Control-Allow-Origin"] == APP


async def test_other_origins_get_no_cors_headers(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    base, evil = gateway.public_url, "https://evil.example"
    async with http.options(base + CHAT, headers={**PREFLIGHT, "Origin": evil}) as resp:
        assert resp.status == 405 and cors(resp.headers) == {}
    async with http.post(base + CHAT, json=chat_body(), headers={"Origin": evil}) as resp:
        assert resp.status == 200 and cors(resp.headers) == {}
        await resp.read()
    async with http.get(base + "/v1/models") as resp:  # no Origin: not a browser's request
        assert cors(resp.headers) == {}
        assert "Origin" in resp.headers["Vary"]  # a cache keeps the two answers apart


async def test_any_origin_with_a_star(clean_sim: SimProcess, http: aiohttp.ClientSession) -> None:
    config = gateway_config(clean_sim.units, gateway={"cors_origins": ["*"]})
    async with running(config) as gw:
        headers = {**PREFLIGHT, "Origin": "http://localhost:5173"}
        async with http.options(gw.public_url + CHAT, headers=headers) as resp:
            assert resp.status == 204
            assert resp.headers["Access-Control-Allow-Origin"] == "*"
        async with http.post(gw.public_url + CHAT, json=chat_body(), headers=headers) as resp:
            assert resp.headers["Access-Control-Allow-Origin"] == "*"
            await resp.read()


async def test_no_origins_no_cors(clean_sim: SimProcess, http: aiohttp.ClientSession) -> None:
    async with running(gateway_config(clean_sim.units)) as gw:
        async with http.options(gw.public_url + CHAT, headers=PREFLIGHT) as resp:
            assert resp.status == 405 and cors(resp.headers) == {}
            assert "Vary" not in resp.headers
        async with http.post(gw.public_url + CHAT, json=chat_body(), headers=PREFLIGHT) as resp:
            assert resp.status == 200 and cors(resp.headers) == {}
            await resp.read()


def test_the_origin_policy() -> None:
    listed = frozenset({APP})
    assert allowed_origin(listed, APP) == APP
    assert allowed_origin(listed, APP + ":8443") is None
    assert allowed_origin(listed, "http://app.example") is None
    assert allowed_origin(listed, None) is None
    assert allowed_origin(frozenset({"*", APP}), APP) == APP
    assert allowed_origin(frozenset({"*"}), "null") == "*"
    assert allow_headers(" X-A ,authorization,, x-a") == (
        "Authorization, Content-Type, X-Request-Id, X-Session-Id, X-A"
    )


@pytest.mark.parametrize("origin", ["app.example", "https://app.example/", "ftp://x", "https://"])
def test_a_bad_origin_is_a_config_error(origin: str) -> None:
    with pytest.raises(ConfigError, match=r"\[gateway\]\.cors_origins must be"):
        gateway_config([], gateway={"cors_origins": [origin]})
