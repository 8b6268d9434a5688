"""API keys in the shared state: made through one replica, honoured by the others, kept in
Redis as hashes only, re-read only when they changed, and refused with a 503 while the store
is away (the keys already known keep working)."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import pytest

from gateway.config import AuthConfig, Config
from gateway.server import Gateway
from tests.integration.test_admin import CHAT, call, eventually
from tests.integration.test_shared_state import replicas, shared_config
from tests.redis_support import RedisServer
from tests.support import SimProcess, chat_body

pytestmark = pytest.mark.usefixtures("admin_tokens")


async def chat_status(http: aiohttp.ClientSession, gw: Gateway, secret: str) -> int:
    headers = {"Authorization": f"Bearer {secret}"}
    body = chat_body(stream=False, max_tokens=1)
    async with http.post(gw.public_url + CHAT, json=body, headers=headers) as resp:
        return resp.status


def keyed(sim: SimProcess, store: RedisServer) -> Config:
    """shared_config's two replicas, with `[auth] required = true`."""
    config = shared_config(sim, store)
    return dataclasses.replace(config, auth=AuthConfig(required=True))


async def test_a_key_made_through_one_replica_works_on_the_other(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with replicas(keyed(clean_sim, store)) as (a, b):
        status, made = await call(http, a, "POST", "/admin/keys", {"tenant": "acme"})
        assert status == 201
        secret = made["key"]
        assert await chat_status(http, a, secret) == 200  # the writer has it on its answer
        await eventually(lambda: _is(chat_status(http, b, secret), 200), within=2.0)
        client = store.client()
        raw = client.hgetall("fleet:keys")
        assert (
            list(raw) == [made["id"].encode()] and secret.encode() not in raw[made["id"].encode()]
        )
        assert int(client.get("fleet:keys_version") or 0) == 1
        assert b.admin is not None
        seen = [(e.unit, e.what) for e in b.admin.service.events.recent() if e.unit == made["id"]]
        assert seen == [(made["id"], "key created")]
        status, _ = await call(http, b, "DELETE", f"/admin/keys/{made['id']}", token="bob-token")
        assert status == 200
        await eventually(lambda: _is(chat_status(http, a, secret), 401), within=2.0)
        _, events = await call(http, a, "GET", f"/admin/events?unit={made['id']}")
        assert [(e["what"], e["who"]) for e in events["events"]] == [
            ("key created", "alice"),
            ("key revoked", "bob"),
        ]


async def test_another_replica_lists_and_revokes_a_key_made_a_moment_ago(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    """Its list and its revocation bring it to the latest version first: no stale list, no
    404 for a key its follower has not heard of yet."""
    async with replicas(keyed(clean_sim, store)) as (a, b):
        for _ in range(5):
            status, made = await call(http, a, "POST", "/admin/keys", {"tenant": "acme"})
            _, listed = await call(http, b, "GET", "/admin/keys")
            assert made["id"] in [k["id"] for k in listed["keys"]]
            status, made = await call(http, a, "POST", "/admin/keys", {"tenant": "acme"})
            status, revoked = await call(http, b, "DELETE", f"/admin/keys/{made['id']}")
            assert (status, revoked["state"]) == (200, "revoked")


async def test_other_writes_do_not_re_read_the_keys(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with replicas(keyed(clean_sim, store)) as (a, b):
        assert (await call(http, a, "POST", "/admin/keys", {"tenant": "acme"}))[0] == 201
        assert b.admin is not None and b.admin.service.shared is not None
        await eventually(lambda: _true(len(b.keys.by_id) == 1), within=2.0)
        shared, reads = b.admin.service.shared, []
        original = shared._keys

        async def counted() -> Any:
            reads.append(1)
            return await original()

        shared._keys = counted  # type: ignore[method-assign]
        version = b.admin.service.converged_version
        assert (await call(http, a, "POST", "/admin/units/u0/disable", {"reason": "r"}))[0] == 200
        await eventually(lambda: _true(b.admin.service.converged_version > version), within=2.0)  # type: ignore[union-attr]
        await b.admin.service.converge()
        assert reads == []
        assert (await call(http, a, "POST", "/admin/keys", {"tenant": "beta"}))[0] == 201
        await eventually(lambda: _true(len(b.keys.by_id) == 2), within=2.0)
        assert reads == [1]


async def test_redis_away_refuses_new_keys_and_known_ones_keep_working(
    clean_sim: SimProcess, store: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with replicas(keyed(clean_sim, store)) as (a, b):
        status, made = await call(http, a, "POST", "/admin/keys", {"tenant": "acme"})
        await eventually(lambda: _is(chat_status(http, b, made["key"]), 200), within=2.0)
        store.kill()
        status, body = await call(http, b, "POST", "/admin/keys", {"tenant": "beta"})
        assert status == 503 and body["error"]["code"] == "state_store_unavailable"
        status, body = await call(http, b, "DELETE", f"/admin/keys/{made['id']}")
        assert status == 503
        for gw in (a, b):
            assert await chat_status(http, gw, made["key"]) == 200
            assert list(gw.keys.by_id) == [made["id"]]


async def _is(status: Any, wanted: int) -> bool:
    return bool(await status == wanted)


async def _true(value: bool) -> bool:
    return value
