"""Fronting servers that do not speak the node contract: the `openai` kind against the
simulator and against a server that checks its API key the way `vllm serve --api-key` does;
names, credentials and the APIs beyond chat through a real gateway on real sockets.

(The `vllm` kind's own tests run against real stock vLLM servers: tests/vllm/test_stock.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.config import config_from_dict
from gateway.server import running
from tests.gateway.servers import serve_app, until
from tests.support import MODEL, SimProcess, sse_events, until_routable

pytestmark = pytest.mark.both_relays

PUBLIC = "Shop-Assistant"
HEALTH = {"enabled": True, "interval": 0.05, "timeout": 0.5, "fall": 1, "rise": 1}


def config(units: list[dict[str, Any]], **sections: Any) -> Any:
    raw: dict[str, Any] = {
        "gateway": {"port": 0, "models": [PUBLIC], "shutdown_timeout": 2.0},
        "metrics": {"port": 0},
        "routing": {"affinity": "none"},
        "health": HEALTH,
        "breaker": {"enabled": False},
        "admin": {"enabled": False},
        "units": units,
        **sections,
    }
    return config_from_dict(raw)


class KeyedServer:
    """An OpenAI-compatible server that, like `vllm serve --api-key`, answers 401 to any
    request without its key, and records every request's head and body."""

    def __init__(self, key: str, model: str) -> None:
        self.key, self.model = key, model
        self.seen: list[tuple[str, dict[str, str], Any]] = []
        app = web.Application(middlewares=[self.auth])
        app.router.add_get("/v1/models", self.models)
        for path in ("/v1/responses", "/v1/messages", "/v1/embeddings", "/v1/chat/completions"):
            app.router.add_post(path, self.answer)
        self.app = app

    @web.middleware
    async def auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = orjson.loads(await request.read()) if request.can_read_body else None
        self.seen.append((request.path, dict(request.headers), body))
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        result: web.StreamResponse = await handler(request)
        return result

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model}]})

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if request.path == "/v1/embeddings":
            return web.json_response(
                {"object": "list", "model": body["model"], "data": [{"embedding": [0.5]}]}
            )
        if not body.get("stream"):
            return web.json_response({"id": "r1", "model": body["model"], "usage": {}})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for kind in ("response.created", "response.output_text.delta", "response.completed"):
            event: dict[str, Any] = {"type": kind, "response": {"model": body["model"]}}
            if kind == "response.completed":
                event["response"]["usage"] = {"input_tokens": 5, "output_tokens": 3}
            await out.write(f"event: {kind}\ndata: ".encode() + orjson.dumps(event) + b"\n\n")
        await out.write_eof()
        return out


@pytest.fixture
async def keyed(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[KeyedServer, str]]:
    monkeypatch.setenv("UNIT_KEY", "k-123")
    server = KeyedServer("k-123", "served-name")
    async with serve_app(server.app) as url:
        yield server, url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def tokens(gw: Any, unit: str) -> tuple[float | None, float | None]:
    sample = gw.metrics.registry.get_sample_value
    return tuple(  # type: ignore[return-value]
        # by the public model the client asked for, not the unit's served name
        sample("unitgate_tokens_total", {"unit": unit, "model": PUBLIC, "type": kind})
        for kind in ("prompt", "completion")
    )


def keyed_unit(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "k0",
        "leader": url,
        "kind": "openai",
        "served_model": "served-name",
        "api_key_env": "UNIT_KEY",
        "headers": {"X-Tenant": "shop"},
        **extra,
    }


async def test_probes_and_requests_carry_the_units_key_never_the_clients(
    keyed: tuple[KeyedServer, str], http: aiohttp.ClientSession
) -> None:
    server, url = keyed
    async with running(config([keyed_unit(url)])) as gw:
        await until_routable(gw, "k0")  # its probes passed the key check
        probes = [h for p, h, _ in server.seen if p == "/v1/models"]
        assert probes and all(h["Authorization"] == "Bearer k-123" for h in probes)
        assert all(h["X-Tenant"] == "shop" for h in probes)
        body = {"model": PUBLIC, "input": "hi", "stream": False}
        headers = {"Authorization": "Bearer the-clients-own-key"}
        async with http.post(f"{gw.public_url}/v1/responses", json=body, headers=headers) as r:
            assert r.status == 200
            answer = await r.json()
        path, head, sent = server.seen[-1]
        assert path == "/v1/responses"
        assert head["Authorization"] == "Bearer k-123" and head["X-Tenant"] == "shop"
        assert sent["model"] == "served-name"  # the unit's own name for the model
        assert answer["model"] == PUBLIC  # and the public one back


async def test_a_unit_probed_without_its_key_never_becomes_routable(
    keyed: tuple[KeyedServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = keyed
    unit = keyed_unit(url)
    del unit["api_key_env"]
    async with running(config([unit])) as gw:
        state = gw.units.units["k0"]
        await until(lambda: state.nodes[0].error is not None, 5.0, "first probe round")
        assert not state.routable
        assert state.nodes[0].error == "HTTP 401 from /v1/models"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"input": "hi", "stream": True}),
        ("/v1/messages", {"max_tokens": 8, "stream": True, "messages": [{"role": "user"}]}),
    ],
)
async def test_responses_and_messages_streams_are_relayed_with_public_names(
    keyed: tuple[KeyedServer, str], http: aiohttp.ClientSession, path: str, body: dict[str, Any]
) -> None:
    server, url = keyed
    async with running(config([keyed_unit(url)])) as gw:
        await until_routable(gw, "k0")
        async with http.post(f"{gw.public_url}{path}", json={"model": PUBLIC, **body}) as resp:
            assert resp.status == 200
            assert resp.headers["x-unitgate-unit"] == "k0"
            raw = await resp.read()
    assert raw.count(b"event: ") == 3 and b"served-name" not in raw
    assert raw.count(PUBLIC.encode()) == 3
    assert server.seen[-1][0] == path
    # Metered from the stream's own final event.
    assert tokens(gw, "k0") == (5, 3)


async def test_embeddings_and_a_single_models_entry(
    keyed: tuple[KeyedServer, str], http: aiohttp.ClientSession
) -> None:
    server, url = keyed
    async with running(config([keyed_unit(url)])) as gw:
        await until_routable(gw, "k0")
        body = {"model": PUBLIC, "input": ["a", "b"]}
        async with http.post(f"{gw.public_url}/v1/embeddings", json=body) as resp:
            assert resp.status == 200
            assert (await resp.json())["model"] == PUBLIC
        async with http.get(f"{gw.public_url}/v1/models/{PUBLIC}") as resp:
            assert resp.status == 200
            assert (await resp.json())["id"] == PUBLIC
        async with http.get(f"{gw.public_url}/v1/models/nope") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == "model_not_found"
        # What an embeddings request may carry is the unit's to judge (vLLM refuses `stream`
        # itself): the gateway passes it on as it came.
        seen = len(server.seen)
        async with http.post(f"{gw.public_url}/v1/embeddings", json={**body, "stream": True}) as r:
            assert r.headers["x-unitgate-unit"] == "k0"
            await r.read()
        assert len(server.seen) == seen + 1 and server.seen[-1][0] == "/v1/embeddings"


async def test_apis_beyond_chat_go_only_to_units_that_serve_them(
    keyed: tuple[KeyedServer, str], clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    server, url = keyed
    sim = clean_sim.units[0]
    own = {"id": sim["id"], "leader": sim["leader"], "nodes": sim["nodes"], "models": [MODEL]}
    stock = keyed_unit(url, models=[PUBLIC])
    raw = {"gateway": {"port": 0, "models": [PUBLIC, MODEL], "shutdown_timeout": 2.0}}
    async with running(config([own, stock], **raw)) as gw:
        await until_routable(gw)
        body = {"model": MODEL, "input": "hi"}
        async with http.post(f"{gw.public_url}/v1/responses", json=body) as resp:
            assert resp.status == 404  # no unit of the model ever will: not worth a retry
            message = (await resp.json())["error"]["message"]
        assert message == (
            f"no unit of model '{MODEL}' serves /v1/responses (the builtin engine serves chat "
            "and completions only)"
        )
        assert not any(p == "/v1/responses" for p, _, _ in server.seen)


async def test_the_simulator_as_an_openai_unit_streams_resumable_chat_under_a_public_name(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    units = [
        {"id": u["id"], "leader": u["leader"], "kind": "openai", "served_model": MODEL}
        for u in clean_sim.units[:2]
    ]
    async with running(config(units)) as gw:
        await until_routable(gw, "u0", "u1")
        body = {"model": PUBLIC, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with http.post(f"{gw.public_url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            events = await sse_events(resp)
        chunks = [e for e in events if isinstance(e, dict)]
        assert events[-1] == "[DONE]" and {c["model"] for c in chunks} == {PUBLIC}
        assert not any("token_ids" in c["choices"][0] for c in chunks if c["choices"])
        # The gateway asked for ids (to resume on a break) and the unit gave them.
        served = resp.headers["x-unitgate-unit"]
        assert gw.units.units[served].token_ids is True
        # Counted from the ids the unit sent, though the client asked for no usage.
        prompt, completion = tokens(gw, served)
        assert prompt and prompt > 0 and completion == 8  # the sim's 8 tokens (tests/conftest.py)


async def test_an_openai_unit_that_does_not_list_its_model_is_kept_out(
    clean_sim: SimProcess,
) -> None:
    unit = clean_sim.units[0]
    wrong = {"id": "u0", "leader": unit["leader"], "kind": "openai", "served_model": "other"}
    async with running(config([wrong])) as gw:
        state = gw.units.units["u0"]
        await until(lambda: state.nodes[0].error is not None, 5.0, "first probe round")
        assert state.nodes[0].error == f"/v1/models lists ['{MODEL}'], not ['other']"
        assert not state.routable
