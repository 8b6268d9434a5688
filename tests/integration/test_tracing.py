"""Tracing: a span per request, a child span per attempt, traceparent sent to the leader."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.server import running
from tests.support import chat_body, gateway_config, session_ranking_first

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
STREAM = b"data: {}\n\ndata: [DONE]\n\n"


@asynccontextmanager
async def capturing_unit(
    unit_id: str, status: int, seen: list[str]
) -> AsyncIterator[dict[str, object]]:
    """A leader that records the traceparent it receives and answers `status`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        length = int(head.lower().split("content-length:")[1].split("\r\n")[0])
        await reader.readexactly(length)
        seen.extend(
            line.split(":", 1)[1].strip()
            for line in head.split("\r\n")
            if line.lower().startswith("traceparent:")
        )
        if status == 200:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
            writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(STREAM), STREAM))
        else:
            writer.write(b"HTTP/1.1 %d Oops\r\nContent-Length: 2\r\n\r\n{}" % status)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield {"id": unit_id, "leader": url, "nodes": [url]}
    finally:
        server.close()
        await server.wait_closed()


async def test_span_tree_and_propagation(http: aiohttp.ClientSession) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen_bad: list[str] = []
    seen_good: list[str] = []
    async with (
        capturing_unit("bad", 503, seen_bad) as bad,
        capturing_unit("good", 200, seen_good) as good,
    ):
        config = gateway_config([bad, good], routing={"affinity": "session"})
        async with running(config, provider) as gw:
            session = session_ranking_first("bad", ["good"])
            traceparent = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
            headers = {"x-session-id": session, "traceparent": traceparent}
            async with http.post(
                gw.public_url + "/v1/chat/completions", json=chat_body(), headers=headers
            ) as resp:
                assert resp.status == 200
                assert await resp.read() == STREAM
    spans = exporter.get_finished_spans()
    request = next(s for s in spans if s.kind == SpanKind.SERVER)
    attempts = sorted(
        (s for s in spans if s.kind == SpanKind.CLIENT),
        key=lambda s: s.attributes["unitgate.attempt"],
    )  # type: ignore[index]
    assert format(request.context.trace_id, "032x") == CLIENT_TRACE  # the client's trace goes on
    assert request.attributes["http.response.status_code"] == 200  # type: ignore[index]
    assert [a.attributes["unitgate.unit"] for a in attempts] == ["bad", "good"]  # type: ignore[index]
    assert [a.attributes["unitgate.outcome"] for a in attempts] == ["status", "ok"]  # type: ignore[index]
    assert attempts[0].status.status_code == StatusCode.ERROR
    assert all(
        a.parent is not None and a.parent.span_id == request.context.span_id for a in attempts
    )
    for seen, attempt in ((seen_bad, attempts[0]), (seen_good, attempts[1])):
        assert seen == [f"00-{CLIENT_TRACE}-{attempt.context.span_id:016x}-01"]


async def test_no_tracing_sends_no_traceparent(http: aiohttp.ClientSession) -> None:
    seen: list[str] = []
    async with capturing_unit("u", 200, seen) as unit, running(gateway_config([unit])) as gw:
        assert not gw.tracing.enabled
        async with http.post(gw.public_url + "/v1/chat/completions", json=chat_body()) as resp:
            assert resp.status == 200
            await resp.read()
    assert seen == []
