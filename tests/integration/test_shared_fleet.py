"""The fleet as one: drain judged over every replica, and one events log for all of them.

Real redis-server, real gateway replicas (in this process, named r0 and r1) in front of the
simulated units. A drain is `drained: true` only once no live replica has a request on the
unit, a replica that went silent stops counting when its report expires, and every replica's
events, admin actions and health verdicts alike, are in one log in one order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import aiohttp
import orjson
import pytest
import redis

from gateway.server import Gateway, running
from tests.integration.test_admin import CHAT, call, eventually, slow_down
from tests.integration.test_shared_state import named, replicas, shared_config
from tests.redis_support import RedisServer
from tests.support import SimProcess, chat_body

pytestmark = pytest.mark.usefixtures("admin_tokens")


async def open_stream(
    http: aiohttp.ClientSession, gw: Gateway, tokens: int
) -> aiohttp.ClientResponse:
    resp = await http.post(gw.public_url + CHAT, json=chat_body(max_tokens=tokens))
    assert resp.status == 200
    await resp.content.readany()  # its first bytes: it is in flight on the unit
    return resp


async def unit(http: aiohttp.ClientSession, gw: Gateway, unit_id: str) -> dict[str, Any]:
    status, view = await call(http, gw, "GET", f"/admin/units/{unit_id}")
    assert status == 200
    return dict(view)


async def test_drained_only_once_the_last_replica_has_nothing_in_flight(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    slow_down(clean_sim)  # 40 ms between tokens
    async with replicas(shared_config(clean_sim, store)) as (a, b):
        assert (await call(http, a, "POST", "/admin/units/u1/disable", {"reason": "r"}))[0] == 200
        await eventually(lambda: _true(not b.units.units["u1"].enabled), within=2.0)
        long = await open_stream(http, b, 75)  # about 3 s, through r1
        short = await open_stream(http, a, 20)  # about 0.8 s, through r0
        assert long.headers["x-unitgate-unit"] == short.headers["x-unitgate-unit"] == "u0"

        status, view = await call(http, a, "POST", "/admin/units/u0/drain")
        assert status == 200
        assert (view["admin"]["state"], view["drained"]) == ("draining", False)

        # r1's report comes as soon as it has applied the drain (before, it is not current).
        async def both_stream() -> bool:
            fleet = (await unit(http, a, "u0"))["fleet"]
            counts = {r: v["in_flight"] for r, v in fleet["replicas"].items()}
            return bool(fleet["current"]) and counts == {"r0": 1, "r1": 1}

        await eventually(both_stream, within=0.5)
        assert (await short.read()).endswith(b"data: [DONE]\n\n")

        # r0 has nothing left; r1 has applied the drain and still streams: not drained.
        async def only_r1_streams() -> bool:
            fleet = (await unit(http, a, "u0"))["fleet"]
            return bool(fleet["current"]) and fleet["in_flight"] == 1

        await eventually(only_r1_streams, within=2.0)
        for gw in (a, b):
            view = await unit(http, gw, "u0")
            assert (view["admin"]["state"], view["drained"]) == ("draining", False)
            assert view["in_flight"] == (0 if gw is a else 1)  # this replica's own count

        assert (await long.read()).endswith(b"data: [DONE]\n\n")
        for gw in (a, b):
            await eventually(lambda g=gw: _drained(http, g, "u0"), within=2.0)  # type: ignore[misc]


async def test_a_silent_replica_counts_until_its_report_expires(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    """A replica that crashed with a stream in flight: its last report holds the drain back
    for replica_ttl, then it is gone. An unreadable report never lets a drain through."""
    async with replicas(shared_config(clean_sim, store, replica_ttl=1.0), n=1) as (gw,):
        assert (await call(http, gw, "POST", "/admin/units/u0/drain"))[0] == 200
        await eventually(lambda: _drained(http, gw, "u0"), within=2.0)
        client = store.client()
        ghost = orjson.dumps([10**6, time.time(), {"u0": 1}])
        client.set("fleet:replica:ghost", ghost, px=800)
        client.sadd("fleet:replicas", "ghost")
        view = await unit(http, gw, "u0")
        assert view["drained"] is False and view["fleet"]["replicas"]["ghost"]["in_flight"] == 1
        started = time.monotonic()
        await eventually(lambda: _drained(http, gw, "u0"), within=3.0)
        assert time.monotonic() - started > 0.3  # held back until the key expired
        assert "ghost" not in (await unit(http, gw, "u0"))["fleet"]["replicas"]
        assert not client.sismember("fleet:replicas", "ghost")  # forgotten once read expired

        client.set("fleet:replica:junk", b"not json", px=60_000)
        client.sadd("fleet:replicas", "junk")
        view = await unit(http, gw, "u0")
        assert (view["drained"], view["fleet"]["current"]) == (False, False)


async def test_with_redis_away_nothing_is_called_drained(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with replicas(shared_config(clean_sim, store), n=1) as (gw,):
        assert (await call(http, gw, "POST", "/admin/units/u0/drain"))[0] == 200
        await eventually(lambda: _drained(http, gw, "u0"), within=2.0)
        store.kill()
        view = await unit(http, gw, "u0")
        assert (view["admin"]["state"], view["drained"]) == ("draining", False)
        assert store.url in view["fleet"]["error"]
        store.start()
        await eventually(lambda: _drained(http, gw, "u0"), within=5.0)


async def test_a_stopped_replica_leaves_the_fleet_at_once(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with replicas(shared_config(clean_sim, store), n=1) as (a,):
        async with replicas(shared_config(clean_sim, store), n=2) as (_, b):
            await eventually(lambda: _replicas(http, a, {"r0", "r1"}), within=2.0)
            assert b.admin is not None
        client = store.client()
        assert client.get("fleet:replica:r1") is None  # removed at its stop, not expired
        assert await _replicas(http, a, {"r0"})


async def test_one_events_log_for_the_fleet_in_the_order_writes_took_effect(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    config = shared_config(clean_sim, store)
    probed = dataclasses.replace(config, health=dataclasses.replace(config.health, enabled=True))
    async with replicas(probed) as (a, b):
        # Each replica's own probers judge both units, and their verdicts reach the shared log
        # from a queue in their own time (CI once read one between the two replicas' reads).
        # Awaited first: both replicas' verdicts are in, and after them the log only grows.

        async def verdicts_from_both() -> bool:
            events = (await call(http, a, "GET", "/admin/events?limit=1000"))[1]["events"]
            judged = {(e["replica"], e["unit"]) for e in events if e["who"] == "prober"}
            return judged == {(r, u) for r in ("r0", "r1") for u in ("u0", "u1")}

        await eventually(verdicts_from_both, within=5.0)
        writes = [
            call(http, a, "POST", "/admin/units/u0/disable", {"reason": "disk"}),
            call(http, b, "POST", "/admin/units/u1/drain", {"reason": "move"}, "bob-token"),
        ]
        assert [status for status, _ in await asyncio.gather(*writes)] == [200, 200]
        logs = [(await call(http, gw, "GET", "/admin/events"))[1] for gw in (a, b)]
        assert [log["source"] for log in logs] == ["shared", "shared"]
        # One log: what a answered is what b answered (read later, it may have grown since).
        assert logs[0]["events"] == logs[1]["events"][: len(logs[0]["events"])]
        admin = [
            (e["unit"], e["what"], e["reason"], e["who"], e["replica"])
            for e in logs[0]["events"]
            if e["what"] in ("disable", "drain")
        ]
        assert sorted(admin) == [
            ("u0", "disable", "disk", "alice", "r0"),
            ("u1", "drain", "move", "bob", "r1"),
        ]
        # Many writes to one unit through both replicas at once: one entry per version, and
        # the log's last entry is the state both replicas ended in (the log's order is theirs).
        verbs = ["disable", "enable", "drain", "enable"] * 3
        writes = [
            call(http, (a, b)[i % 2], "POST", f"/admin/units/u0/{verb}", {"reason": f"w{i}"})
            for i, verb in enumerate(verbs)
        ]
        assert {status for status, _ in await asyncio.gather(*writes)} == {200}
        version = int(store.client().get("fleet:version") or 0)
        events = (await call(http, a, "GET", "/admin/events?limit=1000"))[1]["events"]
        admin = [e for e in events if e["who"] in ("alice", "bob")]
        assert len(admin) == version
        services = [gw.admin.service for gw in (a, b) if gw.admin is not None]
        await eventually(lambda: _true(all(s.converged_version == version for s in services)))
        final = {"disable": "disabled", "enable": "enabled", "drain": "draining"}
        assert {s.marks["u0"].state for s in services} == {final[admin[-1]["what"]]}
        # Filtered by unit, newest `limit`, oldest first, as for one gateway.
        status, latest = await call(http, b, "GET", "/admin/events?unit=u1&limit=2")
        assert [e["unit"] for e in latest["events"]] == ["u1", "u1"]
        all_u1 = (await call(http, b, "GET", "/admin/events?unit=u1&limit=1000"))[1]["events"]
        assert latest["events"] == all_u1[-2:]
        # Applying a shared write is not a second entry: one drain of u1 in the log.
        assert [e["what"] for e in all_u1].count("drain") == 1

        store.kill()
        status, local = await call(http, a, "GET", "/admin/events")
        assert (status, local["source"]) == (200, "local")
        assert store.url in local["warning"]
        assert ("u0", "disable") in [(e["unit"], e["what"]) for e in local["events"]]


async def test_events_seen_while_redis_is_away_reach_the_shared_log_when_it_is_back(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with replicas(shared_config(clean_sim, store), n=1) as (gw,):
        store.kill()
        gw.events.record("u0", "resume_done", "request 7: moved to u1", "gateway")
        store.start()

        async def shared() -> bool:
            status, body = await call(http, gw, "GET", "/admin/events")
            if status != 200 or body.get("source") != "shared":
                return False
            return ("u0", "resume_done", "r0") in [
                (e["unit"], e["what"], e["replica"]) for e in body["events"]
            ]

        await eventually(shared, within=5.0)


async def _drained(http: aiohttp.ClientSession, gw: Gateway, unit_id: str) -> bool:
    view = await unit(http, gw, unit_id)
    return bool(view["drained"]) and view["admin"]["state"] == "drained"


async def _replicas(http: aiohttp.ClientSession, gw: Gateway, names: set[str]) -> bool:
    return set((await unit(http, gw, "u0"))["fleet"]["replicas"]) == names


async def _true(value: bool) -> bool:
    return value


# The README's ACL for the gateway's Redis user, with the test's key prefix.
ACL = ["on", ">gw-pass", "~fleet:*", "&fleet:*", "+@read", "+@write", "+@transaction"]
ACL += ["+@pubsub", "+@connection", "-@dangerous"]


async def test_the_documented_acl_is_all_the_gateway_needs_and_nothing_more(
    clean_sim: SimProcess,
    store: RedisServer,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = store.client()
    admin.execute_command("ACL", "SETUSER", "gw", *ACL)
    monkeypatch.setenv("UNITGATE_REDIS_PASSWORD", "gw-pass")
    async with replicas(shared_config(clean_sim, store, username="gw")) as (a, b):
        assert (await call(http, a, "POST", "/admin/units/u0/drain", {"reason": "r"}))[0] == 200
        await eventually(lambda: _drained(http, b, "u0"), within=2.0)  # follow + heartbeats
        body = (await call(http, b, "GET", "/admin/events"))[1]
        assert body["source"] == "shared" and body["events"][-1]["what"] == "drain"
    assert admin.hget("fleet:marks", "u0") is not None
    gw = redis.Redis(unix_socket_path=str(store.socket), username="gw", password="gw-pass")
    with pytest.raises(redis.exceptions.NoPermissionError):
        gw.get("other:version")  # outside the prefix
    with pytest.raises(redis.exceptions.NoPermissionError):
        gw.flushall()  # a dangerous command


async def test_two_gateways_given_one_replica_name_are_called_out(
    clean_sim: SimProcess, store: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    config = named(shared_config(clean_sim, store), "same")
    async with running(config), running(config):

        async def called_out() -> bool:
            return "another gateway reports as replica 'same'" in caplog.text

        await eventually(called_out, within=3.0)
