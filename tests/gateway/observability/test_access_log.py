"""The access log: one line per request from a real gateway in front of the simulated units,
and nothing subscribed at all when it is off."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest

from gateway.config import LoggingConfig
from gateway.errors import UpstreamError
from gateway.observability.access_log import (
    ACCESS_LOGGER,
    AccessLog,
    access_fields,
    outcome,
    subscribe,
)
from gateway.observability.logformat import JsonFormatter, TextFormatter
from gateway.outcomes import End, Failure
from gateway.proxy.call import Call
from gateway.proxy.lease import Lease
from gateway.routing.admission import Admission
from gateway.server import Gateway, running
from gateway.signals import Signals
from tests.support import MODEL, SimProcess, chat_body, gateway_config, sse_events

CHAT = "/v1/chat/completions"
FIELDS = {
    "request_id",
    "path",
    "model",
    "unit",
    "status",
    "outcome",
    "ttft",
    "duration",
    "prompt_tokens",
    "completion_tokens",
    "attempts",
    "hedge",
}


def access_lines(caplog: pytest.LogCaptureFixture) -> dict[str, logging.LogRecord]:
    """The access log's records so far, by request id."""
    return {
        r.request_id: r  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == ACCESS_LOGGER
    }


def fields(rec: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(rec, k) for k in FIELDS}


async def post(
    http: aiohttp.ClientSession, gw: Gateway, rid: str, body: dict[str, Any]
) -> tuple[int, list[Any] | dict[str, Any]]:
    headers = {"x-request-id": rid}
    async with http.post(gw.public_url + CHAT, json=body, headers=headers) as resp:
        if body.get("stream"):
            return resp.status, await sse_events(resp)
        return resp.status, await resp.json()


async def test_every_request_gets_one_access_line_with_its_fields(
    clean_sim: SimProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    config = gateway_config(clean_sim.units[:1], logging={"access": True})
    usage = {"stream_options": {"include_usage": True}}
    async with running(config) as gw, aiohttp.ClientSession() as http:
        streamed = await post(http, gw, "acc-stream", chat_body(max_tokens=5, **usage))
        whole = await post(http, gw, "acc-whole", chat_body(stream=False, max_tokens=3))
        bad = await post(http, gw, "acc-bad", {"model": 7, "messages": []})  # the gateway's 400
    assert (streamed[0], whole[0], bad[0]) == (200, 200, 400)
    lines = access_lines(caplog)
    assert set(lines) == {"acc-stream", "acc-whole", "acc-bad"}  # one line each

    stream = fields(lines["acc-stream"])
    assert stream["path"] == CHAT and stream["model"] == MODEL and stream["unit"] == "u0"
    assert (stream["status"], stream["outcome"], stream["attempts"]) == (200, "complete", 1)
    assert 0 < stream["ttft"] < stream["duration"] < 10
    assert stream["completion_tokens"] == 5 and stream["prompt_tokens"] > 0

    plain = fields(lines["acc-whole"])
    assert (plain["status"], plain["outcome"], plain["unit"]) == (200, "complete", "u0")
    assert plain["ttft"] is None  # not streamed: no time to first token
    assert plain["completion_tokens"] == 3 and plain["prompt_tokens"] > 0
    assert 0 < plain["duration"] < 10

    refused = fields(lines["acc-bad"])
    assert (refused["status"], refused["outcome"]) == (400, "invalid_request")
    assert refused["model"] is refused["unit"] is refused["ttft"] is None
    assert refused["prompt_tokens"] is refused["completion_tokens"] is None
    assert refused["attempts"] == 0

    # As a JSON line: an object with the same fields; as text: the fields as key=value.
    entry = json.loads(JsonFormatter().format(lines["acc-stream"]))
    assert entry["logger"] == ACCESS_LOGGER and entry["level"] == "INFO"
    assert {k: entry[k] for k in FIELDS} == stream
    text = TextFormatter("%(name)s: %(message)s").format(lines["acc-bad"])
    assert text.startswith(
        f"{ACCESS_LOGGER}: request request_id=acc-bad method=POST path={CHAT} model=- "
    )
    assert " status=400 outcome=invalid_request ttft=- " in text


async def test_with_the_access_log_off_nothing_is_subscribed_or_logged(
    clean_sim: SimProcess, caplog: pytest.LogCaptureFixture
) -> None:
    signals = Signals()
    assert subscribe(signals, LoggingConfig(access=False)) is None
    assert signals._observers == []
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with running(gateway_config(clean_sim.units[:1])) as gw, aiohttp.ClientSession() as h:
        assert not any(isinstance(o, AccessLog) for o in gw.signals._observers)
        status, _ = await post(h, gw, "acc-off", chat_body(stream=False, max_tokens=2))
    assert status == 200
    assert access_lines(caplog) == {}
    on = Signals()
    observer = subscribe(on, LoggingConfig(access=True))
    assert isinstance(observer, AccessLog) and on._observers == [observer]


def call_with(status: int | None, error: BaseException | None = None) -> Call:
    call = Call(CHAT, "r1", {}, 0.0, 60.0, Lease(Admission(8, 1.0, 1)))
    call.status, call.error = status, error
    return call


def test_the_outcome_names_how_a_request_without_an_answer_ended() -> None:
    assert outcome(call_with(429)) == "saturated"
    assert outcome(call_with(503)) == "unavailable"  # no routable unit, or no budget
    assert outcome(call_with(413)) == "invalid_request"
    assert outcome(call_with(None, asyncio.CancelledError())) == "client_gone"
    assert outcome(call_with(None, RuntimeError("bug"))) == "error"
    failed = call_with(504)
    failed.last_error = UpstreamError("u3", Failure.FIRST_BYTE_TIMEOUT, "late", retryable=True)
    assert outcome(failed) == "upstream_first_byte_timeout"
    assert access_fields(failed, 2.5)["unit"] == "u3"
    assert access_fields(failed, 2.5)["duration"] == 2.5
    gone = call_with(200)
    gone.end = End.CLIENT_GONE
    assert outcome(gone) == "client_gone"


def test_access_lines_survive_a_quieter_log_level_unless_the_logger_has_its_own() -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    saved = logger.level
    try:
        logger.setLevel(logging.NOTSET)
        subscribe(Signals(), LoggingConfig(access=True))
        assert logger.level == logging.INFO  # `--log-level warning` keeps the access lines
        logger.setLevel(logging.ERROR)  # an operator's own routing is left alone
        subscribe(Signals(), LoggingConfig(access=True))
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(saved)
