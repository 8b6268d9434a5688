"""Two stock `vllm serve` processes (vLLM 0.32's own OpenAI server, the SmolLM2 export) as
`kind = "vllm"` units behind a real gateway, one of them started with `--api-key`: vLLM's API
through the gateway with the official client, load read from their /metrics, and a server
killed mid-stream whose client gets the same greedy text from the other.

The two servers take a minute or two to start on two cores, so one pair serves the module;
the kill is the last test.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from openai import AsyncOpenAI

from gateway.config import config_from_dict
from gateway.health.kinds.vllm_metrics import QUERY
from gateway.server import Gateway, running
from loadtest.bench.stock_vllm import export_smollm2
from tests.gateway.servers import until
from tests.support import until_routable
from tests.vllm.stock_support import INFO_FLAGS, TOOL_FLAGS, Stock, start_stock, wait_ready

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("vllm_required"),
]
PUBLIC = "SmolLM2-135M-Instruct"
KEY = "stock-key-7"
QUESTION = [{"role": "user", "content": "Name three fruits, one per line."}]


# Each answer's usage says how many prompt tokens the server's cache held.
DETAILS = "--enable-prompt-tokens-details"


@pytest.fixture(scope="module")
def stock(tmp_path_factory: pytest.TempPathFactory, vllm_required: None) -> Iterator[list[Stock]]:
    tmp = tmp_path_factory.mktemp("stock")
    model = export_smollm2(tmp / "smollm2-hf")
    servers = [
        # s0 schedules by priority (the gateway's classes reach it); s1 does not.
        start_stock(
            tmp,
            "s0",
            model,
            *TOOL_FLAGS,
            *INFO_FLAGS,
            *("--scheduling-policy", "priority"),
            DETAILS,
            cpu=0,
            kv=True,
        ),
        start_stock(
            tmp, "s1", model, *TOOL_FLAGS, *INFO_FLAGS, DETAILS, "--api-key", KEY, cpu=1, kv=True
        ),
    ]
    try:
        took = wait_ready(servers)
        print(f"two stock vLLM servers ready in {took:.0f} s")
        yield servers
    finally:
        for server in servers:
            if server.proc.proc.poll() is None:
                os.killpg(server.proc.proc.pid, signal.SIGKILL)
                server.proc.proc.wait(30)


def stock_config(stock: list[Stock], s0: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """A gateway over both servers (s1 with its key from S1_KEY); `s0`: more of s0's keys."""
    return {
        "gateway": {"port": 0, "models": [PUBLIC], "shutdown_timeout": 5.0},
        "metrics": {"port": 0},
        "routing": {"affinity": "none"},
        # Two engines share two cores: probes get room to answer late.
        "health": {"interval": 0.25, "timeout": 1.0, "fall": 2, "stall_timeout": 30.0},
        "timeouts": {"first_byte": 120.0, "idle": 60.0},
        "breaker": {"enabled": False},
        "admin": {"enabled": False},
        "units": [
            {
                "id": "s0",
                "leader": stock[0].url,
                "kind": "vllm",
                "served_model": "smol",
                "kv_events": stock[0].kv_events,
                "kv_events_replay": stock[0].kv_replay,
                **s0,
            },
            {
                "id": "s1",
                "leader": stock[1].url,
                "kind": "vllm",
                "served_model": "smol",
                "api_key_env": "S1_KEY",
                "kv_events": stock[1].kv_events,
                "kv_events_replay": stock[1].kv_replay,
            },
        ],
        **sections,
    }


@pytest.fixture
async def gateway(stock: list[Stock], monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("S1_KEY", KEY)
    async with running(config_from_dict(stock_config(stock, {}))) as gw:
        await until_routable(gw, within=60.0)
        yield gw


def client(gw: Gateway) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gw.public_url}/v1", api_key="the-clients-key", max_retries=0)


def status_of(url: str, key: str | None = None) -> int:
    request = urllib.request.Request(url)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_api_key_server_refuses_requests_without_it(stock: list[Stock]) -> None:
    """What the gateway's probes must get past: `--api-key` guards /v1 (not /health)."""
    assert status_of(f"{stock[1].url}/v1/models") == 401
    assert status_of(f"{stock[1].url}/v1/models", KEY) == 200


async def test_both_units_are_probed_and_their_load_read_from_metrics(
    gateway: Gateway, stock: list[Stock]
) -> None:
    for unit in gateway.units.units.values():
        node = unit.nodes[0]
        await until(lambda n=node: n.step is not None, 10.0, f"{unit.id}: load read")  # type: ignore[misc]
        assert node.healthy and node.pending == 0 and node.kv_usage is not None
    # vLLM's /metrics honours prometheus_client's name[] filter: the probe reads a few lines.
    async with aiohttp.ClientSession() as http, http.get(f"{stock[0].url}{QUERY}") as resp:
        text = await resp.read()
    assert b"vllm:num_requests_running{" in text and len(text) < 2000, text[:300]
    # While a request runs (200 tokens, ignore_eos: several seconds here), the leader's
    # report shows it within a /metrics read or two.
    api = client(gateway)
    task = asyncio.create_task(
        api.chat.completions.create(
            model=PUBLIC,
            messages=QUESTION,
            max_tokens=200,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
    )
    try:
        await until(
            lambda: any((u.nodes[0].pending or 0) > 0 for u in gateway.units.units.values()),
            30.0,
            "a unit reports the running request",
        )
    finally:
        await task


async def test_a_streamed_chat_under_the_public_name(gateway: Gateway) -> None:
    stream = await client(gateway).chat.completions.create(
        model=PUBLIC, messages=QUESTION, max_tokens=24, temperature=0, stream=True
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and {c.model for c in chunks} == {PUBLIC}


async def test_a_named_tool_choice_gives_arguments_that_parse(gateway: Gateway) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "search_products",
            "description": "Search the shop's catalogue",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    answer = await client(gateway).chat.completions.create(
        model=PUBLIC,
        messages=[{"role": "user", "content": "Find me running shoes"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "search_products"}},
        max_tokens=60,
        temperature=0,
    )
    call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "search_products"  # type: ignore[union-attr]
    # vLLM constrains the arguments; what SmolLM2 puts in them is its own business (a bare
    # JSON string, seen with vLLM 0.32), but they parse.
    json.loads(call.function.arguments)  # type: ignore[union-attr]


async def test_a_json_schema_answer_validates(gateway: Gateway) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "price": {"type": "number"},
            "reasons": {
                "type": "array",
                "items": {"type": "string", "maxLength": 40},
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["name", "price", "reasons"],
        "additionalProperties": False,
    }
    answer = await client(gateway).chat.completions.create(
        model=PUBLIC,
        messages=[{"role": "user", "content": "A product card for a rain jacket."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "card", "schema": schema, "strict": True},
        },
        max_tokens=400,
        temperature=0,
    )
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)


async def test_logprobs_and_two_choices(gateway: Gateway) -> None:
    api = client(gateway)
    answer = await api.chat.completions.create(
        model=PUBLIC, messages=QUESTION, max_tokens=6, logprobs=True, top_logprobs=2
    )
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(len(t.top_logprobs) == 2 for t in content)
    two = await api.chat.completions.create(
        model=PUBLIC, messages=QUESTION, max_tokens=6, n=2, temperature=1.0, seed=3
    )
    assert [c.index for c in two.choices] == [0, 1]
    stream = await api.chat.completions.create(
        model=PUBLIC, messages=QUESTION, max_tokens=6, n=2, temperature=1.0, stream=True
    )
    assert {c.choices[0].index async for c in stream if c.choices} == {0, 1}


async def test_responses_and_messages_stream_through(gateway: Gateway) -> None:
    stream = await client(gateway).responses.create(
        model=PUBLIC, input="Say hi", max_output_tokens=12, stream=True
    )
    kinds = [event.type async for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    body = {
        "model": PUBLIC,
        "max_tokens": 12,
        "stream": True,
        "messages": [{"role": "user", "content": "Say hi"}],
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gateway.public_url}/v1/messages", json=body) as resp,
    ):
        assert resp.status == 200
        raw = await resp.read()
    assert raw.startswith(b"event: message_start") and b"event: message_stop" in raw
    assert f'"model":"{PUBLIC}"'.encode() in raw and b'"model":"smol"' not in raw


async def test_vllms_other_routes_answer_through_the_gateway(gateway: Gateway) -> None:
    """Tokenization, the batch chat, SageMaker's entry, vLLM's /health, /version and model
    cards: each answered by a unit (or from them), the model left out where vLLM allows it."""
    import vllm  # this venv's: what both units run

    async with aiohttp.ClientSession(gateway.public_url) as http:
        async with http.post("/tokenize", json={"prompt": "Hello there"}) as resp:
            assert resp.status == 200, await resp.text()
            tokens = (await resp.json())["tokens"]
        async with http.post("/detokenize", json={"model": PUBLIC, "tokens": tokens}) as resp:
            assert resp.status == 200 and (await resp.json())["prompt"] == "Hello there"
        async with http.get("/tokenizer_info") as resp:
            assert resp.status == 200 and "tokenizer_class" in await resp.json()
        batch = {"messages": [QUESTION, QUESTION], "max_tokens": 3}
        async with http.post("/v1/chat/completions/batch", json=batch) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
        assert len(answer["choices"]) == 2 and answer["model"] == PUBLIC
        chat = {"messages": QUESTION, "max_tokens": 3}
        async with http.post("/invocations", json=chat) as resp:
            assert resp.status == 200 and (await resp.json())["object"] == "chat.completion"
        async with http.get("/health") as resp:
            assert (resp.status, await resp.read()) == (200, b"")
        async with http.get("/version") as resp:
            said = await resp.json()
        assert said["version"] == vllm.__version__ and set(said["units"]) == {"s0", "s1"}
        async with http.get("/v1/models") as resp:
            (card,) = (await resp.json())["data"]
        assert card["id"] == PUBLIC and card["max_model_len"] == 2048
        assert card["root"].endswith("smollm2-hf") and card["owned_by"] == "vllm"


async def test_a_stored_response_is_read_and_continued_on_its_unit(gateway: Gateway) -> None:
    """vLLM keeps a stored response in its own memory: every read and follow-up must reach
    the unit that made it, whichever of the two that was."""
    api = client(gateway)
    first = await api.responses.with_raw_response.create(
        model=PUBLIC, input="Say hi", max_output_tokens=8
    )
    home, made = first.headers["x-unitgate-unit"], first.parse()
    for _ in range(6):  # with two units, a lucky guess passes six times in 64
        read = await api.responses.with_raw_response.retrieve(made.id)
        assert read.headers["x-unitgate-unit"] == home and read.parse().id == made.id
    follow = await api.responses.with_raw_response.create(
        model=PUBLIC, input="And again", max_output_tokens=8, previous_response_id=made.id
    )
    assert follow.headers["x-unitgate-unit"] == home
    async with (
        aiohttp.ClientSession(gateway.public_url) as http,
        http.get("/v1/responses/resp_nowhere") as resp,
    ):
        assert resp.status == 404
        error = (await resp.json())["error"]
    assert error["message"] == "Response with id 'resp_nowhere' not found."


async def test_priority_classes_reach_the_server_that_schedules_by_them_and_only_it(
    stock: list[Stock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM orders its waiting requests by `priority` only when started with
    `--scheduling-policy priority` (0.32 ignores the field otherwise; older releases refuse
    it): the gateway sends its class's priority to s0 (`priority = true`), not to s1."""
    body = {"model": "smol", "messages": QUESTION, "max_tokens": 4, "priority": -1}
    url = f"{stock[0].url}/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
        assert r.status == 200, await r.text()  # the field as the gateway sends it
    monkeypatch.setenv("S1_KEY", KEY)
    raw = stock_config(stock, {"priority": True}, priority={})
    async with running(config_from_dict(raw)) as gw, aiohttp.ClientSession() as http:
        await until_routable(gw, within=60.0)
        served: set[str] = set()
        for i in range(40):  # until each unit took some (the picker is random)
            if served == {"s0", "s1"} and i >= 6:
                break
            klass = ("interactive", "batch", "standard")[i % 3]
            chat = {"model": PUBLIC, "messages": QUESTION, "max_tokens": 2}
            heads = {"x-unitgate-priority": klass}
            async with http.post(
                gw.public_url + "/v1/chat/completions", json=chat, headers=heads
            ) as r:
                assert r.status == 200, (klass, r.headers.get("x-unitgate-unit"), await r.text())
                served.add(r.headers["x-unitgate-unit"])
        assert served == {"s0", "s1"}  # both took classed requests, each as it could


async def test_a_prompt_cached_on_one_server_draws_its_requests_there(
    stock: list[Stock], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Both servers publish their KV cache events. A long prompt sent straight to s1 (not
    through the gateway) is cached there; the gateway learns it from s1's events, and the
    same prompt through it goes to s1 every time, where load alone would pick either. The
    prompt ids the gateway computes are the ones s1 reports."""
    from engine.model.export import export_tokenizer
    from engine.model.gguf import GGUFFile, gguf_path
    from gateway.kvevents.prompts import PromptTokens

    export_tokenizer(GGUFFile(gguf_path("smollm2")), tmp_path)
    system = "You are the shopping assistant of an outdoor store; answer briefly. " * 30
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "A tent?"}]
    direct = {"model": "smol", "messages": messages, "max_tokens": 1, "return_token_ids": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        url = f"{stock[1].url}/v1/chat/completions"
        async with http.post(url, json=direct, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            reported = (await resp.json())["prompt_token_ids"]
    ids = PromptTokens(tmp_path).chat(messages)
    assert ids is not None and list(ids) == reported, "the gateway's prompt ids are not vLLM's"
    assert len(ids) > 3 * 128  # more than three of the CPU build's blocks

    monkeypatch.setenv("S1_KEY", KEY)
    raw = stock_config(
        stock, {}, routing={"affinity": "none", "tokenizers": {PUBLIC: str(tmp_path)}}
    )
    async with running(config_from_dict(raw)) as gw, aiohttp.ClientSession() as http:
        await until_routable(gw, within=60.0)
        kv = gw.knowledge.kv
        assert kv is not None
        await until(
            lambda: kv.depths(ids, ["s0", "s1"]).get("s1", 0) >= 3 * 128, 30.0, "s1's blocks"
        )
        assert kv.depths(ids, ["s0", "s1"]) == {"s1": (len(ids) - 1) // 128 * 128}
        chat = {"model": PUBLIC, "messages": messages, "max_tokens": 1}
        for n in range(8):  # by load alone, eight in a row to s1 is one chance in 256
            streamed = {**chat, "stream": True} if n % 2 else chat
            async with http.post(gw.public_url + "/v1/chat/completions", json=streamed) as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-unitgate-unit"] == "s1"
                text = await r.text()
                # A stream's usage chunk was the gateway's to read: the client did not ask.
                assert ("usage" in text) is (n % 2 == 0), text
        # What the gateway predicted s1's cache held is what s1 says it held.
        async with http.get(gw.metrics_url + "/metrics") as r:
            metrics = await r.text()
        held = (len(ids) - 1) // 128 * 128  # vLLM computes the last token whatever it holds
        assert 'unitgate_prefix_predictions_total{outcome="exact",unit="s1"} 8.0' in metrics
        predicted = (
            f'unitgate_prefix_cached_tokens_total{{source="predicted",unit="s1"}} {8 * held}'
        )
        assert predicted in metrics
        assert f'{{source="reported",unit="s1"}} {8 * held}' in metrics


async def test_without_a_tokenizer_a_conversations_next_turn_goes_where_its_start_is_cached(
    stock: list[Stock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tokenizer for the model: the gateway keeps each streamed turn's prompt ids as the
    unit reported them, and a conversation's next turn, which starts with them, goes to the
    unit whose cache holds them (placed by load alone, four in a row to the right unit is one
    chance in sixteen)."""
    from gateway.kvevents.turns import digest

    monkeypatch.setenv("S1_KEY", KEY)
    async with (
        running(config_from_dict(stock_config(stock, {}))) as gw,
        aiohttp.ClientSession() as http,
    ):
        await until_routable(gw, within=60.0)
        kv, turns = gw.knowledge.kv, gw.knowledge.turns
        assert kv is not None and turns is not None
        url = gw.public_url + "/v1/chat/completions"
        for n in range(4):
            system = f"Conversation {n}: you are the shop's assistant for item {n}. " * 40
            first = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
            body = {"model": PUBLIC, "messages": first, "max_tokens": 2, "stream": True}
            async with http.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                served = r.headers["x-unitgate-unit"]
                await r.read()
            kept = turns.peek(digest(first))
            assert kept is not None and len(kept) > 3 * 128
            await until(
                lambda kept=kept, served=served: kv.depths(kept, [served]).get(served, 0) > 0,
                30.0,
                f"{served}'s blocks of conversation {n}",
            )
            answer = {"role": "assistant", "content": "Hello!"}
            second = [*first, answer, {"role": "user", "content": "A tent?"}]
            body = {"model": PUBLIC, "messages": second, "max_tokens": 2, "stream": True}
            async with http.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-unitgate-unit"] == served, f"conversation {n}"
                await r.read()
        assert (turns.hits, len(turns)) == (4, 8)


async def test_zz_a_server_killed_mid_stream_leaves_the_client_the_same_greedy_text(
    gateway: Gateway, stock: list[Stock], record_property: Any
) -> None:
    """Last in the module: it kills one of the two servers."""
    api = client(gateway)
    # ignore_eos (a vLLM field, carried to the continuation): all 48 tokens, a long stream.
    ask = {"model": PUBLIC, "messages": QUESTION, "max_tokens": 48, "temperature": 0}
    reference = await api.chat.completions.create(**ask, extra_body={"ignore_eos": True})  # type: ignore[call-overload]
    expected = reference.choices[0].message.content
    assert expected and reference.usage.completion_tokens == 48  # type: ignore[union-attr]
    body = {**ask, "stream": True, "ignore_eos": True}
    got, killed_at, detected = "", 0.0, asyncio.get_running_loop().create_future()

    async def ejection(victim: str) -> None:
        unit = gateway.units.units[victim]
        await until(lambda: not unit.healthy, 10.0, f"{victim} ejected")
        detected.set_result(time.monotonic() - killed_at)

    watcher: asyncio.Task[None] | None = None
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gateway.public_url}/v1/chat/completions", json=body) as resp,
    ):
        victim = resp.headers["x-unitgate-unit"]
        pieces = 0
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                got += chunk["choices"][0]["delta"].get("content") or ""
                pieces += 1
            if pieces == 8 and not killed_at:
                server = stock[int(victim[1])]
                os.killpg(server.proc.proc.pid, signal.SIGKILL)
                killed_at = time.monotonic()
                watcher = asyncio.create_task(ejection(victim))
    assert killed_at and watcher is not None, "the stream ended before the kill"
    await watcher
    kv = gateway.knowledge.kv
    assert kv is not None
    await until(lambda: not kv.trusted(victim), 10.0, f"{victim}'s KV events untrusted")
    record_property("detection_s", round(detected.result(), 3))
    print(f"kill -9 of {victim} mid-stream: ejected {detected.result():.2f} s later")
    assert got == expected
