"""The proxy path on success: byte-identical streams, headers, non-streaming, the openai client."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import openai
import pytest

from gateway.server import Gateway, running
from tests.support import MODEL, SimProcess, chat_body, gateway_config

pytestmark = pytest.mark.both_relays

CHAT = "/v1/chat/completions"


async def test_stream_is_byte_identical_to_the_leader(
    gateway: Gateway, clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    body = chat_body(stream=True, stream_options={"include_usage": True})
    async with http.post(
        gateway.public_url + "/v1/chat/completions", json=body, headers={"x-request-id": "same-id"}
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["x-request-id"] == "same-id"
        unit_id = resp.headers["x-unitgate-unit"]
        relayed = await resp.read()
    leader = next(u["leader"] for u in clean_sim.units if u["id"] == unit_id)
    async with http.post(
        leader + "/v1/chat/completions", json=body, headers={"x-request-id": "same-id"}
    ) as resp:
        direct = await resp.read()
    assert relayed == direct
    assert relayed.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' in relayed


async def test_non_streaming_and_completions(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    async with http.post(
        gateway.public_url + "/v1/chat/completions", json=chat_body(stream=False)
    ) as resp:
        assert resp.status == 200
        payload = await resp.json()
        assert payload["object"] == "chat.completion"
        assert payload["choices"][0]["message"]["content"].startswith("tok0 ")
        assert resp.headers["x-unitgate-unit"] in {"u0", "u1", "u2"}
        assert len(resp.headers["x-request-id"]) >= 16
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 3, "stream": True}
    async with http.post(gateway.public_url + "/v1/completions", json=body) as resp:
        text = await resp.text()
        assert resp.status == 200
        assert text.count("data: ") == 4 + 1  # 3 tokens, the finish chunk... and [DONE]
        assert text.endswith("data: [DONE]\n\n")


async def test_models_health_and_ready(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    async with http.get(gateway.public_url + "/v1/models") as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == [MODEL]
    async with http.get(gateway.public_url + "/healthz") as resp:
        assert resp.status == 200
    async with http.get(gateway.public_url + "/readyz") as resp:
        assert resp.status == 200


async def test_load_spreads_across_units(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    async def one() -> str:
        async with http.post(gateway.public_url + "/v1/chat/completions", json=chat_body()) as resp:
            await resp.read()
            return resp.headers["x-unitgate-unit"]

    served = Counter(await asyncio.gather(*(one() for _ in range(90))))
    assert set(served) == {"u0", "u1", "u2"}
    assert min(served.values()) >= 15, served


async def test_affinity_pins_sessions_and_prefixes(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async def units_for(body: dict[str, object], headers: dict[str, str]) -> set[str]:
        seen = set()
        for _ in range(8):
            async with http.post(gw.public_url + CHAT, json=body, headers=headers) as resp:
                await resp.read()
                seen.add(resp.headers["x-unitgate-unit"])
        return seen

    config = gateway_config(clean_sim.units, routing={"affinity": "session+prefix"})
    async with running(config) as gw:
        by_header = [await units_for(chat_body(), {"x-session-id": f"s{i}"}) for i in range(6)]
        by_user = [await units_for(chat_body(user=f"user{i}"), {}) for i in range(6)]
        prompt = [{"role": "user", "content": "a long shared system prompt"}]
        by_prefix = await units_for(chat_body(messages=prompt), {})
    assert all(len(seen) == 1 for seen in [*by_header, *by_user, by_prefix])
    assert len(set().union(*by_header, *by_user)) > 1  # different keys land on different units


async def test_openai_client_streams_through_the_gateway(gateway: Gateway) -> None:
    client = openai.AsyncOpenAI(
        base_url=gateway.public_url + "/v1", api_key="unused", max_retries=0
    )
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=5,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        assert text == "tok0 tok1 tok2 tok3 tok4 "
        assert usage is not None and usage.completion_tokens == 5
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        try:
            await client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}]
            )
            raise AssertionError("unknown model accepted")
        except openai.NotFoundError as exc:
            assert exc.status_code == 404
    finally:
        await client.close()


async def test_metrics_are_exported(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    async with http.post(gateway.public_url + "/v1/chat/completions", json=chat_body()) as resp:
        await resp.read()
    async with http.get(gateway.metrics_url + "/metrics") as resp:
        text = await resp.text()
    for name in (
        "unitgate_requests_total",
        "unitgate_time_to_first_token_seconds_bucket",
        "unitgate_inter_token_latency_seconds_count",
        "unitgate_request_duration_seconds_sum",
        "unitgate_unit_inflight",
        "unitgate_retries_total",
        "unitgate_retry_budget_exhausted_total",
        "unitgate_cancellations_total",
        "unitgate_queue_depth",
    ):
        assert name in text, name
    assert f'unitgate_requests_total{{model="{MODEL}",status="200",unit="' in text
