"""What a client is told when a unit fails: the kind of failure and its request id, never the
unit's address, the OS's error text or the unit's own error body; the log keeps all of those,
under the same request id. Real failures: a unit on a closed port, a unit that answers 500, one
that never answers, and a stream whose unit dies mid-answer with nowhere to continue it."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from typing import Any

import aiohttp
import pytest

from gateway.observability.access_log import ACCESS_LOGGER
from gateway.server import running
from tests.integration.test_relay_edges import raw_unit
from tests.support import SimProcess, chat_body, gateway_config, session_ranking_first, sse_events

pytestmark = pytest.mark.both_relays

CHAT = "/v1/chat/completions"
LEAKS = re.compile(r"127\.0\.0\.1|localhost|errno|refused|connect call|http://", re.IGNORECASE)


def closed_port() -> int:
    """A loopback port nothing listens on (bound by the OS, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def closed_unit(unit_id: str) -> tuple[dict[str, Any], int]:
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    return {"id": unit_id, "leader": url, "nodes": [url]}, port


def assert_tells_only_the_kind(message: str, rid: str, port: int | None = None) -> None:
    assert message.endswith(f"(request id {rid})"), message
    bare = message.removesuffix(f"(request id {rid})")
    assert not LEAKS.search(bare), message
    if port is not None:
        assert str(port) not in bare, message


def logged(caplog: pytest.LogCaptureFixture, rid: str) -> str:
    """Every log line about request `rid` (its message and its exception, if any)."""
    return "\n".join(
        caplog.handler.format(r) for r in caplog.records if getattr(r, "request_id", None) == rid
    )


async def test_a_unit_on_a_closed_port_is_named_as_a_connect_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    unit, port = closed_unit("dead")
    config = gateway_config([unit], logging={"access": True})
    async with running(config) as gw, aiohttp.ClientSession() as http:
        for stream in (False, True):
            rid = f"closed-{stream}"
            headers = {"x-request-id": rid}
            async with http.post(
                gw.public_url + CHAT, json=chat_body(stream=stream), headers=headers
            ) as resp:
                assert resp.status == 502
                assert resp.headers["x-request-id"] == rid
                error = (await resp.json())["error"]
            assert error["code"] == "connect" and error["type"] == "upstream_error"
            assert error["message"].startswith("upstream connect failed")
            assert_tells_only_the_kind(error["message"], rid, port)
            log = logged(caplog, rid)
            assert f"unit dead at http://127.0.0.1:{port} failed (connect)" in log, log
            assert "[Errno 111]" in log, log
    access = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    assert [(r.status, r.outcome, r.unit) for r in access] == [  # type: ignore[attr-defined]
        (502, "upstream_connect", "dead")  # the unit whose failure was the answer
    ] * 2


async def test_a_units_own_error_body_stays_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    body = b'{"error": "backend 10.9.8.7:8000 exploded"}'

    async def fail(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n")
        w.write(b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body))
        await w.drain()

    headers = {"x-request-id": "five-hundred"}
    async with (
        raw_unit(fail) as unit,
        running(gateway_config([unit])) as gw,
        aiohttp.ClientSession() as http,
        http.post(gw.public_url + CHAT, json=chat_body(stream=False), headers=headers) as resp,
    ):
        assert resp.status == 502
        error = (await resp.json())["error"]
    assert error["code"] == "status"
    assert error["message"].startswith("the unit answered with a server error (HTTP 500)")
    assert_tells_only_the_kind(error["message"], "five-hundred")
    assert "10.9.8.7" not in error["message"]
    assert "backend 10.9.8.7:8000 exploded" in logged(caplog, "five-hundred")


async def test_a_unit_that_never_answers_is_named_as_a_first_byte_timeout(
    clean_sim: SimProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clean_sim.fault("u0", "hang")
    config = gateway_config(clean_sim.units[:1], timeouts={"first_byte": 0.3})
    async with running(config) as gw, aiohttp.ClientSession() as http:
        headers = {"x-request-id": "hung"}
        async with http.post(gw.public_url + CHAT, json=chat_body(), headers=headers) as resp:
            assert resp.status == 504
            error = (await resp.json())["error"]
    assert error["code"] == "first_byte_timeout"
    assert error["message"] == "the unit timed out before the first byte (request id hung)"
    leader = clean_sim.units[0]["leader"]
    assert_tells_only_the_kind(error["message"], "hung", int(leader.rsplit(":", 1)[1]))
    assert f"unit u0 at {leader} failed (first_byte_timeout)" in logged(caplog, "hung")


async def test_a_stream_whose_unit_dies_ends_with_an_event_naming_only_the_kind(
    clean_sim: SimProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """u0 dies after two tokens; the only other unit is on a closed port, so the stream cannot
    be continued: its SSE error event says so, and the log says where and why."""
    caplog.set_level(logging.INFO)
    dead, port = closed_unit("u1")
    config = gateway_config(
        [clean_sim.units[0], dead],
        routing={"affinity": "session"},
        retry={"budget_min_per_second": 10.0},
    )
    clean_sim.fault("u0", "drop", after_tokens=2)
    headers = {"x-request-id": "mid-stream", "x-session-id": session_ranking_first("u0", ["u1"])}
    async with running(config) as gw, aiohttp.ClientSession() as http:
        async with http.post(
            gw.public_url + CHAT, json=chat_body(max_tokens=8), headers=headers
        ) as resp:
            assert resp.status == 200
            events = await sse_events(resp)
        reasons = [e.reason for e in gw.events.recent() if e.what == "resume_gave_up"]
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "reset"
    assert error["message"].startswith("the unit's connection broke mid-stream; not resumed: ")
    assert "upstream connect failed" in error["message"]
    assert_tells_only_the_kind(error["message"], "mid-stream", port)
    log = logged(caplog, "mid-stream") + "\n".join(reasons)
    assert f"unit u1 at http://127.0.0.1:{port} failed (connect)" in log, log
    assert "stream from unit u0 broke after the first byte: reset" in log
