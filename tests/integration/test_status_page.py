"""The status page's server side: the page and its files, and the live stream it reads.

(The page in a real browser: tests/integration/test_status_browser.py.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.server import Gateway, running
from tests.integration.test_admin import admin_config, call
from tests.support import MODEL, SimProcess

pytestmark = pytest.mark.usefixtures("admin_tokens")


async def snapshots(resp: aiohttp.ClientResponse) -> Any:
    """Each `snapshot` event's data, as the stream sends them."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            lines = dict(line.split(b": ", 1) for line in block.split(b"\n"))
            if lines[b"event"] == b"snapshot":
                yield orjson.loads(lines[b"data"])


async def next_where(stream: Any, check: Any, within: float = 3.0) -> dict[str, Any]:
    async with asyncio.timeout(within):
        async for snap in stream:
            if check(snap):
                return dict(snap)
    raise AssertionError("the stream ended")


def unit(snap: dict[str, Any], unit_id: str) -> dict[str, Any]:
    return next(u for u in snap["units"] if u["id"] == unit_id)


async def test_the_page_and_its_files_are_served_without_a_token(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        for path, kind in [
            ("/status", "text/html"),
            ("/status/status.js", "text/javascript"),
            ("/status/charts.js", "text/javascript"),
            ("/status/classes.js", "text/javascript"),
            ("/status/status.css", "text/css"),
        ]:
            async with http.get(gw.metrics_url + path) as resp:
                assert (resp.status, resp.content_type) == (200, kind)
                assert len(await resp.read()) > 200
        async with http.get(gw.metrics_url + "/status/nope.js") as resp:
            assert resp.status == 404
        async with http.get(gw.metrics_url + "/status") as resp:
            page = await resp.text()
        assert "http" not in page.replace("http-equiv", "")  # no CDN: nothing from elsewhere


async def test_the_stream_needs_the_admin_token(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        async with http.get(gw.metrics_url + "/status/stream") as resp:
            assert resp.status == 401
        bad = {"Authorization": "Bearer nope"}
        async with http.get(gw.metrics_url + "/status/stream", headers=bad) as resp:
            assert resp.status == 403


async def test_the_stream_pushes_each_change_at_once(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    # No state file: the timed window must hold the push, not SQLite's fsyncs of the mark,
    # which a busy disk (the suite's other worker) once held for more than a second.
    async with running(admin_config(clean_sim, tmp_path, state_file="")) as gw:
        headers = {"Authorization": "Bearer alice-token"}
        async with http.get(gw.metrics_url + "/status/stream", headers=headers) as resp:
            assert (resp.status, resp.content_type) == (200, "text/event-stream")
            stream = snapshots(resp)
            first = await next_where(stream, lambda s: True, within=1.0)
            assert {u["id"] for u in first["units"]} == {u["id"] for u in clean_sim.units}
            assert unit(first, "u0")["why"] == "routable"
            loop = asyncio.get_running_loop()
            sent = loop.time()
            await call(http, gw, "POST", "/admin/units/u0/disable", {"reason": "disk"})
            snap = await next_where(stream, lambda s: unit(s, "u0")["admin"]["state"] == "disabled")
            assert loop.time() - sent < 0.5  # pushed, not found by a once-a-second refresh
            assert unit(snap, "u0")["why"] == "admin: disabled (disk)"
            assert snap["events"][-1]["what"] == "disable"


async def test_the_stream_carries_each_units_recent_traffic(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        headers = {"Authorization": "Bearer alice-token"}
        async with http.get(gw.metrics_url + "/status/stream", headers=headers) as resp:
            stream = snapshots(resp)
            first = await next_where(stream, lambda s: True, within=1.0)
            assert "traffic" not in first["units"][0]  # one reading of the metrics: no rate yet
            for n in range(12):
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"count to {n}"}],
                    "stream": True,
                    "max_tokens": 8,
                    "stream_options": {"include_usage": True},
                }
                async with http.post(gw.public_url + "/v1/chat/completions", json=body) as chat:
                    assert chat.status == 200
                    await chat.read()
            snap = await next_where(
                stream, lambda s: sum(u.get("traffic", {}).get("rps", 0) for u in s["units"]) > 0
            )
    busy = [u["traffic"] for u in snap["units"] if u["traffic"]["rps"] > 0]
    assert all(t["tokens_per_s"] > 0 and t["ttft_p50"] is not None for t in busy), busy
    assert all(t["ttft_p50"] <= t["ttft_p99"] for t in busy), busy
    assert snap["traffic_window_s"] > 0


async def test_the_stream_carries_the_classes_and_the_top_tenants(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running(admin_config(clean_sim, tmp_path)) as gw:
        headers = {"Authorization": "Bearer alice-token"}
        async with http.get(gw.metrics_url + "/status/stream", headers=headers) as resp:
            stream = snapshots(resp)
            first = await next_where(stream, lambda s: True, within=1.0)
            assert first["tenants"] == []
            assert [k["name"] for k in first["classes"]] == ["standard"]  # no [priority]
            for n in range(14):  # past MIN_REQUESTS: "anonymous" earns its own label
                body = {"model": MODEL, "messages": [{"role": "user", "content": f"hi {n}"}]}
                async with http.post(gw.public_url + "/v1/chat/completions", json=body) as chat:
                    assert chat.status == 200
                    await chat.read()
            snap = await next_where(
                stream, lambda s: any(t["tenant"] == "anonymous" for t in s["tenants"])
            )
    anonymous = next(t for t in snap["tenants"] if t["tenant"] == "anonymous")
    assert anonymous["rps"] > 0 and anonymous["tokens_per_s"] > 0, anonymous
    assert set(anonymous["classes"]) == {"standard"}
    standard = snap["classes"][0]
    assert (standard["waiting"], standard["refused_per_s"]) == (0, 0.0)
    assert standard["wait_p50"] is not None and standard["fairness"] == 1.0


async def test_open_streams_end_when_the_gateway_stops(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    gateway: Gateway
    async with running(admin_config(clean_sim, tmp_path)) as gateway:
        headers = {"Authorization": "Bearer alice-token"}
        resp = await http.get(gateway.metrics_url + "/status/stream", headers=headers)
        await next_where(snapshots(resp), lambda s: True, within=1.0)
        started = asyncio.get_running_loop().time()
    assert asyncio.get_running_loop().time() - started < 3.0  # not the listener's 5 s drain
    assert await resp.content.read() == b""  # ended cleanly
    resp.close()
