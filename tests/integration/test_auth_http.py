"""Data-plane API keys on a real gateway in front of the simulated units: keys made, listed
and revoked through the admin API; the public routes' answers with and without them; bad
input of every kind answered with a clear 4xx that changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config import Config
from gateway.proxy.call import Call
from gateway.server import Gateway, running
from gateway.signals import Observer
from tests.integration.test_admin import CHAT, call
from tests.support import SimProcess, chat_body, gateway_config

pytestmark = pytest.mark.usefixtures("admin_tokens")


def keyed_config(sim: SimProcess, tmp_path: Path, required: bool = True) -> Config:
    state = str(tmp_path / "admin.sqlite3")
    return gateway_config(
        sim.units, admin={"enabled": True, "state_file": state}, auth={"required": required}
    )


@contextlib.asynccontextmanager
async def keyed(sim: SimProcess, tmp_path: Path, required: bool = True) -> AsyncIterator[Gateway]:
    async with running(keyed_config(sim, tmp_path, required)) as gw:
        yield gw


async def make_key(http: aiohttp.ClientSession, gw: Gateway, **body: Any) -> dict[str, Any]:
    status, made = await call(http, gw, "POST", "/admin/keys", {"tenant": "acme", **body})
    assert status == 201, made
    return dict(made)


async def chat(http: aiohttp.ClientSession, gw: Gateway, header: str | None) -> tuple[int, Any]:
    headers = {} if header is None else {"Authorization": header}
    body = chat_body(stream=False, max_tokens=1)
    async with http.post(gw.public_url + CHAT, json=body, headers=headers) as resp:
        return resp.status, (await resp.json(), resp.headers.get("WWW-Authenticate"))


class Callers(Observer):
    def __init__(self) -> None:
        self.tenants: list[str] = []

    def ended(self, call: Call) -> None:
        self.tenants.append(call.caller.tenant)


async def test_a_key_opens_the_data_plane_and_its_revocation_closes_it(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with keyed(clean_sim, tmp_path) as gw:
        made = await make_key(http, gw, rpm=60, max_inflight=2)
        secret = made["key"]
        assert secret.startswith("ug-") and made["prefix"] == secret[:7] + "…"
        assert made["state"] == "active" and made["who"] == "alice" and "hash" not in made
        assert (await chat(http, gw, f"Bearer {secret}"))[0] == 200
        for path in ("/v1/models", "/v1/models/" + gw.config.gateway.models[0]):
            async with http.get(gw.public_url + path) as resp:
                assert resp.status == 401, path
            headers = {"Authorization": f"Bearer {secret}"}
            async with http.get(gw.public_url + path, headers=headers) as resp:
                assert resp.status == 200, path
        status, listed = await call(http, gw, "GET", "/admin/keys")
        assert status == 200 and [k["id"] for k in listed["keys"]] == [made["id"]]
        assert secret not in str(listed) and "hash" not in listed["keys"][0]
        status, revoked = await call(
            http, gw, "DELETE", f"/admin/keys/{made['id']}", token="bob-token"
        )
        assert status == 200 and revoked["state"] == "revoked" and revoked["revoked_by"] == "bob"
        status, (body, _) = await chat(http, gw, f"Bearer {secret}")
        assert status == 401 and "revoked" in body["error"]["message"]
        assert secret not in body["error"]["message"]
        # Revoking again changes nothing; an unknown id is a 404.
        assert (await call(http, gw, "DELETE", f"/admin/keys/{made['id']}"))[1] == revoked
        assert (await call(http, gw, "DELETE", "/admin/keys/key_nope"))[0] == 404
        _, events = await call(http, gw, "GET", f"/admin/events?unit={made['id']}")
        assert [(e["what"], e["who"]) for e in events["events"]] == [
            ("key created", "alice"),
            ("key revoked", "bob"),
        ]
        assert all(e["reason"] == "tenant acme" for e in events["events"])
        assert secret not in str(events)


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (None, "Missing API key"),
        ("", "Missing API key"),
        ("ug-no-scheme", "Malformed Authorization header"),
        ("Basic dXNlcjpwYXNz", "Malformed Authorization header"),
        ("Bearer", "Malformed Authorization header"),
        ("Bearer EMPTY", "Incorrect API key"),
        ("Bearer ug-" + "A" * 43, "Incorrect API key"),
    ],
)
async def test_required_refuses_in_the_openai_shape(
    clean_sim: SimProcess,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    header: str | None,
    says: str,
) -> None:
    async with keyed(clean_sim, tmp_path) as gw:
        status, (body, challenge) = await chat(http, gw, header)
        assert status == 401 and challenge == "Bearer"
        error = body["error"]
        assert says in error["message"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            None,
            "invalid_api_key",
        )
        if header and " " in header:
            assert header.split()[-1] not in error["message"]
        for path in ("/healthz", "/readyz"):  # no key needed
            async with http.get(gw.public_url + path) as resp:
                assert resp.status == 200, path
        async with http.get(gw.metrics_url + "/metrics") as resp:
            assert resp.status == 200


async def test_a_1_mb_header_gets_a_clean_4xx_and_the_gateway_stays_healthy(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with keyed(clean_sim, tmp_path) as gw:
        secret = (await make_key(http, gw))["key"]
        huge = "Bearer " + "x" * (1 << 20)
        async with (
            aiohttp.ClientSession() as fresh,  # the server may close this connection
            fresh.post(
                gw.public_url + CHAT, json=chat_body(stream=False), headers={"Authorization": huge}
            ) as resp,
        ):
            assert resp.status == 400, resp.status  # aiohttp: a header field is at most 8190 B
            await resp.read()
        assert (await chat(http, gw, f"Bearer {secret}"))[0] == 200
        async with http.get(gw.public_url + "/readyz") as resp:
            assert resp.status == 200


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"tenant": "acme", "rpm": -5}, "[body].rpm"),
        ({"tenant": "acme", "tpm": 0}, "[body].tpm"),
        ({"tenant": "acme", "max_inflight": -1}, "[body].max_inflight"),
        ({"tenant": "acme", "priority": "platinum"}, "[body].priority"),
        ({"tenant": "acme", "expires": 1}, "[body].expires"),
        ({"tenant": "no spaces please"}, "[body].tenant"),
        ({"tenant": "acme", "secret": "mine"}, "[body].secret"),
        ({"rpm": 5}, "[body].tenant"),
        (["acme"], "must be a JSON object"),
    ],
)
async def test_bad_admin_input_is_a_400_naming_the_field_and_changes_nothing(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession, body: Any, says: str
) -> None:
    async with keyed(clean_sim, tmp_path) as gw:
        await make_key(http, gw)
        _, keys_before = await call(http, gw, "GET", "/admin/keys")
        _, events_before = await call(http, gw, "GET", "/admin/events")
        status, answer = await call(http, gw, "POST", "/admin/keys", body)
        assert status == 400, answer
        assert answer["error"]["code"] == "invalid_body"
        assert says in answer["error"]["message"]
        assert (await call(http, gw, "GET", "/admin/keys"))[1] == keys_before
        assert (await call(http, gw, "GET", "/admin/events"))[1] == events_before


async def test_not_required_a_key_names_its_tenant_and_anything_else_is_anonymous(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with keyed(clean_sim, tmp_path, required=False) as gw:
        callers = Callers()
        gw.signals.subscribe(callers)
        secret = (await make_key(http, gw))["key"]
        for header in (f"Bearer {secret}", None, "Bearer EMPTY", "garbled"):
            assert (await chat(http, gw, header))[0] == 200
        async with http.get(gw.public_url + "/v1/models") as resp:
            assert resp.status == 200
        assert callers.tenants == ["acme", "anonymous", "anonymous", "anonymous"]


async def test_keys_and_revocations_survive_a_restart(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with keyed(clean_sim, tmp_path) as gw:
        kept, gone = (await make_key(http, gw))["key"], await make_key(http, gw, tenant="b")
        assert (await call(http, gw, "DELETE", f"/admin/keys/{gone['id']}"))[0] == 200
    async with keyed(clean_sim, tmp_path) as gw:
        assert (await chat(http, gw, f"Bearer {kept}"))[0] == 200
        assert (await chat(http, gw, f"Bearer {gone['key']}"))[0] == 401
        _, listed = await call(http, gw, "GET", "/admin/keys")
        assert [k["state"] for k in listed["keys"]] == ["active", "revoked"]


async def test_a_key_past_its_expiry_is_refused_and_listed_expired(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with keyed(clean_sim, tmp_path) as gw:
        made = await make_key(http, gw, expires=time.time() + 0.5)
        assert (await chat(http, gw, f"Bearer {made['key']}"))[0] == 200
        await asyncio.sleep(0.6)
        status, (body, _) = await chat(http, gw, f"Bearer {made['key']}")
        assert status == 401 and "has expired" in body["error"]["message"]
        _, listed = await call(http, gw, "GET", "/admin/keys")
        assert [k["state"] for k in listed["keys"]] == ["expired"]


async def test_a_keys_classes_clamp_the_header_and_set_the_default(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    state = str(tmp_path / "admin.sqlite3")
    config = gateway_config(
        clean_sim.units,
        admin={"enabled": True, "state_file": state},
        auth={"required": True},
        priority={},
    )
    async with running(config) as gw:
        capped = await make_key(http, gw, priority="standard", default_priority="batch")
        top = await make_key(http, gw, tenant="shop", priority="interactive")
        sample = gw.metrics.registry.get_sample_value

        def admitted(klass: str) -> float:
            return sample("unitgate_queue_wait_seconds_count", {"class": klass}) or 0.0

        async def ask(secret: str, klass: str | None) -> int:
            headers = {"Authorization": f"Bearer {secret}"}
            if klass is not None:
                headers["x-unitgate-priority"] = klass
            body = chat_body(stream=False, max_tokens=1)
            async with http.post(gw.public_url + CHAT, json=body, headers=headers) as resp:
                return resp.status

        cases = [
            (capped["key"], "interactive", "standard"),  # clamped to the key's highest
            (capped["key"], None, "batch"),  # the key's default
            (capped["key"], "batch", "batch"),  # lower than its highest: as asked
            (top["key"], "interactive", "interactive"),
            (top["key"], None, "interactive"),  # no default_priority: its priority
            (top["key"], "batch", "batch"),
        ]
        for secret, asked, ran in cases:
            before = admitted(ran)
            assert await ask(secret, asked) == 200
            assert admitted(ran) == before + 1, (asked, ran)


async def test_a_keys_limits_answer_429_with_openais_headers_and_count_per_tenant(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with keyed(clean_sim, tmp_path) as gw:
        made = await make_key(http, gw, rpm=3, tpm=100_000)
        auth = f"Bearer {made['key']}"
        body = chat_body(stream=False, max_tokens=4)
        seen: list[tuple[int, Any, dict[str, str]]] = []
        for _ in range(4):
            headers = {"Authorization": auth}
            async with http.post(gw.public_url + CHAT, json=body, headers=headers) as resp:
                seen.append((resp.status, await resp.json(), dict(resp.headers)))
        assert [s for s, _, _ in seen] == [200, 200, 200, 429]
        ok = seen[0][2]
        assert ok["x-ratelimit-limit-requests"] == "3"
        assert ok["x-ratelimit-remaining-requests"] == "2"
        assert ok["x-ratelimit-limit-tokens"] == "100000"
        assert {"x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"} <= set(ok)
        _, refused, head = seen[3]
        assert refused["error"]["code"] == "rate_limit_exceeded"
        assert refused["error"]["type"] == "requests"
        assert "requests per minute" in refused["error"]["message"]
        assert int(head["Retry-After"]) >= 1 and head["x-ratelimit-remaining-requests"] == "0"
        sample = gw.metrics.registry.get_sample_value
        labels = {"class": "standard", "reason": "rate_limit_exceeded"}
        assert sample("unitgate_class_rejections_total", labels) == 1
        # Another tenant's key is untouched by this one's limit.
        other = await make_key(http, gw, tenant="globex", rpm=3)
        assert (await chat(http, gw, f"Bearer {other['key']}"))[0] == 200


async def test_max_inflight_holds_while_a_stream_runs_and_frees_when_it_ends(
    clean_sim: SimProcess, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with keyed(clean_sim, tmp_path) as gw:
        made = await make_key(http, gw, max_inflight=1)
        headers = {"Authorization": f"Bearer {made['key']}"}
        clean_sim.post("/units/u0/settings", {"itl_ms": 200})
        clean_sim.post("/units/u1/settings", {"itl_ms": 200})
        clean_sim.post("/units/u2/settings", {"itl_ms": 200})
        body = chat_body(stream=True, max_tokens=8)
        async with http.post(gw.public_url + CHAT, json=body, headers=headers) as streaming:
            assert streaming.status == 200
            await streaming.content.readany()  # it runs
            async with http.post(gw.public_url + CHAT, json=body, headers=headers) as second:
                assert second.status == 429
                assert (await second.json())["error"]["code"] == "rate_limit_exceeded"
            await streaming.read()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while True:  # the slot is released when the stream ends (settled at once locally)
            async with http.post(gw.public_url + CHAT, json=body, headers=headers) as third:
                await third.read()
                if third.status == 200:
                    break
            assert loop.time() < deadline, "the in-flight slot was never given back"
            await asyncio.sleep(0.05)
