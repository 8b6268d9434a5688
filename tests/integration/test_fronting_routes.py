"""Every route a stock vLLM serves behind a load balancer, through a real gateway on real
sockets in front of two vLLM-shaped servers: tokenization, batch chat, SageMaker's entry,
scoring and pooling; stored responses read, cancelled and continued on the unit that holds
them, by a gateway that made them and by one that did not; the units' model cards and
versions; vLLM's `/health`.

(The same routes against real stock vLLM servers: tests/vllm/.)
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.config import config_from_dict
from gateway.paths import BATCH, POOLING, TOKENS
from gateway.server import Gateway
from gateway.version import version
from tests.gateway.servers import serve_app, until

pytestmark = [pytest.mark.usefixtures("admin_tokens"), pytest.mark.both_relays]
MODEL = "Shop-Assistant"
ADMIN = {"Authorization": "Bearer alice-token"}


class StockUnit:
    """A stand-in for `vllm serve` (VLLM_ENABLE_RESPONSES_API_STORE=1) answering each route
    as vLLM does in shape, and keeping every request it got as (method, path+query, body)."""

    def __init__(self, name: str, served: str, vllm_version: str = "0.32.0") -> None:
        self.name, self.served, self.vllm_version = name, served, vllm_version
        self.seen: list[tuple[str, str, Any]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count()
        self.down = False  # its /health answers 503 (vLLM's dead engine)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.record])
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_get("/health", self.health)
        app.router.add_get("/tokenizer_info", self.echo)
        app.router.add_post("/v1/responses", self.create)
        app.router.add_get("/v1/responses/{id}", self.retrieve)
        app.router.add_post("/v1/responses/{id}/cancel", self.cancel)
        app.router.add_post("/{tail:.*}", self.echo)
        return app

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append((request.method, request.path_qs, orjson.loads(raw) if raw else None))
        answer: web.StreamResponse = await handler(request)
        return answer

    async def models(self, _: web.Request) -> web.Response:
        card = {"id": self.served, "object": "model", "created": 7, "owned_by": "vllm"}
        card |= {"root": "/models/smollm2", "parent": None, "max_model_len": 2048}
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=503 if self.down else 200)

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": self.vllm_version})

    async def echo(self, request: web.Request) -> web.Response:
        return web.json_response({"unit": self.name, "path": request.path})

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return _not_found(previous)
        rid = f"resp_{self.name}_{next(self.ids)}"
        response = {"id": rid, "object": "response", "status": "completed", "unit": self.name}
        self.stored[rid] = response
        if not body.get("stream"):
            return web.json_response(response)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for n, kind in enumerate(("response.created", "response.completed")):
            event = {"type": kind, "sequence_number": n, "response": response}
            await out.write(f"event: {kind}\ndata: ".encode() + orjson.dumps(event) + b"\n\n")
        await out.write_eof()
        return out

    async def retrieve(self, request: web.Request) -> web.Response:
        found = self.stored.get(request.match_info["id"])
        return _not_found(request.match_info["id"]) if found is None else web.json_response(found)

    async def cancel(self, request: web.Request) -> web.Response:
        found = self.stored.get(request.match_info["id"])
        if found is None:
            return _not_found(request.match_info["id"])
        return web.json_response({**found, "status": "cancelled"})


def _not_found(response_id: str) -> web.Response:
    message = f"Response with id '{response_id}' not found."
    error = {"message": message, "type": "invalid_request_error", "param": "response_id"}
    return web.json_response({"error": {**error, "code": 404}}, status=404)


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path, *versions: str) -> AsyncIterator[tuple[list[StockUnit], list[str]]]:
    """Two stock units serving MODEL under their own name (their URLs too)."""
    units = [StockUnit(f"v{n}", "smollm2", v) for n, v in enumerate(versions or ("0.32.0",) * 2)]
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve_app(u.app())) for u in units]
        yield units, urls


@contextlib.asynccontextmanager
async def gateway(
    urls: list[str], tmp_path: Path, name: str = "gw", **extra: Any
) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession]]:
    raw = {
        "gateway": {"port": 0, "models": [MODEL], "shutdown_timeout": 2.0},
        "metrics": {"port": 0},
        "routing": {"affinity": "none"},
        "health": {"enabled": False},
        "breaker": {"enabled": False},
        "admin": {"enabled": True, "state_file": str(tmp_path / f"{name}.sqlite3")},
        "units": [
            {"id": f"v{n}", "kind": "vllm", "leader": url, "served_model": "smollm2"}
            for n, url in enumerate(urls)
        ],
        **extra,
    }
    gw = Gateway(config_from_dict(raw))
    await gw.start()
    try:
        async with aiohttp.ClientSession(gw.public_url) as http:
            yield gw, http
    finally:
        await gw.stop()


async def test_every_post_route_reaches_a_unit_with_its_model_named(tmp_path: Path) -> None:
    async with fleet(tmp_path) as (units, urls), gateway(urls, tmp_path) as (_, http):
        for path in (*TOKENS, *BATCH, *POOLING):
            body = {"prompt": "hi", "text_1": "a", "text_2": "b"}  # no model: the only one
            async with http.post(path, json=body) as resp:
                assert resp.status == 200, (path, await resp.text())
                answer = await resp.json()
            assert answer["path"] == path
            unit = units[int(answer["unit"][1])]
            method, target, sent = unit.seen[-1]
            assert (method, target) == ("POST", path)
            assert sent == {**body, "model": "smollm2"}  # named, then the unit's own name
        count: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
        async with http.post("/v1/messages/count_tokens", json=count) as resp:
            assert resp.status == 400  # Anthropic's API names its model
            assert (await resp.json())["error"]["param"] == "model"
        async with http.get("/tokenizer_info") as resp:
            assert resp.status == 200
            answer = await resp.json()
        assert units[int(answer["unit"][1])].seen[-1][:2] == ("GET", "/tokenizer_info")
        async with http.get("/tokenizer_info?model=nope") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == "model_not_found"


async def test_stored_responses_are_read_cancelled_and_continued_where_they_are(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path) as (units, urls), gateway(urls, tmp_path) as (gw, http):
        made: dict[str, str] = {}
        for n in range(40):  # until both units hold some, streamed and not (p(40) ~ 1e-12)
            if n >= 4 and set(made.values()) == {"v0", "v1"}:
                break
            stream = n % 2 == 1
            body = {"input": "hi", "stream": stream}
            async with http.post("/v1/responses", json=body) as resp:
                assert resp.status == 200
                raw = await resp.read()
                home = resp.headers["x-unitgate-unit"]
            first = raw if not stream else raw.split(b"data: ", 1)[1].split(b"\n", 1)[0]
            parsed = orjson.loads(first)
            rid = parsed["id"] if not stream else parsed["response"]["id"]
            made[rid] = home
        assert set(made.values()) == {"v0", "v1"}
        for rid, home in made.items():
            for _ in range(3):  # never by chance: every time
                async with http.get(f"/v1/responses/{rid}") as resp:
                    assert resp.status == 200 and resp.headers["x-unitgate-unit"] == home
                    assert (await resp.json())["id"] == rid
            body = {"input": "and then?", "previous_response_id": rid}
            async with http.post("/v1/responses", json=body) as resp:
                assert resp.status == 200 and resp.headers["x-unitgate-unit"] == home
            async with http.post(f"/v1/responses/{rid}/cancel") as resp:
                assert resp.status == 200 and resp.headers["x-unitgate-unit"] == home
                assert (await resp.json())["status"] == "cancelled"
        rid = next(iter(made))
        async with http.get(f"/v1/responses/{rid}?stream=false&starting_after=2") as resp:
            assert resp.status == 200
        assert units[int(made[rid][1])].seen[-1][:2] == (
            "GET",
            f"/v1/responses/{rid}?stream=false&starting_after=2",
        )
        # Its unit disabled (no new work): it still answers for what only it holds.
        assert await _admin(gw, "POST", f"/admin/units/{made[rid]}/disable") == 200
        async with http.get(f"/v1/responses/{rid}") as resp:
            assert resp.status == 200 and resp.headers["x-unitgate-unit"] == made[rid]


async def test_a_gateway_that_never_saw_a_response_finds_its_unit(tmp_path: Path) -> None:
    """Another replica (or worker) made it: the ids are looked for on the units once."""
    async with fleet(tmp_path) as (units, urls):
        async with (
            gateway(urls, tmp_path, "a") as (_, first),
            first.post("/v1/responses", json={"input": "hi"}) as resp,
        ):
            rid, home = (await resp.json())["id"], resp.headers["x-unitgate-unit"]
        async with gateway(urls, tmp_path, "b") as (gw, http):
            for _ in range(2):
                async with http.get(f"/v1/responses/{rid}") as resp:
                    assert resp.status == 200 and resp.headers["x-unitgate-unit"] == home
            other = units[1 - int(home[1])]
            looked = [s for s in other.seen if s[1] == f"/v1/responses/{rid}"]
            assert len(looked) == 1  # asked once, then remembered
            body = {"input": "more", "previous_response_id": "resp_nowhere"}
            async with http.post("/v1/responses", json=body) as resp:
                assert resp.status == 404
                error = (await resp.json())["error"]
            assert error["message"] == "Response with id 'resp_nowhere' not found."
            assert error["param"] == "response_id"
            assert not any(s[0] == "POST" and s[1] == "/v1/responses" for s in other.seen)
            # Its unit leaves the fleet: a clear 404 that says so.
            status = await _admin(gw, "DELETE", f"/admin/units/{home}")
            assert status == 200
            async with http.get(f"/v1/responses/{rid}") as resp:
                assert resp.status == 404
                message = (await resp.json())["error"]["message"]
            assert message == (
                f"Response with id '{rid}' not found. Unit '{home}', which stored it, has "
                "left the fleet."
            )


async def test_a_response_whose_unit_is_out_waits_for_it(tmp_path: Path) -> None:
    """Out for now (its engine reported dead): 503 with Retry-After, never another unit."""
    probing = {"enabled": True, "interval": 0.05, "timeout": 0.5, "fall": 1, "rise": 1}
    async with (
        fleet(tmp_path) as (units, urls),
        gateway(urls, tmp_path, health=probing) as (
            gw,
            http,
        ),
    ):
        await until(lambda: all(u.routable for u in gw.units.units.values()), 5.0, "probed")
        async with http.post("/v1/responses", json={"input": "hi"}) as resp:
            rid, home = (await resp.json())["id"], resp.headers["x-unitgate-unit"]
        units[int(home[1])].down = True
        await until(lambda: not gw.units.units[home].healthy, 5.0, f"{home} ejected")
        async with http.get(f"/v1/responses/{rid}") as resp:
            assert resp.status == 503 and resp.headers["Retry-After"]
            message = (await resp.json())["error"]["message"]
        assert message == f"unit '{home}', the one that can answer this request, is not healthy now"
        other = units[1 - int(home[1])]
        assert not any(rid in target for _, target, _ in other.seen)


async def test_models_are_the_units_own_cards_under_the_public_id(tmp_path: Path) -> None:
    async with fleet(tmp_path, "0.32.0", "0.31.1") as (_, urls):  # noqa: SIM117 (urls reused)
        async with gateway(urls, tmp_path) as (_, http):
            async with http.get("/v1/models") as resp:
                listed = await resp.json()
            (card,) = listed["data"]
            assert card == {
                "id": MODEL,
                "object": "model",
                "created": 7,
                "owned_by": "vllm",
                "root": "/models/smollm2",
                "parent": None,
                "max_model_len": 2048,
            }
            async with http.get(f"/v1/models/{MODEL}") as resp:
                assert await resp.json() == card
            async with http.get("/version") as resp:
                said = await resp.json()
            assert said == {
                "version": "0.31.1",  # they differ: the oldest
                "unitgate": version(),
                "units": {"v0": "0.32.0", "v1": "0.31.1"},
            }
    # No unit up (nothing listens at their URLs any more): the gateway's own bare card.
    async with gateway(urls, tmp_path, "late") as (_, http):
        async with http.get("/v1/models") as resp:
            (card,) = (await resp.json())["data"]
        assert card["id"] == MODEL and card["owned_by"] == "unitgate" and "root" not in card
        async with http.get("/version") as resp:
            assert (await resp.json())["version"] is None


async def test_health_is_the_gateways_readiness_in_vllms_shape(tmp_path: Path) -> None:
    async with fleet(tmp_path) as (_, urls), gateway(urls, tmp_path) as (gw, http):
        for method, path in (("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")):
            async with http.request(method, path) as resp:
                assert (resp.status, await resp.read()) == (200, b"")
        for unit in ("v0", "v1"):
            assert await _admin(gw, "POST", f"/admin/units/{unit}/disable") == 200
        async with http.get("/health") as resp:
            assert (resp.status, await resp.read()) == (503, b"")


async def _admin(gw: Gateway, method: str, path: str) -> int:
    body = {"reason": "a test"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, gw.metrics_url + path, headers=ADMIN, json=body) as resp,
    ):
        return resp.status


async def test_a_root_path_serves_every_route_under_it_as_well(tmp_path: Path) -> None:
    """vLLM's `--root-path /llm` answers both /v1/... and /llm/v1/...; so does the gateway with
    `[gateway].root_path`, and it sends the unit the route's own path."""
    extra = {"gateway": {"port": 0, "models": [MODEL], "root_path": "/llm"}}
    async with fleet(tmp_path) as (units, urls), gateway(urls, tmp_path, **extra) as (_, http):
        for path in ("/tokenize", "/llm/tokenize", "/llm/v1/completions"):
            async with http.post(path, json={"prompt": "hi"}) as resp:
                assert resp.status == 200, (path, await resp.text())
                answer = await resp.json()
            unit = units[int(answer["unit"][1])]
            assert unit.seen[-1][:2] == ("POST", path.removeprefix("/llm"))
        for path in ("/llm/health", "/llm/v1/models", "/llm/version", "/health"):
            async with http.get(path) as resp:
                assert resp.status == 200, path
        for path in ("/llmx/tokenize", "/other/tokenize", "/llm/llm/tokenize"):
            async with http.post(path, json={"prompt": "hi"}) as resp:
                assert resp.status == 404, path
