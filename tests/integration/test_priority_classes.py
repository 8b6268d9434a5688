"""Priority classes through a real gateway on real sockets: the `x-unitgate-priority` header,
its refusals, and the class's `priority` sent to the units that schedule by it (and only to
them). What admission does with the classes: tests/gateway/routing/test_admission_classes.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.config import config_from_dict
from gateway.proxy.priority import with_priority
from gateway.server import running
from tests.gateway.servers import serve_app
from tests.support import until_routable

MODEL = "shop"
HEALTH = {"enabled": True, "interval": 0.05, "timeout": 0.5, "fall": 1, "rise": 1}
CHAT = "/v1/chat/completions"


class Recorder:
    """An OpenAI-compatible unit that records every request body it is sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.delay = 0.0  # before answering: the request holds its slot without a first byte
        self.aborted = 0  # requests whose connection the gateway closed before the answer
        self.app = web.Application()
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post(CHAT, self.chat)

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.aborted += 1
            raise
        return web.json_response({"id": "c1", "model": MODEL, "choices": [], "usage": {}})


@pytest.fixture
async def recorders() -> AsyncIterator[tuple[Recorder, str, Recorder, str]]:
    takes, plain = Recorder(), Recorder()
    async with serve_app(takes.app) as takes_url, serve_app(plain.app) as plain_url:
        yield takes, takes_url, plain, plain_url


def config(units: list[dict[str, Any]], **sections: Any) -> Any:
    raw: dict[str, Any] = {
        "gateway": {"port": 0, "models": [MODEL], "shutdown_timeout": 2.0},
        "metrics": {"port": 0},
        "routing": {"affinity": "none"},
        "health": HEALTH,
        "breaker": {"enabled": False},
        "admin": {"enabled": False},
        "units": units,
        **sections,
    }
    return config_from_dict(raw)


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_the_class_reaches_units_that_schedule_by_it_and_only_them(
    recorders: tuple[Recorder, str, Recorder, str],
) -> None:
    takes, takes_url, plain, plain_url = recorders
    for unit in (
        {"id": "t", "leader": takes_url, "kind": "openai", "priority": True},
        {"id": "p", "leader": plain_url, "kind": "openai"},  # openai: not unless told
    ):
        async with running(config([unit], priority={})) as gw, aiohttp.ClientSession() as h:
            await until_routable(gw, unit["id"])
            for header in ("interactive", " BATCH ", None):
                heads = {"x-unitgate-priority": header} if header else {}
                async with h.post(gw.public_url + CHAT, json=body(), headers=heads) as r:
                    assert r.status == 200, await r.text()
    # The default classes' unit_priority: interactive -1, batch 1, standard (no header) 0.
    assert [b["priority"] for b in takes.bodies] == [-1, 1, 0]
    assert len(plain.bodies) == 3 and not any("priority" in b for b in plain.bodies)


async def test_unknown_classes_and_a_clients_own_priority_are_refused_by_name(
    recorders: tuple[Recorder, str, Recorder, str],
) -> None:
    takes, takes_url, _, _ = recorders
    units = [{"id": "t", "leader": takes_url, "kind": "openai", "priority": True}]
    async with running(config(units, priority={})) as gw, aiohttp.ClientSession() as http:
        await until_routable(gw, "t")
        cases: list[tuple[dict[str, str], dict[str, Any], str, str]] = [
            (
                {"x-unitgate-priority": "gold"},
                body(),
                "unknown_priority_class",
                "'gold'; this gateway has: interactive, standard, batch",
            ),
            ({"x-unitgate-priority": "x" * 5000}, body(), "unknown_priority_class", "..."),
            ({}, body(priority=-100), "unsupported_field", "x-unitgate-priority header"),
        ]
        for heads, payload, code, said in cases:
            async with http.post(gw.public_url + CHAT, json=payload, headers=heads) as r:
                answer = await r.json()
                assert r.status == 400, answer
                assert answer["error"]["code"] == code and said in answer["error"]["message"]
        assert takes.bodies == []  # nothing reached the unit


async def test_without_priority_classes_only_standard_exists_and_bodies_pass_untouched(
    recorders: tuple[Recorder, str, Recorder, str],
) -> None:
    takes, takes_url, _, _ = recorders
    units = [{"id": "t", "leader": takes_url, "kind": "openai", "priority": True}]
    async with running(config(units)) as gw, aiohttp.ClientSession() as http:
        await until_routable(gw, "t")
        async with http.post(gw.public_url + CHAT, json=body(priority=3)) as r:
            assert r.status == 200  # the client's own field: the unit's business, as before
        heads = {"x-unitgate-priority": "standard"}
        async with http.post(gw.public_url + CHAT, json=body(), headers=heads) as r:
            assert r.status == 200
        heads = {"x-unitgate-priority": "interactive"}
        async with http.post(gw.public_url + CHAT, json=body(), headers=heads) as r:
            answer = await r.json()
            assert r.status == 400 and "this gateway has: standard" in answer["error"]["message"]
        assert [b.get("priority") for b in takes.bodies] == [3, None]


@pytest.mark.parametrize(
    "raw",
    [b'{"model":"m"}', b'  {"model": "m", "n": 1}', b"{}", b"{ }", b'{\n  "a": [1, {"b": 2}]\n}'],
)
def test_the_priority_is_spliced_into_any_json_object(raw: bytes) -> None:
    out = orjson.loads(with_priority(raw, -7))
    assert out == {"priority": -7, **orjson.loads(raw)}


async def test_a_preempted_batch_request_gets_503_and_its_unit_is_not_blamed(
    recorders: tuple[Recorder, str, Recorder, str],
) -> None:
    takes, takes_url, _, _ = recorders
    takes.delay = 1.0
    unit = {"id": "t", "leader": takes_url, "kind": "openai", "max_inflight": 2}
    breaker = {"enabled": True, "consecutive_failures": 1}
    sections = {"priority": {"preempt": True}, "breaker": breaker}
    async with running(config([unit], **sections)) as gw, aiohttp.ClientSession() as http:
        await until_routable(gw, "t")

        async def ask(klass: str) -> tuple[int, dict[str, Any], str | None]:
            heads = {"x-unitgate-priority": klass}
            async with http.post(gw.public_url + CHAT, json=body(), headers=heads) as r:
                return r.status, await r.json(), r.headers.get("Retry-After")

        batch = [asyncio.create_task(ask("batch")) for _ in range(2)]
        while len(takes.bodies) < 2:  # both hold the unit's two slots, no byte answered yet
            await asyncio.sleep(0.01)
        status, _, _ = await ask("interactive")
        assert status == 200
        results = await asyncio.gather(*batch)
        statuses = sorted(r[0] for r in results)
        assert statuses == [200, 503], results
        _, answer, retry_after = next(r for r in results if r[0] == 503)
        assert answer["error"]["code"] == "preempted" and retry_after == "1"
        sample = gw.metrics.registry.get_sample_value
        assert gw.units.units["t"].routable  # the breaker (trips at 1 failure) heard nothing
        assert not sample("unitgate_breaker_transitions_total", {"unit": "t", "to": "ejected"})
        labels = {"class": "batch", "reason": "preempted"}
        assert sample("unitgate_class_rejections_total", labels) == 1
        assert takes.aborted == 1  # the unit was told: its connection closed
