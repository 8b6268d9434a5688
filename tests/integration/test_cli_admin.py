"""`unitgate admin` against a real gateway: flags after the verb, and `drain --wait` holding on
while a real stream is in flight on the unit, then letting go once it ends."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gateway.server import Gateway, running
from tests.integration.test_shared_state import replicas, shared_config
from tests.redis_support import RedisServer
from tests.support import ROOT, SimProcess, chat_body, gateway_config

pytestmark = pytest.mark.usefixtures("admin_tokens")  # alice:alice-token, bob:bob-token


@pytest.fixture
async def gateway(clean_sim: SimProcess, tmp_path: Path) -> AsyncIterator[Gateway]:
    admin_state = {"enabled": True, "state_file": str(tmp_path / "admin.sqlite3")}
    config = gateway_config(clean_sim.units, admin=admin_state)
    async with running(config) as gw:
        yield gw


async def admin(*args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if k != "UNITGATE_ADMIN_TOKEN"}
    env["MY_TOKEN"] = "alice-token"
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "gateway", "admin", *args),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finished(proc: asyncio.subprocess.Process, within: float = 30) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), within)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@asynccontextmanager
async def stalled_stream(gw: Gateway, sim: SimProcess) -> AsyncIterator[str]:
    """A stream that stays in flight (its unit stops after one token) until the block ends
    and its client goes away; yields the unit it runs on."""
    for unit in sim.units:
        sim.fault(unit["id"], "stall", after_tokens=1)
    async with aiohttp.ClientSession() as client:
        resp = await client.post(gw.public_url + "/v1/chat/completions", json=chat_body())
        assert resp.status == 200, await resp.text()
        await resp.content.readany()  # the first token: the stream is running
        unit_id = resp.headers["x-unitgate-unit"]
        assert gw.units.units[unit_id].inflight == 1
        try:
            yield unit_id
        finally:
            resp.connection.transport.abort()  # type: ignore[union-attr]  # the client vanishes
            resp.close()


async def test_global_flags_work_after_the_verb(gateway: Gateway) -> None:
    url = gateway.metrics_url
    proc = await admin("units", "--json", "--url", url, "--token-env", "MY_TOKEN", "--timeout", "5")
    code, out, err = await finished(proc)
    assert code == 0, err
    assert [u["id"] for u in json.loads(out)["units"]] == ["u0", "u1", "u2"]
    # Before and after together: each flag where it is given, none reset by the other side.
    proc = await admin("--url", url, "unit", "u1", "--token-env", "MY_TOKEN", "--json")
    code, out, err = await finished(proc)
    assert code == 0, err
    assert json.loads(out)["id"] == "u1"


async def test_drain_wait_returns_once_the_stream_ends(
    gateway: Gateway, clean_sim: SimProcess
) -> None:
    url = gateway.metrics_url
    async with stalled_stream(gateway, clean_sim) as unit_id:
        proc = await admin("drain", unit_id, "--wait", "--url", url, "--token-env", "MY_TOKEN")
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        assert line.decode().strip() == f"waiting for {unit_id} to drain: 1 in flight"
        await asyncio.sleep(1.0)  # several looks at the unit, each finding the stream
        assert proc.returncode is None, "drain --wait returned while a stream was in flight"
        assert gateway.units.units[unit_id].draining
        ended = time.monotonic()
    code, out, err = await finished(proc)
    assert code == 0, err
    assert time.monotonic() - ended < 5
    assert out.strip().startswith(f"{unit_id}: drained, 0 in flight, not routable")


async def test_drain_wait_times_out_naming_what_is_in_flight(
    gateway: Gateway, clean_sim: SimProcess
) -> None:
    url = gateway.metrics_url
    async with stalled_stream(gateway, clean_sim) as unit_id:
        started = time.monotonic()
        proc = await admin(
            *("--url", url, "--token-env", "MY_TOKEN"),
            *("drain", unit_id, "--wait", "--timeout", "1", "--json"),
        )
        code, out, err = await finished(proc)
        assert code == 1
        assert out == ""
        assert err.splitlines()[-1] == (
            f"unitgate admin: {unit_id} not drained after 1 s: 1 in flight"
        )
        assert time.monotonic() - started < 15
        assert gateway.units.units[unit_id].inflight == 1  # it was left to run


async def test_drain_wait_of_an_idle_unit_returns_at_once(gateway: Gateway) -> None:
    url = gateway.metrics_url
    proc = await admin("drain", "u2", "--wait", "--json", "--url", url, "--token-env", "MY_TOKEN")
    code, out, err = await finished(proc)
    assert code == 0, err
    view = json.loads(out)
    assert (view["admin"]["state"], view["drained"]) == ("drained", True)
    assert err == ""


async def test_drain_wait_counts_every_replica(clean_sim: SimProcess, store: RedisServer) -> None:
    """Asked through replica r0 while the stream runs through r1: r0 has nothing in flight,
    but the fleet has, so the wait holds until r1's stream ends."""
    async with replicas(shared_config(clean_sim, store)) as (a, b):
        async with stalled_stream(b, clean_sim) as unit_id:
            proc = await admin(
                *("drain", unit_id, "--wait", "--url", a.metrics_url, "--token-env", "MY_TOKEN")
            )
            assert proc.stderr is not None
            said = ""
            while "(r1: 1)" not in said:  # r1's report can take a heartbeat to arrive
                said = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
                assert said, "drain --wait ended without naming r1's stream"
            assert (
                said.strip()
                == f"waiting for {unit_id} to drain: 1 in flight across the fleet (r1: 1)"
            )
            await asyncio.sleep(1.0)
            assert proc.returncode is None, "drain --wait returned while r1 streamed"
            assert a.units.units[unit_id].inflight == 0  # r0's own count alone would say done
        code, out, err = await finished(proc)
        assert code == 0, err
        assert out.strip().startswith(f"{unit_id}: drained, 0 in flight")
