"""Token ids (`return_token_ids`) and token-id continuations, what mid-stream resumption needs.

The shapes are checked against the builtin engine's own body builder (engine/server/wire.py),
so the gateway's resumption is tested against the sim with the bytes a real unit sends.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from engine.api import TokenEvent
from engine.scheduler import SamplingParams
from engine.server.parse import Kind as EngineKind
from engine.server.parse import ParsedRequest
from engine.server.wire import Bodies as EngineBodies
from loadtest.simunits import SimCluster
from loadtest.simunits.client import ControlClient, sse_data
from loadtest.simunits.openai_format import GEN_BASE, token_text

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "say three words"}]}
USAGE = {"stream_options": {"include_usage": True}}
DEFAULT_TOKENS = 8  # conftest's FAST settings


def NO_LOGPROBS(token: int) -> bytes:
    raise AssertionError("no logprobs were asked for")


def url(cluster: SimCluster, kind: str, unit: int = 0) -> str:
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    return cluster.units[unit].leader_url + path


async def stream(session: aiohttp.ClientSession, target: str, body: object) -> list[Any]:
    async with session.post(target, json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = [data async for data in sse_data(resp)]
    assert raw[-1] == b"[DONE]"
    return [orjson.loads(r) for r in raw[:-1]]


async def whole(session: aiohttp.ClientSession, target: str, body: object) -> Any:
    async with session.post(target, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


def engine_stream(
    kind: str, prompt_ids: list[int], ids: list[int], finish: str, include_usage: bool
) -> list[Any]:
    """What the builtin engine's server sends for the same tokens, through its own builder."""
    engine_kind: EngineKind = "chat" if kind == "chat" else "completion"
    req = ParsedRequest(engine_kind, tuple(prompt_ids), SamplingParams(), True, include_usage, True)
    bodies = EngineBodies(req, "x", 0, "m1", NO_LOGPROBS)
    out = bodies.opening()
    for n, token in enumerate(ids, 1):
        text = token_text(token - GEN_BASE)
        event = TokenEvent("r", token, text, False, None, len(prompt_ids), n)
        out += bodies.chunks(event)
    event = TokenEvent("r", None, "", True, finish, len(prompt_ids), len(ids))
    out += bodies.chunks(event)
    if include_usage:
        out.append(bodies.usage_chunk())
    return out


def engine_whole(kind: str, prompt_ids: list[int], ids: list[int], finish: str) -> Any:
    engine_kind: EngineKind = "chat" if kind == "chat" else "completion"
    req = ParsedRequest(engine_kind, tuple(prompt_ids), SamplingParams(), False, False, True)
    bodies = EngineBodies(req, "x", 0, "m1", NO_LOGPROBS)
    for n, token in enumerate(ids, 1):
        bodies.record(TokenEvent("r", token, token_text(token - GEN_BASE), False, None, 0, n))
    bodies.record(TokenEvent("r", None, "", True, finish, len(prompt_ids), len(ids)))
    return bodies.full()


def normalized(body: Any) -> bytes:
    """The body's bytes with the per-response fields blanked: key order counts too."""
    return orjson.dumps({**body, "id": "x", "created": 0, "model": "m1"})


def same_shapes(sim: list[Any], engine: list[Any]) -> None:
    assert [normalized(c) for c in sim] == [normalized(c) for c in engine]


def texts(chunks: list[Any]) -> str:
    out = ""
    for c in chunks:
        for choice in c["choices"]:
            out += choice["delta"].get("content", "") if "delta" in choice else choice["text"]
    return out


def gen_ids(chunks: list[Any]) -> list[int]:
    return [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids", [])]


def prompt_ids_of(chunks: list[Any]) -> list[int]:
    first = chunks[0]
    ids = first.get("prompt_token_ids", first["choices"][0].get("prompt_token_ids"))
    assert isinstance(ids, list)
    return ids


def finish_of(chunks: list[Any]) -> str:
    reasons = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert len(reasons) == 1
    return str(reasons[0])


@pytest.mark.parametrize("include_usage", [False, True])
async def test_chat_stream_token_ids_match_engine_shapes(
    cluster: SimCluster, session: aiohttp.ClientSession, include_usage: bool
) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 3, "return_token_ids": True}
    if include_usage:
        body |= USAGE
    chunks = await stream(session, url(cluster, "chat"), body)
    assert "prompt_token_ids" in chunks[0]
    assert "token_ids" not in chunks[0]["choices"][0]  # the role chunk adds no token
    prompt = chunks[0]["prompt_token_ids"]
    assert len(prompt) == 3 and all(0 <= t < GEN_BASE for t in prompt)  # one id per word
    assert gen_ids(chunks) == [GEN_BASE, GEN_BASE + 1, GEN_BASE + 2]
    assert chunks[4]["choices"][0]["token_ids"] == []  # the finish chunk
    assert sum("prompt_token_ids" in c for c in chunks) == 1
    expected = engine_stream("chat", prompt, gen_ids(chunks), "length", include_usage)
    same_shapes(chunks, expected)
    if include_usage:
        assert chunks[-1]["usage"]["prompt_tokens"] == len(prompt)


@pytest.mark.parametrize("include_usage", [False, True])
async def test_completion_stream_token_ids_match_engine_shapes(
    cluster: SimCluster, session: aiohttp.ClientSession, include_usage: bool
) -> None:
    body = {"model": "m1", "prompt": "a b", "stream": True, "return_token_ids": True}
    if include_usage:
        body |= USAGE
    chunks = await stream(session, url(cluster, "completion"), body)
    first = chunks[0]["choices"][0]
    assert first["token_ids"] == [GEN_BASE] and len(first["prompt_token_ids"]) == 2
    assert "prompt_token_ids" not in chunks[0]
    assert gen_ids(chunks) == [GEN_BASE + i for i in range(DEFAULT_TOKENS)]
    expected = engine_stream(
        "completion", prompt_ids_of(chunks), gen_ids(chunks), "stop", include_usage
    )
    same_shapes(chunks, expected)


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_non_streaming_token_ids_match_engine_shapes(
    cluster: SimCluster, session: aiohttp.ClientSession, kind: str
) -> None:
    body: dict[str, object] = {"return_token_ids": True, "max_tokens": 4}
    body |= CHAT if kind == "chat" else {"model": "m1", "prompt": "one two three"}
    result = await whole(session, url(cluster, kind), body)
    choice = result["choices"][0]
    assert choice["token_ids"] == [GEN_BASE + i for i in range(4)]
    prompt = result["prompt_token_ids"] if kind == "chat" else choice["prompt_token_ids"]
    assert len(prompt) == 3 == result["usage"]["prompt_tokens"]
    same_shapes([result], [engine_whole(kind, prompt, choice["token_ids"], "length")])


async def test_without_the_flag_bytes_are_unchanged(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    """`return_token_ids: false` and no flag at all give the same bytes, with no ids in them."""
    headers = {"x-request-id": "same"}
    for kind, base in (("chat", CHAT), ("completion", {"model": "m1", "prompt": "a b"})):
        for extra in ({"stream": True, **USAGE}, {}):
            seen = []
            for flag in ({}, {"return_token_ids": False}):
                body = {**base, **extra, **flag}
                async with session.post(url(cluster, kind), json=body, headers=headers) as resp:
                    seen.append(await resp.read())
            assert seen[0] == seen[1]
            assert b"token_ids" not in seen[0]


async def test_prompt_ids_are_deterministic(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    body = {"model": "m1", "prompt": "the cat the", "max_tokens": 1, "return_token_ids": True}
    first = (await whole(session, url(cluster, "completion"), body))["choices"][0]
    again = (await whole(session, url(cluster, "completion", 1), body))["choices"][0]
    assert first["prompt_token_ids"] == again["prompt_token_ids"]
    ids = first["prompt_token_ids"]
    assert ids[0] == ids[2] != ids[1]
    given = {**body, "prompt": [5, 0, 999]}
    result = await whole(session, url(cluster, "completion"), given)
    assert result["choices"][0]["prompt_token_ids"] == [5, 0, 999]
    assert result["choices"][0]["text"] == "tok0 "  # ids below GEN_BASE are all prompt


async def _resume(
    session: aiohttp.ClientSession,
    target: str,
    prompt: list[int],
    generated: list[int],
    remaining: int | None,
) -> list[Any]:
    """The request the gateway sends to continue a broken stream."""
    body: dict[str, object] = {
        "model": "m1",
        "prompt": prompt + generated,
        "stream": True,
        "return_token_ids": True,
        **USAGE,
    }
    if remaining is not None:
        body["max_tokens"] = remaining
    return await stream(session, target, body)


@pytest.mark.parametrize(
    ("max_tokens", "total", "finish"),
    [(None, DEFAULT_TOKENS, "stop"), (5, 5, "length"), (12, 12, "length")],
)
@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_continuation_yields_exactly_the_rest(
    cluster: SimCluster,
    session: aiohttp.ClientSession,
    kind: str,
    max_tokens: int | None,
    total: int,
    finish: str,
) -> None:
    body: dict[str, object] = {"stream": True, "return_token_ids": True, **USAGE}
    body |= CHAT if kind == "chat" else {"model": "m1", "prompt": "resume me please"}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    full = await stream(session, url(cluster, kind), body)
    answer, ids, prompt = texts(full), gen_ids(full), prompt_ids_of(full)
    assert len(ids) == total and finish_of(full) == finish
    for done in range(total + 1):
        remaining = None if max_tokens is None else max_tokens - done
        if remaining == 0:
            continue  # nothing left to ask for: the gateway would not resume
        rest = await _resume(session, url(cluster, "completion", 1), prompt, ids[:done], remaining)
        assert "".join(token_text(i) for i in range(done)) + texts(rest) == answer
        assert ids[:done] + gen_ids(rest) == ids
        assert prompt_ids_of(rest) == prompt + ids[:done]
        assert finish_of(rest) == finish
        assert rest[-1]["usage"] == {
            "prompt_tokens": len(prompt) + done,
            "completion_tokens": total - done,
            "total_tokens": len(prompt) + total,
            "prompt_tokens_details": {"cached_tokens": 0},
        }


async def test_continuation_past_the_end_is_an_empty_stop(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    prompt = [1, 2]
    generated = [GEN_BASE + i for i in range(DEFAULT_TOKENS)]
    chunks = await _resume(session, url(cluster, "completion"), prompt, generated, None)
    assert len(chunks) == 2  # the finish (it carries the prompt ids), then the usage
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt + generated
    assert chunks[0]["choices"][0]["token_ids"] == [] and finish_of(chunks) == "stop"
    assert chunks[1]["usage"]["completion_tokens"] == 0


async def test_non_streaming_continuation(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    prompt = [7, 8, 9]
    body = {"model": "m1", "prompt": [*prompt, GEN_BASE, GEN_BASE + 1], "max_tokens": 3}
    result = await whole(session, url(cluster, "completion"), {**body, "return_token_ids": True})
    choice = result["choices"][0]
    assert choice["text"] == "tok2 tok3 tok4 "
    assert choice["token_ids"] == [GEN_BASE + 2, GEN_BASE + 3, GEN_BASE + 4]
    assert choice["prompt_token_ids"] == body["prompt"]
    assert choice["finish_reason"] == "length"
    assert result["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    plain = await whole(session, url(cluster, "completion"), {**body, "max_tokens": 100})
    assert plain["choices"][0]["text"] == "".join(token_text(i) for i in range(2, 102))
    assert "token_ids" not in plain["choices"][0]
    unbounded = {k: v for k, v in body.items() if k != "max_tokens"}
    last = await whole(session, url(cluster, "completion"), unbounded)
    assert last["choices"][0]["text"] == "".join(token_text(i) for i in range(2, DEFAULT_TOKENS))
    assert last["choices"][0]["finish_reason"] == "stop"


async def test_faults_apply_to_continuations(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    """A stream dropped on u0, resumed on u1 where it is dropped again, finished on u0."""
    body = {**CHAT, "stream": True, "return_token_ids": True, "max_tokens": 10}
    await control.fault("u0", "drop", after_tokens=3, count=1)
    await control.fault("u1", "drop", after_tokens=2, count=1)
    got: list[Any] = []
    prompt: list[int] = []
    target = url(cluster, "chat", 0)
    for hop in range(3):
        try:
            async with session.post(target, json=body) as resp:
                async for data in sse_data(resp):
                    if data != b"[DONE]":
                        got.append(orjson.loads(data))
        except aiohttp.ClientError:
            assert hop < 2
        else:
            assert hop == 2
            break
        prompt = prompt or prompt_ids_of(got)
        done = len(gen_ids(got))
        assert done == (3, 5)[hop]
        target = url(cluster, "completion", 1 - hop % 2)
        body = {"model": "m1", "prompt": prompt + gen_ids(got), "max_tokens": 10 - done}
        body |= {"stream": True, "return_token_ids": True}
    assert texts(got) == "".join(token_text(i) for i in range(10))
    assert gen_ids(got) == [GEN_BASE + i for i in range(10)]
    assert finish_of(got) == "length"
    assert (await control.stats("u1"))["failed"] == 1


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ([1, -1], "prompt"),
        ([[1, 2], [-3]], "prompt"),
        ([1, True], "prompt"),
        ([1, "a", 2.5], "prompt"),
        ([{"a": 1}], "prompt"),
    ],
)
async def test_bad_token_id_prompts_are_rejected(
    cluster: SimCluster, session: aiohttp.ClientSession, prompt: object, field: str
) -> None:
    body = {"model": "m1", "prompt": prompt, "return_token_ids": True}
    async with session.post(url(cluster, "completion"), json=body) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(field + ":")


async def test_return_token_ids_must_be_a_boolean(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    async with session.post(url(cluster, "chat"), json={**CHAT, "return_token_ids": 1}) as resp:
        assert resp.status == 400
        assert "return_token_ids" in (await resp.json())["error"]["message"]
