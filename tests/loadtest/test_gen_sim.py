"""The load generator against simulated units and hand-made bad servers, over real sockets."""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from loadtest.gen.shapes import RunConfig, Runner, RunState
from loadtest.gen.stats import Slo, aggregate
from loadtest.gen.workload import Workload, WorkloadConfig
from loadtest.simunits import Settings, SimCluster
from loadtest.simunits.state import Fault, FaultMode

MODEL = "unitgate-sim"


async def _run(url: str, **shape: float | int | None) -> RunState:
    config = RunConfig(url=url, **shape)  # type: ignore[arg-type]
    return await Runner(config, Workload(WorkloadConfig(MODEL, seed=1))).run()


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    async with SimCluster(units=1, followers=0, settings=Settings(50, 10, 8)) as running:
        yield running


async def test_ttft_and_itl_match_the_simulated_delays(sim: SimCluster) -> None:
    state = await _run(sim.units[0].leader_url, concurrency=3, requests=9)
    summary = aggregate(state.records, state.elapsed(), Slo())
    assert summary["succeeded"] == 9
    assert all(r.output_tokens == 8 for r in state.records)  # from the usage chunk
    ttft, itl, tpot = summary["ttft_ms"], summary["itl_ms"], summary["tpot_ms"]
    assert isinstance(ttft, dict) and isinstance(itl, dict) and isinstance(tpot, dict)
    assert 48 <= ttft["p50"] <= 70
    assert 9 <= itl["p50"] <= 16
    assert itl["count"] == 9 * 7
    assert 9 <= tpot["mean"] <= 16


async def test_open_loop_follows_the_seeded_poisson_schedule(sim: SimCluster) -> None:
    rate, duration, seed = 40.0, 1.5, 7
    rng, due, expected = random.Random(seed), 0.0, []
    while (due := due + rng.expovariate(rate)) < duration:
        expected.append(due)
    assert abs(len(expected) - rate * duration) < 20
    state = await _run(sim.units[0].leader_url, rate=rate, duration=duration, seed=seed)
    records = sorted(state.records, key=lambda r: r.index)
    assert [r.scheduled for r in records] == pytest.approx(expected)
    assert all(r.ok for r in records)
    # Latency counts from the due time, so it is never below the simulated TTFT (timers may
    # fire a little early, hence the margin).
    assert all(r.ttft is not None and r.ttft >= 0.045 for r in records)


async def test_request_count_bounds_an_open_loop(sim: SimCluster) -> None:
    state = await _run(sim.units[0].leader_url, rate=200.0, requests=25)
    assert len(state.records) == 25
    assert sorted(r.index for r in state.records) == list(range(25))


async def test_duration_bounds_a_closed_loop(sim: SimCluster) -> None:
    state = await _run(sim.units[0].leader_url, concurrency=2, duration=0.5)
    # Each request takes ~120 ms: two workers fit about four rounds before the deadline.
    assert 4 <= len(state.records) <= 12
    assert max(r.scheduled for r in state.records) < 0.5


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (Fault(FaultMode.ERROR, status=500), "http_500"),
        (Fault(FaultMode.ERROR, status=429), "http_429"),
        (Fault(FaultMode.DROP, after_tokens=2), "broken_stream"),
    ],
)
async def test_injected_faults_are_classified(sim: SimCluster, fault: Fault, kind: str) -> None:
    await sim.units[0].set_fault(fault)
    state = await _run(sim.units[0].leader_url, concurrency=2, requests=4)
    assert [r.error for r in state.records] == [kind] * 4


async def test_a_hung_server_times_out(sim: SimCluster) -> None:
    await sim.units[0].set_fault(Fault(FaultMode.HANG))
    state = await _run(sim.units[0].leader_url, concurrency=2, requests=2, timeout=0.3)
    assert [r.error for r in state.records] == ["timeout", "timeout"]


async def test_a_closed_port_is_connection_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    state = await _run(f"http://127.0.0.1:{port}", concurrency=1, requests=3)
    assert [r.error for r in state.records] == ["connection_refused"] * 3


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TOKEN = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'


async def _sse(request: web.Request, *events: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


async def _no_done(request: web.Request) -> web.StreamResponse:
    return await _sse(request, TOKEN, TOKEN)


async def _malformed(request: web.Request) -> web.StreamResponse:
    return await _sse(request, TOKEN, b"data: {not json\n\n", b"data: [DONE]\n\n")


async def _html(request: web.Request) -> web.StreamResponse:
    return web.Response(text="<html>hello</html>", content_type="text/html")


async def _counted(request: web.Request) -> web.StreamResponse:
    """No usage chunk: tokens must be counted from the content chunks."""
    return await _sse(request, TOKEN, TOKEN, TOKEN, b"data: [DONE]\n\n")


@pytest.fixture
async def bad_server() -> AsyncIterator[str]:
    app = web.Application()
    routes: dict[str, Handler] = {
        "nodone": _no_done,
        "malformed": _malformed,
        "html": _html,
        "nousage": _counted,
    }
    for name, handler in routes.items():
        app.router.add_post(f"/{name}/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("nodone", "missing_done"),
        ("malformed", "malformed_sse"),
        ("html", "not_sse"),
        ("missing", "http_404"),
    ],
)
async def test_non_openai_answers_are_classified(bad_server: str, path: str, kind: str) -> None:
    state = await _run(f"{bad_server}/{path}", concurrency=1, requests=2)
    assert [r.error for r in state.records] == [kind, kind]


async def test_tokens_fall_back_to_content_chunks(bad_server: str) -> None:
    state = await _run(f"{bad_server}/nousage", concurrency=1, requests=2)
    assert [(r.error, r.output_tokens) for r in state.records] == [(None, 3), (None, 3)]
