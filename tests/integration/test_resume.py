"""Mid-stream resumption against simulated units: what breaks a stream, what continues it,
and where it stops trying. The sim's token i has text `tok{i} ` wherever it is generated, so
an answer is correct when it is exactly tok0 .. tok{n-1}, once each."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.server import Gateway, running
from tests.integration.test_relay_edges import raw_unit
from tests.support import (
    SimProcess,
    chat_body,
    gateway_config,
    session_ranking_first,
    sim_stats,
    sim_total,
    sse_events,
    until_routable,
    usage_counts,
)

pytestmark = pytest.mark.both_relays

CHAT = "/v1/chat/completions"
# A session whose first choice (affinity "session") is u0, with u1 as the only other unit.
FIRST_U0 = {"x-session-id": session_ranking_first("u0", ["u1"])}


def expected_text(n: int) -> str:
    return "".join(f"tok{i} " for i in range(n))


def content(events: list[Any]) -> str:
    return "".join(
        ch["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict)
        for ch in e.get("choices", [])
    )


def fail_u0_probes_at(sim: SimProcess, tokens: int) -> Callable[[list[Any]], None]:
    """An `sse_events` hook: once the client has `tokens` tokens, u0's follower fails its probes."""

    def hook(events: list[Any]) -> None:
        if content(events) == expected_text(tokens):
            sim.post("/units/u0/nodes/1/health", {"mode": "unhealthy"})

    return hook


def metric(gw: Gateway, unit: str, outcome: str) -> float:
    needle = f'unitgate_resumptions_total{{outcome="{outcome}",unit="{unit}"}} '
    for line in gw.metrics.render().decode().splitlines():
        if line.startswith(needle):
            return float(line.split()[-1])
    return 0.0


async def chat(
    http: aiohttp.ClientSession, gw: Gateway, headers: dict[str, str] | None = None, **extra: Any
) -> list[Any]:
    async with http.post(gw.public_url + CHAT, json=chat_body(**extra), headers=headers) as resp:
        assert resp.status == 200
        return await sse_events(resp)


async def test_resumed_answer_is_the_uninterrupted_one(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(clean_sim.units[:2], routing={"affinity": "session"})
    async with running(config) as gw:
        usage = {"stream_options": {"include_usage": True}}
        plain = await chat(http, gw, max_tokens=10, **usage)
        clean_sim.fault("u0", "drop", after_tokens=4)
        got = await chat(http, gw, FIRST_U0, max_tokens=10, **usage)
        assert metric(gw, "u0", "ok") == 1.0
        assert gw.units.total_inflight() == 0
    assert content(got) == content(plain) == expected_text(10)
    chunks = [e for e in got if isinstance(e, dict)]
    assert len({c["id"] for c in chunks}) == 1
    assert sum("role" in ch["delta"] for c in chunks for ch in c["choices"]) == 1
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == ["length"]
    assert chunks[-1]["usage"] == usage_counts(plain[-2]["usage"])  # the whole answer, once
    assert all("token_ids" not in ch for c in chunks for ch in c["choices"])
    assert got[-1] == "[DONE]"


async def test_every_unit_dropping_gives_up_after_max_resumes(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(clean_sim.units, retry={"budget_min_per_second": 10.0})
    async with running(config) as gw:
        for unit in clean_sim.units:
            clean_sim.fault(unit["id"], "drop", after_tokens=2)
        got = await chat(http, gw, max_tokens=12)
        ok = sum(metric(gw, u["id"], "ok") for u in clean_sim.units)
        gave_up = sum(metric(gw, u["id"], "gave_up") for u in clean_sim.units)
        assert gw.units.total_inflight() == 0
    # 2 resumptions (the default), each advancing 2 tokens, then an explicit error and [DONE].
    assert content(got) == expected_text(6)
    assert got[-2]["error"]["code"] == "reset" and "not resumed" in got[-2]["error"]["message"]
    assert got[-1] == "[DONE]"
    assert (ok, gave_up) == (2.0, 1.0)
    assert await sim_total(http, clean_sim, "requests") == 3


async def test_resumes_are_paid_from_the_retry_budget(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    retry = {"budget_ratio": 0.0, "budget_min_per_second": 0.0}
    async with running(gateway_config(clean_sim.units[:2], retry=retry)) as gw:
        clean_sim.fault("u0", "drop", after_tokens=2)
        clean_sim.fault("u1", "drop", after_tokens=2)
        got = await chat(http, gw, max_tokens=8)
    assert content(got) == expected_text(2)
    assert "retry budget" in got[-2]["error"]["message"] and got[-1] == "[DONE]"


async def test_a_unit_ejected_by_its_probes_hands_its_streams_over_at_once(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    """A stalled unit sends nothing (the idle timeout is 30 s); once its follower's probes
    fail, the ejection breaks the stream for resumption long before the idle timeout."""
    config = gateway_config(
        clean_sim.units[:2], health={"enabled": True}, routing={"affinity": "session"}
    )
    async with running(config) as gw:
        await until_routable(gw)
        clean_sim.fault("u0", "stall", after_tokens=3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with http.post(
            gw.public_url + CHAT, json=chat_body(max_tokens=12), headers=FIRST_U0
        ) as resp:
            assert resp.headers["x-unitgate-unit"] == "u0"
            # Once u0 has sent its 3 tokens it is stalled: fail its probes.
            events = await sse_events(resp, fail_u0_probes_at(clean_sim, 3))
        elapsed = loop.time() - started
        assert metric(gw, "u0", "ok") == 1.0
    assert content(events) == expected_text(12) and events[-1] == "[DONE]"
    assert elapsed < 10.0  # the idle timeout (30 s) played no part


async def test_streams_the_gateway_breaks_itself_are_not_breaker_evidence_nor_paid(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    """The ejection breaks u0's stalled stream: the gateway did that, so u0's breaker (tripping
    on a single failure here) does not hear of it, and the resumption is free (a retry budget
    of nothing still lets it through)."""
    config = gateway_config(
        clean_sim.units[:2],
        health={"enabled": True},
        breaker={"enabled": True, "consecutive_failures": 1},
        retry={"budget_ratio": 0.0, "budget_min_per_second": 0.0},
        routing={"affinity": "session"},
    )
    async with running(config) as gw:
        await until_routable(gw)
        clean_sim.fault("u0", "stall", after_tokens=3)
        async with http.post(
            gw.public_url + CHAT, json=chat_body(max_tokens=12), headers=FIRST_U0
        ) as resp:
            assert resp.headers["x-unitgate-unit"] == "u0"
            events = await sse_events(resp, fail_u0_probes_at(clean_sim, 3))
        assert metric(gw, "u0", "ok") == 1.0
        assert gw.breakers.board.state("u0") == "admitting"
        assert gw.units.units["u0"].admitting
    assert content(events) == expected_text(12) and events[-1] == "[DONE]"


async def test_units_without_token_ids_fall_back_to_an_error_event(
    http: aiohttp.ClientSession,
) -> None:
    async def no_ids(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        chunk["choices"] = [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        w.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await w.drain()
        w.transport.abort()

    async with raw_unit(no_ids) as a, raw_unit(no_ids) as b:
        units = [{**a, "id": "a"}, {**b, "id": "b"}]
        async with running(gateway_config(units)) as gw:
            got = await chat(http, gw)
            broken = [u for u in gw.units.units.values() if u.token_ids is False]
            assert len(broken) == 1 and metric(gw, broken[0].id, "unsupported") == 1.0
    assert content(got) == "hi"
    assert "returns no token ids" in got[-2]["error"]["message"] and got[-1] == "[DONE]"


async def test_a_client_leaving_a_resumed_stream_frees_everything(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(clean_sim.units[:2], routing={"affinity": "session"})
    async with running(config) as gw:
        clean_sim.post("/units/u1/settings", {"itl_ms": 50})
        clean_sim.fault("u0", "drop", after_tokens=2)
        body = chat_body(max_tokens=200)
        async with http.post(gw.public_url + CHAT, json=body, headers=FIRST_U0) as resp:
            async for line in resp.content:
                # Two tokens past the resumption: leave.
                if line.startswith(b"data: {") and content([orjson.loads(line[6:])]) == "tok3 ":
                    break
        assert gw.units.units["u0"].token_ids is True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        assert gw.proxy is not None
        while gw.units.total_inflight() or gw.proxy.live.count():
            assert loop.time() < deadline, "the resumed stream was not released"
            await asyncio.sleep(0.02)
        assert metric(gw, "u0", "ok") == 1.0
        while (await sim_stats(http, clean_sim, "u1"))["cancelled"] < 1:  # u1 saw it abort
            assert loop.time() < deadline, "the continuation was not cancelled upstream"
            await asyncio.sleep(0.02)


async def test_an_ejected_unit_still_sending_tokens_keeps_its_stream(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    """A probe can fail on a loaded but working unit: its live streams are not cut."""
    config = gateway_config(
        clean_sim.units[:2], health={"enabled": True}, routing={"affinity": "session"}
    )
    async with running(config) as gw:
        await until_routable(gw)
        clean_sim.post("/units/u0/settings", {"itl_ms": 25})
        async with http.post(
            gw.public_url + CHAT, json=chat_body(max_tokens=80), headers=FIRST_U0
        ) as resp:
            events = await sse_events(resp, fail_u0_probes_at(clean_sim, 2))
        assert not gw.units.units["u0"].healthy  # it was ejected while the stream ran
        assert metric(gw, "u0", "ok") == 0.0
    assert content(events) == expected_text(80) and events[-1] == "[DONE]"


async def test_a_resumption_is_traced_and_logged(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = gateway_config(clean_sim.units[:2], routing={"affinity": "session"})
    async with running(config, provider) as gw:
        clean_sim.fault("u0", "drop", after_tokens=3)
        got = await chat(http, gw, FIRST_U0, max_tokens=6)
        logged = [e.to_json() for e in gw.events.recent(unit="u0")]
    assert content(got) == expected_text(6)
    spans = exporter.get_finished_spans()
    request = next(s for s in spans if s.kind == SpanKind.SERVER)
    attempts = [s for s in spans if s.kind == SpanKind.CLIENT]
    assert sorted(a.attributes["unitgate.unit"] for a in attempts) == ["u0", "u1"]  # type: ignore[index]
    resumes = [e for e in request.events if e.name == "resume"]
    assert [dict(e.attributes or {}) for e in resumes] == [{"unitgate.unit": "u0", "outcome": "ok"}]
    assert any(e["what"] == "resume_ok" and "continued on u1" in e["reason"] for e in logged)


@pytest.mark.parametrize("writes", ["head first", "all at once"])
async def test_an_error_event_in_the_same_read_as_the_end_is_resumed(
    clean_sim: SimProcess, http: aiohttp.ClientSession, writes: str
) -> None:
    """A leader whose follower died ends its streams with an error event, and the end of the
    body often arrives in the same read: the stream must be resumed, not left hanging."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    role = {**base, "prompt_token_ids": [1, 2], "choices": [opening]}
    hi = {"index": 0, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None}
    token = {**base, "choices": [{**hi, "token_ids": [5]}]}
    error = {"error": {"message": "engine unhealthy: lost follower 1", "type": "server_error"}}
    events = [b"data: " + orjson.dumps(e) + b"\n\n" for e in (role, token, error)]

    async def dying(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        w.write(b"Transfer-Encoding: chunked\r\n\r\n")
        framed = [b"%x\r\n%b\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]
        if writes == "head first":  # the error event and the body's end in one write
            w.write(b"".join(framed[:2]))
            await w.drain()
            await asyncio.sleep(0.05)
            framed = framed[2:]
        w.write(b"".join(framed))
        await w.drain()

    async with raw_unit(dying) as raw:
        units = [{**raw, "id": "dying"}, clean_sim.units[0]]
        config = gateway_config(units, routing={"affinity": "session"}, timeouts={"total": 20.0})
        headers = {"x-session-id": session_ranking_first("dying", ["u0"])}
        async with running(config) as gw:
            loop = asyncio.get_running_loop()
            started = loop.time()
            got = await chat(http, gw, headers, max_tokens=4)
            elapsed = loop.time() - started
            assert metric(gw, "dying", "ok") == 1.0
    assert content(got).startswith("hi") and got[-1] == "[DONE]"
    assert not any("error" in e for e in got if isinstance(e, dict))
    assert elapsed < 5.0  # not the total timeout
