"""In front of a stock vLLM the gateway is transparent: what the unit would take directly
reaches it as sent (only a left-out model named), and what vLLM refuses for its content type
the gateway refuses first, with vLLM's own status and body, on either front."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.config import config_from_dict
from gateway.config.proxy import FRONT_ENV
from gateway.paths import CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH, RESPONSES_PATH
from gateway.server import Gateway
from tests.gateway.servers import serve_app
from tests.support import MODEL

FRONTS = ["lean", "aiohttp"]
JSON = {"Content-Type": "application/json"}
# What vLLM answers a body of another content type (FastAPI's validation error, as vLLM's
# handler renders it), byte for byte.
VLLM_NOT_JSON = (
    b'{"error":{"message":"1 validation error:\\n  Unsupported Media Type: Only '
    b'\'application/json\' is allowed","type":"Bad Request","param":null,"code":400}}'
)
BIG_SEED = b"-9223372036854775809"  # below int64: orjson alone would make it a float


class Unit:
    """A stock server's stand-in: answers every POST 200 and keeps (path, body) as it came."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, await request.read()))
        return web.json_response({"id": "x", "object": "ok", "model": MODEL})


@contextlib.asynccontextmanager
async def fronted(
    monkeypatch: pytest.MonkeyPatch, front: str, **gateway: Any
) -> AsyncIterator[tuple[Gateway, Unit, aiohttp.ClientSession]]:
    """A gateway on `front` before one `vllm` unit; `gateway`: its [gateway] keys."""
    unit = Unit()
    async with serve_app(unit.app()) as url:
        raw = {
            "gateway": {"port": 0, "models": [MODEL], "shutdown_timeout": 2.0, **gateway},
            "metrics": {"port": 0},
            "routing": {"affinity": "none"},
            "health": {"enabled": False},
            "breaker": {"enabled": False},
            "admin": {"enabled": False},
            "units": [{"id": "v0", "kind": "vllm", "leader": url}],
        }
        with monkeypatch.context() as env:
            env.setenv(FRONT_ENV, front)
            gw = Gateway(config_from_dict(raw))
            await gw.start()
        try:
            async with aiohttp.ClientSession(gw.public_url) as http:
                yield gw, unit, http
        finally:
            await gw.stop()


def _chat(content: str = "hi") -> bytes:
    return orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}]})


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", "application/jsonl", None],
)
async def test_a_body_not_sent_as_json_gets_vllms_own_400(
    monkeypatch: pytest.MonkeyPatch, front: str, content_type: str | None
) -> None:
    async with fronted(monkeypatch, front) as (_, unit, http):
        headers = {} if content_type is None else {"Content-Type": content_type}
        skip = ["Content-Type"] if content_type is None else []
        async with http.post(
            CHAT_PATH, data=_chat(), headers=headers, skip_auto_headers=skip
        ) as resp:
            assert resp.status == 400
            assert resp.headers["Content-Type"] == "application/json"
            assert await resp.read() == VLLM_NOT_JSON
    assert unit.seen == []


@pytest.mark.parametrize("front", FRONTS)
async def test_json_is_read_as_vllm_reads_it(monkeypatch: pytest.MonkeyPatch, front: str) -> None:
    """Parameters after `;` and any case are JSON; a space before the `;` is not (vLLM
    compares what comes before it whole)."""
    async with fronted(monkeypatch, front) as (_, unit, http):
        for content_type, status in [
            ("application/json; charset=utf-8", 200),
            ("Application/JSON", 200),
            ("application/json ; charset=utf-8", 400),
        ]:
            headers = {"Content-Type": content_type}
            async with http.post(CHAT_PATH, data=_chat(), headers=headers) as resp:
                assert (resp.status, content_type) == (status, content_type)
    assert len(unit.seen) == 2


# Bodies vLLM takes (and judges itself) that the gateway used to refuse, spelled with the
# spaces a client may send: each must reach the unit as it was sent.
ACCEPTED = [
    (CHAT_PATH, b'{"model": "%s", "messages": [{"role": "my-custom-role", "content": "x"}]}'),
    (COMPLETIONS_PATH, b'{"model": "%s", "prompt_embeds": "AAAA"}'),
    (
        CHAT_PATH,
        b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "seed": '
        + BIG_SEED
        + b"}",
    ),
    (CHAT_PATH, b'{"model": "%s", "messages": "hi", "temperature": 9, "max_tokens": "5"}'),
    (EMBEDDINGS_PATH, b'{"model": "%s", "messages": [{"role": "user", "content": "x"}]}'),
    (EMBEDDINGS_PATH, b'{"model": "%s", "input": "x", "stream": true}'),
]


@pytest.mark.parametrize("front", FRONTS)
async def test_what_vllm_takes_reaches_the_unit_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, front: str
) -> None:
    async with fronted(monkeypatch, front) as (_, unit, http):
        for path, template in ACCEPTED:
            body = template % MODEL.encode()
            async with http.post(path, data=body, headers=JSON) as resp:
                assert resp.status == 200, (path, body, await resp.text())
            assert unit.seen[-1] == (path, body)


NO_MODEL = [
    (CHAT_PATH, b'{ "messages": [{"role": "user", "content": "x"}], "seed": ' + BIG_SEED + b"}"),
    (COMPLETIONS_PATH, b'{"prompt": "x"}'),
    (RESPONSES_PATH, b'{"input": "x"}'),
    (EMBEDDINGS_PATH, b'{"input": ["x"]}'),
]


@pytest.mark.parametrize("front", FRONTS)
async def test_a_request_without_model_goes_to_the_only_model_naming_it(
    monkeypatch: pytest.MonkeyPatch, front: str
) -> None:
    """The unit is sent the client's bytes with the routed model spliced in first."""
    named = b'{"model":"%s",' % MODEL.encode()
    async with fronted(monkeypatch, front) as (_, unit, http):
        for path, body in NO_MODEL:
            async with http.post(path, data=body, headers=JSON) as resp:
                assert resp.status == 200, (path, await resp.text())
            assert unit.seen[-1] == (path, named + body[1:])


async def test_a_null_or_empty_model_is_replaced_integers_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with fronted(monkeypatch, "lean") as (_, unit, http):
        for model in (b"null", b'""'):
            body = b'{"model": %s, "prompt": "x", "seed": %s}' % (model, BIG_SEED)
            async with http.post(COMPLETIONS_PATH, data=body, headers=JSON) as resp:
                assert resp.status == 200
            sent = unit.seen[-1][1]
            assert BIG_SEED in sent and orjson.loads(sent.replace(BIG_SEED, b"0"))["model"] == MODEL


async def test_a_resumable_stream_keeps_the_clients_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asking for token ids adds one member; the client's integer beyond 64 bits is intact."""
    body = b'{"model": "%s", "stream": true, "messages": [{"role": "user", "content": "x"}], ' % (
        MODEL.encode()
    )
    body += b'"seed": %s}' % BIG_SEED
    async with fronted(monkeypatch, "lean") as (_, unit, http):
        assert (await send(http, CHAT_PATH, body))[0] == 200
    assert unit.seen[-1] == (CHAT_PATH, b'{"return_token_ids":true,' + body[1:])


@pytest.mark.parametrize("front", FRONTS)
async def test_several_models_take_the_default_model(
    monkeypatch: pytest.MonkeyPatch, front: str
) -> None:
    several = {"models": ["a", MODEL], "default_model": MODEL}
    async with fronted(monkeypatch, front, **several) as (_, unit, http):
        assert (await send(http, CHAT_PATH, b'{"messages": []}'))[0] == 200
    assert unit.seen[-1] == (CHAT_PATH, b'{"model":"%s","messages": []}' % MODEL.encode())


async def test_several_models_without_a_default_need_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with fronted(monkeypatch, "lean", models=["a", MODEL]) as (_, unit, http):
        status, answer = await send(http, CHAT_PATH, b'{"messages": []}')
    error = orjson.loads(answer)["error"]
    assert (status, error["param"]) == (400, "model")
    assert (
        error["message"] == f"missing required parameter 'model'; served models: ['a', '{MODEL}']"
    )
    assert unit.seen == []


async def send(http: aiohttp.ClientSession, path: str, body: bytes) -> tuple[int, bytes]:
    async with http.post(path, data=body, headers=JSON) as resp:
        return resp.status, await resp.read()
