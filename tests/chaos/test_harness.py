"""The chaos harness judges requests correctly: a scripted server answers every way a stream
can end, and each ending must land in the right outcome (fast; no units, no gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.base.ports import free_port
from loadtest.gen.shapes import RunConfig
from loadtest.gen.workload import RequestSpec
from tests.chaos.harness import Fault, Trace, run_load, send_traced, workload
from tests.chaos.report import Report

pytestmark = pytest.mark.chaos


def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


ROLE = chunk({"role": "assistant"})
TEXT = chunk({"content": "tok0 "})
FINISH = chunk({}, "length")
DONE = b"data: [DONE]\n\n"
ERROR = b'data: {"error": {"message": "unit died", "code": "reset"}}\n\n'
ENDINGS: dict[str, list[bytes]] = {
    "complete": [ROLE, TEXT, FINISH, DONE],
    "error_event": [ROLE, TEXT, ERROR],
    "error_then_done": [ROLE, TEXT, ERROR, DONE],
    "error_first": [ERROR],
    "truncated": [ROLE, TEXT],
    "done_without_finish": [ROLE, TEXT, DONE],
}


async def answer(request: web.Request) -> web.StreamResponse:
    mode = (await request.json()).get("mode")
    if mode is None:  # a chat body from a load: answered like a unit, 20 ms later
        await asyncio.sleep(0.02)
        mode = "complete"
    if mode == "http_502_json":
        return web.json_response({"error": {"message": "no unit", "code": "upstream"}}, status=502)
    if mode == "http_502_html":
        return web.Response(status=502, text="<html>bad gateway</html>")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if mode == "hang":
        await resp.write(ROLE + TEXT)
        await asyncio.sleep(30)
    for piece in ENDINGS[mode]:
        await resp.write(piece)
    return resp


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def judge(url: str, mode: str) -> Trace:
    spec = RequestSpec(orjson.dumps({"mode": mode}), None)
    async with aiohttp.ClientSession() as session:
        return await send_traced(session, url, spec, Trace(0), 0.5)


@pytest.mark.parametrize(
    ("mode", "outcome", "started", "kind"),
    [
        ("complete", "completed", True, "no_done"),
        ("error_event", "failed", True, "error_event:reset"),
        ("error_then_done", "failed", True, "error_event:reset"),
        ("error_first", "failed", False, "error_event:reset"),
        ("http_502_json", "failed", False, "http_502:upstream"),
        ("truncated", "lost", True, "ended_without_done"),
        ("done_without_finish", "lost", True, "no_finish_reason"),
        ("http_502_html", "lost", False, "http_502_without_error_body"),
        ("hang", "lost", True, "hang_past_deadline"),
    ],
)
async def test_every_ending_is_judged(
    server: str, mode: str, outcome: str, started: bool, kind: str
) -> None:
    trace = await judge(server, mode)
    assert (trace.outcome, trace.started) == (outcome, started), trace
    if outcome != "completed":
        assert trace.kind == kind, trace


async def test_a_load_told_to_outlast_its_faults_sends_until_after_the_last_one_closed(
    server: str,
) -> None:
    """A fault that closes 1 s past the load's 0.3 s duration: sends go on until 0.3 s after
    it closed, not past that; without `outlast_s` they stop at the duration."""

    def fault() -> Fault:
        return Fault(0.1, "long", lambda: asyncio.sleep(1.0))

    config = RunConfig(server, concurrency=2, duration=0.3, requests=1000, timeout=5.0)
    long = fault()
    load = await run_load(config, workload("m", 4), [long], outlast_s=0.3)
    assert long.done_perf is not None
    last = max(t.sent_at for t in load.traces)
    assert long.done_perf + 0.2 < last < long.done_perf + 0.35  # the last one may be sent late
    assert {t.outcome for t in load.traces} == {"completed"}
    plain = await run_load(config, workload("m", 4), [fault()])
    # Whether to send is decided before the duration; `sent_at` is stamped after the request
    # is built, which on a busy machine can fall a few microseconds past it (it did: 0.30002).
    # Sending on for the fault would reach past long.done_perf + 0.2, over a second in.
    assert max(t.sent_at for t in plain.traces) < plain.state.origin + 0.3 + 0.1


async def test_a_refused_connection_is_an_explicit_failure_before_the_start() -> None:
    trace = await judge(f"http://127.0.0.1:{free_port()}", "complete")
    assert (trace.outcome, trace.started, trace.kind) == ("failed", False, "connection_refused")


def at(
    started: float | None,
    ended: float,
    *,
    unit: str = "u0",
    ok: bool = False,
    error_event: str | None = None,
    status: int = 200,
    error_body: str | None = None,
) -> Trace:
    """A finished request: `ok` gives it a finish_reason and [DONE]."""
    return Trace(
        0,
        unit=unit,
        status=status,
        started_at=started,
        ended_at=ended,
        finish_reason="stop" if ok else None,
        done=ok,
        error_event=error_event,
        error_body=error_body,
    )


def test_in_flight_means_running_on_the_faulted_unit_while_the_fault_lasts() -> None:
    traces = [
        at(1.0, 3.0, ok=True),  # running through the fault: in flight, completed
        at(1.0, 2.5, error_event="reset"),  # broken by it: in flight, failed
        at(2.5, 4.0, ok=True),  # started during the fault window: in flight
        at(1.0, 1.5, ok=True),  # ended before the fault
        at(3.5, 4.0, ok=True),  # started after it
        at(1.0, 3.0, unit="u1", ok=True),  # another unit
    ]
    report = Report("x", traces, 2.0, ("u0",), True, fault_end=3.0)
    assert report.in_flight_completed == (2, 3)
    assert Report("x", traces, 2.0, None, True).in_flight_completed == (2, 3)


def test_check_fails_on_lost_and_on_failures_before_the_start() -> None:
    base = [at(1.0, 3.0, ok=True)]
    gauges = {"": 0.0}
    Report("fine", base, 2.0, None, False, gauges=gauges).check()
    lost = Report("lost", [*base, at(1.0, 9.0)], 2.0, None, False, gauges=gauges)
    with pytest.raises(AssertionError, match="lost requests"):
        lost.check()
    early = at(None, 2.5, status=502, error_body="upstream")
    with pytest.raises(AssertionError, match="before their stream started"):
        Report("early", [*base, early], 2.0, None, True, gauges=gauges).check()
    broken = at(1.0, 2.5, error_event="reset")
    with pytest.raises(AssertionError, match="clients saw failures"):
        Report("broken", [*base, broken], 2.0, None, False, gauges=gauges).check()
    with pytest.raises(AssertionError, match="no stream in flight"):
        Report("missed", base, 5.0, None, False, gauges=gauges).check()
