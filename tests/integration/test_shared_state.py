"""Replicas that act as one: two gateways sharing their admin state through a real Redis.

Each test runs its own redis-server (tests/redis_support.py) and two gateway replicas in
front of the same simulated units. What one replica's admin API does, the other must do too;
while Redis is away both keep serving on their last state and refuse admin writes with a 503
that names the store; once it is back they converge.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config import Config
from gateway.server import Gateway, running
from tests.integration.test_admin import call, eventually, served_by
from tests.redis_support import RedisServer, redis_server
from tests.support import SimProcess, gateway_config

pytestmark = pytest.mark.usefixtures("admin_tokens")


def shared_config(sim: SimProcess, server: RedisServer, **state: Any) -> Config:
    """Two units of the simulator's: u0 and u1."""
    return gateway_config(
        sim.units[:2],
        admin={"enabled": True},
        state={"backend": "redis", "url": server.url, "key_prefix": "fleet", **state},
    )


@contextlib.asynccontextmanager
async def replicas(config: Config, n: int = 2) -> AsyncIterator[list[Gateway]]:
    """`n` gateways named r0, r1, ... (in one process they would all be "<host>:<pid>")."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(running(named(config, f"r{i}"))) for i in range(n)]


def named(config: Config, replica: str) -> Config:
    return dataclasses.replace(config, state=dataclasses.replace(config.state, replica=replica))


def admin_state(gw: Gateway, unit: str) -> str | None:
    mark = gw.admin.service.marks.get(unit) if gw.admin else None
    return None if mark is None else mark.state


async def test_a_disable_through_one_replica_takes_the_unit_out_of_both(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with replicas(shared_config(clean_sim, store)) as (a, b):
        status, _ = await call(http, a, "POST", "/admin/units/u0/disable", {"reason": "repair"})
        assert status == 200
        await eventually(lambda: _true(not b.units.units["u0"].enabled), within=2.0)
        assert await served_by(http, b, 8) == {"u1"}
        status, view = await call(http, b, "GET", "/admin/units/u0")
        assert (view["admin"]["state"], view["admin"]["who"]) == ("disabled", "alice")
        # ... and back through the other one.
        assert (await call(http, b, "POST", "/admin/units/u0/enable"))[0] == 200
        await eventually(lambda: _true(a.units.units["u0"].enabled), within=2.0)
        assert await served_by(http, a, 16) == {"u0", "u1"}


async def test_units_added_and_removed_at_run_time_reach_every_replica(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    extra = clean_sim.units[1]
    config = gateway_config(
        clean_sim.units[:1],
        admin={"enabled": True},
        state={"backend": "redis", "url": store.url, "key_prefix": "fleet"},
    )
    async with replicas(config) as (a, b):
        body = {"id": "u9", "leader": extra["leader"], "nodes": extra["nodes"]}
        assert (await call(http, a, "POST", "/admin/units", body))[0] == 201
        await eventually(lambda: _true("u9" in b.units.units), within=2.0)
        assert b.units.units["u9"].config.leader == extra["leader"]
        assert (await call(http, b, "DELETE", "/admin/units/u9"))[0] == 200
        await eventually(lambda: _true("u9" not in a.units.units), within=2.0)
        # A unit of the config file, removed through one replica, is gone from both.
        assert (await call(http, b, "DELETE", "/admin/units/u0"))[0] == 200
        await eventually(lambda: _true("u0" not in a.units.units), within=2.0)


async def test_concurrent_writes_through_two_replicas_fall_into_one_order(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    """Twenty writes to the same unit, half through each replica, all at once: both replicas
    end in the state of the last one Redis ordered, and every write got a version."""
    async with replicas(shared_config(clean_sim, store)) as (a, b):
        verbs = ["disable", "enable", "drain", "enable"] * 5
        calls = [
            call(http, (a, b)[i % 2], "POST", f"/admin/units/u0/{verb}", {"reason": f"w{i}"})
            for i, verb in enumerate(verbs)
        ]
        answers = await asyncio.gather(*calls)
        assert {status for status, _ in answers} == {200}, [a for a in answers if a[0] != 200]
        client = store.client()
        version = int(client.get("fleet:version") or 0)
        assert 1 <= version <= len(verbs)  # asking for the current state again writes nothing
        raw = client.hget("fleet:marks", "u0")
        last = "enabled" if raw is None else raw.decode().split('"')[1]
        assert a.admin is not None and b.admin is not None
        services = (a.admin.service, b.admin.service)
        await eventually(lambda: _true(all(s.converged_version == version for s in services)))
        assert admin_state(a, "u0") == admin_state(b, "u0") == last


async def test_redis_down_keeps_serving_refuses_writes_and_converges_when_back(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with replicas(shared_config(clean_sim, store)) as (a, b):
        assert (await call(http, a, "POST", "/admin/units/u1/drain", {"reason": "r"}))[0] == 200
        await eventually(lambda: _true(admin_state(b, "u1") == "draining"))
        store.kill()
        status, body = await call(http, b, "POST", "/admin/units/u0/disable", {"reason": "x"})
        assert status == 503
        assert body["error"]["code"] == "state_store_unavailable"
        assert store.url in body["error"]["message"]
        for gw in (a, b):
            async with http.get(gw.public_url + "/readyz") as resp:
                assert resp.status == 200
            assert await served_by(http, gw, 6) == {"u0"}  # u1 still draining, as agreed
        assert admin_state(b, "u0") == "enabled"  # the refused write was made nowhere
        store.start()
        # Back: a write through one replica reaches the other again.
        await eventually(
            lambda: _status(call(http, a, "POST", "/admin/units/u1/enable"), 200), within=5.0
        )
        await eventually(lambda: _true(admin_state(b, "u1") == "enabled"), within=2.0)


async def test_a_replica_started_while_redis_is_down_serves_its_config_then_converges(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    config = shared_config(clean_sim, store)
    async with running(config) as a:
        assert (await call(http, a, "POST", "/admin/units/u0/disable", {"reason": "r"}))[0] == 200
    store.kill()
    async with running(config) as late:
        assert admin_state(late, "u0") == "enabled"  # from its config: nothing else to go by
        async with http.get(late.public_url + "/readyz") as resp:
            assert resp.status == 200
        refused = await call(http, late, "POST", "/admin/units/u1/disable", {"reason": "x"})
        assert refused[0] == 503
        store.start()
        await eventually(lambda: _true(admin_state(late, "u0") == "disabled"), within=5.0)


async def test_nothing_is_read_or_written_without_the_password(
    clean_sim: SimProcess,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with redis_server(tmp_path / "locked", password="s3cret") as locked:
        monkeypatch.setenv("UNITGATE_REDIS_PASSWORD", "wrong")
        async with running(shared_config(clean_sim, locked)) as gw:
            status, body = await call(http, gw, "POST", "/admin/units/u0/disable", {"reason": "x"})
            assert status == 503 and "unreachable" in body["error"]["message"]
        password_file = tmp_path / "password"
        password_file.write_text("s3cret\n")
        monkeypatch.delenv("UNITGATE_REDIS_PASSWORD")
        config = shared_config(clean_sim, locked, password_file=str(password_file))
        async with running(config) as gw:
            done = await call(http, gw, "POST", "/admin/units/u0/disable", {"reason": "x"})
            assert done[0] == 200
        assert locked.client().hget("fleet:marks", "u0") is not None


async def _true(value: bool) -> bool:
    return value


async def _status(request: Any, expected: int) -> bool:
    status, _ = await request
    return bool(status == expected)


async def test_an_unreadable_record_leaves_the_last_state_and_the_follower_alive(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    """A record this gateway cannot read (a newer one's state, or junk) is logged and the
    replica keeps its last state; once the record is mended it converges again."""
    async with replicas(shared_config(clean_sim, store), n=1) as (gw,):
        client = store.client()
        client.hset("fleet:marks", "u0", b'["hibernating", "", "x", 0]')
        client.incr("fleet:version")
        client.publish("fleet:changes", b"changed")
        await asyncio.sleep(0.3)  # what a replica would have done by now: nothing
        assert admin_state(gw, "u0") == "enabled"
        client.hset("fleet:marks", "u0", b'["disabled", "fixed", "x", 0]')
        client.incr("fleet:version")
        client.publish("fleet:changes", b"changed")
        await eventually(lambda: _true(admin_state(gw, "u0") == "disabled"), within=5.0)
