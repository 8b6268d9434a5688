"""The admin API on a real gateway in front of the simulated units: auth, actions, persistence."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.admin.errors import AdminStartError
from gateway.config import Config
from gateway.server import Gateway, running
from tests.support import SimProcess, chat_body, gateway_config

CHAT = "/v1/chat/completions"


pytestmark = pytest.mark.usefixtures("admin_tokens")


def admin_config(sim: SimProcess, tmp_path: Path, **admin: Any) -> Config:
    state = str(tmp_path / "admin.sqlite3")
    return gateway_config(sim.units, admin={"enabled": True, "state_file": state, **admin})


async def call(
    http: aiohttp.ClientSession,
    gw: Gateway,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = "alice-token",
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.request(method, gw.metrics_url + path, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def served_by(http: aiohttp.ClientSession, gw: Gateway, n: int) -> set[str]:
    async def one() -> str:
        body = chat_body(stream=False, max_tokens=1)
        async with http.post(gw.public_url + CHAT, json=body) as resp:
            assert resp.status == 200
            return resp.headers["x-unitgate-unit"]

    return set(await asyncio.gather(*(one() for _ in range(n))))


async def open_stream(http: aiohttp.ClientSession, gw: Gateway) -> aiohttp.ClientResponse:
    """A stream that stays in flight for about a second (the sim was slowed down)."""
    resp = await http.post(gw.public_url + CHAT, json=chat_body(max_tokens=25))
    assert resp.status == 200
    await resp.content.readany()
    return resp


def slow_down(sim: SimProcess) -> None:
    for unit in sim.units:
        sim.post(f"/units/{unit['id']}/settings", {"itl_ms": 40, "tokens": 25})


async def test_auth(clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        async with http.get(gw.metrics_url + "/admin/units") as resp:
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await resp.json())["error"]["type"] == "authentication_error"
        headers = {"Authorization": "Basic YWxpY2U6eA=="}
        async with http.get(gw.metrics_url + "/admin/units", headers=headers) as resp:
            assert resp.status == 401
        status, body = await call(http, gw, "GET", "/admin/units", token="nope")
        assert (status, body["error"]["code"]) == (403, "invalid_token")
        assert (await call(http, gw, "GET", "/admin/units", token="bob-token"))[0] == 200
        async with http.get(gw.metrics_url + "/metrics") as resp:
            assert resp.status == 200  # never behind the admin token
        status, body = await call(http, gw, "POST", "/admin/units/u0/disable", {"reason": "m"}, "x")
        assert status == 403
        assert gw.units.units["u0"].enabled


async def test_refuses_to_start_without_a_token(
    clean_sim: SimProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UNITGATE_ADMIN_TOKEN")
    with pytest.raises(AdminStartError, match=r"\[admin\]\.token_env.*UNITGATE_ADMIN_TOKEN"):
        async with running(admin_config(clean_sim, tmp_path)):
            pass


async def test_loopback_dev_mode_needs_no_token(
    clean_sim: SimProcess,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("UNITGATE_ADMIN_TOKEN")
    config = admin_config(clean_sim, tmp_path, allow_unauthenticated_loopback=True)
    with caplog.at_level(logging.WARNING, logger="unitgate.admin"):
        async with running(config) as gw:
            status, unit = await call(http, gw, "POST", "/admin/units/u0/disable", {"reason": "x"})
            assert status == 200
            assert unit["admin"]["who"] == "local"
    assert "WITHOUT authentication" in caplog.text


async def test_admin_disabled_serves_no_admin_routes(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(admin_config(clean_sim, tmp_path, enabled=False)) as gw:
        assert (await call(http, gw, "GET", "/admin/units"))[0] == 404
    assert not (tmp_path / "admin.sqlite3").exists()


async def test_list_units_shape(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        status, body = await call(http, gw, "GET", "/admin/units")
        one = (await call(http, gw, "GET", "/admin/units/u1"))[1]
    assert status == 200
    assert [u["id"] for u in body["units"]] == ["u0", "u1", "u2"]
    unit = body["units"][1]
    assert unit == one
    assert {
        "id",
        "routable",
        "health",
        "breaker",
        "admin",
        "in_flight",
        "drained",
        "leader",
    } <= set(unit)
    assert {"weight", "cap", "nodes"} <= set(unit)
    assert unit["routable"] is True and unit["in_flight"] == 0 and unit["drained"] is False
    assert unit["health"] == {"state": "healthy", "healthy": True, "hard": False, "reason": ""}
    assert unit["panic_routed"] is False and body["panic"] == {}
    assert unit["breaker"]["state"] == "admitting"
    assert unit["admin"]["state"] == "enabled" and unit["admin"]["who"] == "config"
    assert unit["leader"] == clean_sim.units[1]["leader"]
    assert [n["url"] for n in unit["nodes"]] == clean_sim.units[1]["nodes"]
    assert set(unit["nodes"][0]) == {
        *("url", "role", "rank", "healthy", "latency_ms", "error"),
        *("step", "pending", "kv_usage"),
    }
    assert unit["kind"] == "unitgate" and unit["served_model"] is None
    assert [n["role"] for n in unit["nodes"]] == ["leader", "follower"]


async def test_disable_stops_new_requests_and_lets_streams_finish(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    slow_down(clean_sim)
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        stream = await open_stream(http, gw)
        busy = stream.headers["x-unitgate-unit"]
        path = f"/admin/units/{busy}/disable"
        status, unit = await call(http, gw, "POST", path, {"reason": "kernel upgrade"})
        assert status == 200
        assert unit["routable"] is False and unit["admin"]["state"] == "disabled"
        assert unit["in_flight"] == 1 and unit["drained"] is False
        assert busy not in await served_by(http, gw, 12)
        text = (await stream.read()).decode()
        assert "tok24 " in text and text.endswith("data: [DONE]\n\n")


async def test_drain_then_enable(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    slow_down(clean_sim)
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        stream = await open_stream(http, gw)
        busy = stream.headers["x-unitgate-unit"]
        status, unit = await call(http, gw, "POST", f"/admin/units/{busy}/drain")
        assert status == 200
        assert (unit["admin"]["state"], unit["in_flight"], unit["drained"]) == (
            "draining",
            1,
            False,
        )
        assert busy not in await served_by(http, gw, 12)
        assert (await stream.read()).endswith(b"data: [DONE]\n\n")

        async def drained() -> bool:
            unit = (await call(http, gw, "GET", f"/admin/units/{busy}"))[1]
            return bool(unit["drained"]) and unit["admin"]["state"] == "drained"

        await eventually(drained)
        status, unit = await call(http, gw, "POST", f"/admin/units/{busy}/enable", {})
        assert (status, unit["admin"]["state"], unit["routable"]) == (200, "enabled", True)
        assert busy in await served_by(http, gw, 30)


async def test_add_and_remove(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    slow_down(clean_sim)
    sim_unit = clean_sim.units[0]
    new = {"id": "u9", "leader": sim_unit["leader"], "nodes": sim_unit["nodes"], "weight": 2}
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        status, unit = await call(http, gw, "POST", "/admin/units", new)
        assert status == 201
        # No prober runs here: like the configured units, it is taken as healthy.
        assert (unit["id"], unit["weight"], unit["routable"]) == ("u9", 2.0, True)
        assert unit["health"]["state"] == "healthy"
        listed = (await call(http, gw, "GET", "/admin/units"))[1]["units"]
        assert [u["id"] for u in listed] == ["u0", "u1", "u2", "u9"]
        status, body = await call(http, gw, "POST", "/admin/units", new)
        assert (status, body["error"]["code"]) == (409, "unit_exists")

        stream = await open_stream(http, gw)
        busy = stream.headers["x-unitgate-unit"]
        status, body = await call(http, gw, "DELETE", f"/admin/units/{busy}")
        assert (status, body) == (200, {"id": busy, "removed": True, "in_flight": 1})
        assert (await stream.read()).endswith(b"data: [DONE]\n\n")
        assert (await call(http, gw, "GET", f"/admin/units/{busy}"))[0] == 404
        assert busy not in await served_by(http, gw, 12)
        if busy != "u9":  # u9 is routable at once here, so the stream may have been its
            assert (await call(http, gw, "DELETE", "/admin/units/u9"))[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("GET", "/admin/units/nope", None, 404, "unknown unit 'nope'"),
        ("POST", "/admin/units/nope/drain", None, 404, "unknown unit 'nope'"),
        ("DELETE", "/admin/units/nope", None, 404, "unknown unit 'nope'"),
        ("POST", "/admin/units/u0/disable", None, 400, "JSON body is required"),
        ("POST", "/admin/units/u0/disable", {"reason": " "}, 400, "[body].reason is required"),
        ("POST", "/admin/units/u0/disable", {"reason": 3}, 400, "[body].reason must be a string"),
        ("POST", "/admin/units/u0/drain", {"why": "x"}, 400, "unknown key [body].why"),
        ("POST", "/admin/units/u0/drain", [1], 400, "must be a JSON object"),
        ("POST", "/admin/units", {"id": "u7"}, 400, "missing required key [body].leader"),
        ("POST", "/admin/units", {"id": "u7", "leader": "ftp://x"}, 400, "[body].leader"),
        ("POST", "/admin/units", {"id": "u7", "leader": "http://h:1", "weight": 0}, 400, "weight"),
        ("POST", "/admin/units", {"id": "u7", "leader": "http://h:1", "x": 1}, 400, "[body].x"),
        ("POST", "/admin/units", {"id": "u7", "leader": "http://h:1", "models": ["m"]}, 400, "m"),
        ("POST", "/admin/units", {"id": "u0", "leader": "http://h:1"}, 409, "already exists"),
        ("GET", "/admin/events?limit=zero", None, 400, "limit must be a positive integer"),
    ],
)
async def test_errors(
    clean_sim: SimProcess,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    body: Any,
    status: int,
    message: str,
) -> None:
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        got, answer = await call(http, gw, method, path, body)
        assert set(gw.units.units) == {"u0", "u1", "u2"}
        assert all(u.routable for u in gw.units.units.values())
    assert got == status
    assert message in answer["error"]["message"]
    assert {"message", "type", "code"} <= set(answer["error"])


async def test_invalid_json_is_400(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    headers = {"Authorization": "Bearer alice-token", "Content-Type": "application/json"}
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        url = gw.metrics_url + "/admin/units/u0/disable"
        async with http.post(url, data=b"{reason", headers=headers) as resp:
            assert resp.status == 400
            assert "not valid JSON" in (await resp.json())["error"]["message"]


async def test_events_log(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        await call(http, gw, "POST", "/admin/units/u0/disable", {"reason": "disk"})
        await call(http, gw, "POST", "/admin/units/u0/disable", {"reason": "again"})  # no change
        await call(http, gw, "POST", "/admin/units/u1/drain", {"reason": "move"}, "bob-token")
        await call(http, gw, "POST", "/admin/units/u0/enable", None, "bob-token")
        status, body = await call(http, gw, "GET", "/admin/events")
        _, latest_u0 = await call(http, gw, "GET", "/admin/events?unit=u0&limit=1")
    assert status == 200
    assert [(e["unit"], e["what"], e["reason"], e["who"]) for e in body["events"]] == [
        ("u0", "disable", "disk", "alice"),
        ("u1", "drain", "move", "bob"),
        ("u0", "enable", "", "bob"),
    ]
    assert [e["what"] for e in latest_u0["events"]] == ["enable"]
    assert set(body["events"][0]) == {"time", "unit", "what", "reason", "who"}


async def test_overrides_survive_a_restart(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    config = admin_config(clean_sim, tmp_path)
    new = {"id": "u9", "leader": clean_sim.units[0]["leader"], "max_inflight": 5}
    async with running(config) as gw:
        await call(http, gw, "POST", "/admin/units/u0/disable", {"reason": "bad GPU"})
        await call(http, gw, "POST", "/admin/units/u1/drain", {"reason": "move"}, "bob-token")
        await call(http, gw, "POST", "/admin/units", new)
        await call(http, gw, "DELETE", "/admin/units/u2")
    async with running(config) as gw:
        units = {u["id"]: u for u in (await call(http, gw, "GET", "/admin/units"))[1]["units"]}
        events = (await call(http, gw, "GET", "/admin/events"))[1]["events"]
        await call(http, gw, "POST", "/admin/units/u0/enable")
    assert sorted(units) == ["u0", "u1", "u9"]
    assert units["u0"]["admin"] | {"since": 0} == {
        "state": "disabled",
        "reason": "bad GPU",
        "who": "alice",
        "since": 0,
    }
    assert (units["u1"]["admin"]["state"], units["u1"]["admin"]["who"]) == ("drained", "bob")
    assert not units["u0"]["routable"] and not units["u1"]["routable"]
    assert (units["u9"]["cap"], units["u9"]["routable"]) == (5, True)  # no prober here
    assert sorted((e["unit"], e["what"]) for e in events) == [
        ("u0", "restored"),
        ("u1", "restored"),
        ("u2", "restored"),
        ("u9", "restored"),
    ]
    async with running(config) as gw:
        assert gw.units.units["u0"].routable and not gw.units.units["u1"].routable


async def test_corrupt_state_file_is_a_clear_start_error(
    clean_sim: SimProcess, tmp_path: Path
) -> None:
    state = tmp_path / "admin.sqlite3"
    state.write_bytes(b"this is not a database, it is a note to self\n" * 100)
    with pytest.raises(AdminStartError, match=r"\[admin\]\.state_file .*admin\.sqlite3"):
        async with running(admin_config(clean_sim, tmp_path)):
            pass
