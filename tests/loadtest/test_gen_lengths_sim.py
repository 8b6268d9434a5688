"""Sampled lengths reach the server, and sweep points share warm connections; real sockets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from loadtest.gen import sweep
from loadtest.gen.cli import run_load
from loadtest.gen.client import SETTLE_S, open_session
from loadtest.gen.lengths import parse_length
from loadtest.gen.shapes import RunConfig, Runner
from loadtest.gen.stats import Slo
from loadtest.gen.workload import Workload, WorkloadConfig
from loadtest.simunits import Settings, SimCluster
from tests.support import ROOT, start_sim, stop_process

MODEL = "unitgate-sim"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _work(seed: int = 5) -> Workload:
    return Workload(
        WorkloadConfig(
            MODEL,
            seed=seed,
            input_len=parse_length("normal:20:6", "--input-len"),
            output_len=parse_length("uniform:2:12", "--output-len"),
        )
    )


async def test_each_request_carries_its_sampled_lengths() -> None:
    """The simulated unit answers exactly max_tokens tokens and counts prompt words as
    tokens, so its usage chunk shows what each request really asked for."""
    async with SimCluster(units=1, followers=0, settings=Settings(1, 1, 99)) as sim:
        run = RunConfig(url=sim.units[0].leader_url, concurrency=4, requests=40)
        result = await run_load(run, _work(), Slo(), progress=False)
        stats = sim.units[0].state.stats
    records = result["requests"]
    assert isinstance(records, list) and len(records) == 40
    expected = _work()  # a closed loop draws in index order
    for record in records:
        spec = expected.next_request()
        assert record["error"] is None
        assert (record["input_words"], record["max_tokens"]) == (spec.input_words, spec.max_tokens)
        assert record["output_tokens"] == record["max_tokens"]
        assert record["prompt_tokens"] == record["input_words"]
    assert stats.completed == 40
    assert len({r["max_tokens"] for r in records}) > 5  # not one length for all
    summary = result["summary"]
    assert isinstance(summary, dict)
    lengths = summary["lengths"]
    asked = sorted(r["max_tokens"] for r in records)
    assert lengths["max_tokens"] == lengths["output_tokens"]
    assert lengths["max_tokens"]["mean"] == pytest.approx(sum(asked) / 40)
    assert lengths["max_tokens"]["max"] == asked[-1] and lengths["max_tokens"]["p50"] == asked[19]
    assert lengths["input_words"] == lengths["prompt_tokens"]
    config = result["config"]
    assert isinstance(config, dict)
    assert (config["input_len"], config["output_len"]) == ("normal:20:6", "uniform:2:12")


def _chat_ending_after(lag: float, peers: set[object]) -> Handler:
    """Ends the body `lag` seconds after [DONE], as a relaying proxy may: the client must
    still keep the connection for the next request."""

    async def chat(request: web.Request) -> web.StreamResponse:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        await asyncio.sleep(lag)
        await response.write_eof()
        return response

    return chat


@pytest.fixture
async def counting_server() -> AsyncIterator[tuple[str, set[object]]]:
    """Remembers each client connection; /linger keeps the stream open long after [DONE]."""
    peers: set[object] = set()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat_ending_after(0.005, peers))
    app.router.add_post("/linger/v1/chat/completions", _chat_ending_after(2.0, peers))
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", peers
    await runner.cleanup()


async def test_sweep_points_reuse_one_set_of_connections(
    counting_server: tuple[str, set[object]],
) -> None:
    url, peers = counting_server
    base = RunConfig(url=url, concurrency=1, requests=8)
    pools: list[int | None] = []

    async def load(point: RunConfig, session: aiohttp.ClientSession) -> dict[str, object]:
        assert session.connector is not None
        pools.append(session.connector.limit)
        work = Workload(WorkloadConfig(MODEL))
        return await run_load(point, work, Slo(), progress=False, session=session)

    rows = await sweep.run_sweep(base, "concurrency", [2, 3, 3], load, None)
    assert [row["error rate"] for row in rows] == [0.0, 0.0, 0.0]
    assert pools == [3, 3, 3]  # sized for the largest point, not aiohttp's default 100
    assert len(peers) == 3  # 24 requests over three points, without a cold connect per point


async def test_runs_without_a_session_open_their_own(
    counting_server: tuple[str, set[object]],
) -> None:
    url, peers = counting_server
    for _ in range(2):
        await Runner(
            RunConfig(url=url, concurrency=2, requests=4), Workload(WorkloadConfig(MODEL))
        ).run()
    assert len(peers) == 4


async def test_a_stream_left_open_after_done_still_succeeds(
    counting_server: tuple[str, set[object]],
) -> None:
    url, peers = counting_server
    config = RunConfig(url=url + "/linger", concurrency=2, requests=4, timeout=0.5)
    state = await Runner(config, Workload(WorkloadConfig(MODEL))).run()
    assert [r.error for r in state.records] == [None] * 4
    assert all(r.e2e is not None and r.e2e < SETTLE_S for r in state.records)  # ends at [DONE]
    assert len(peers) == 4  # given up, not reused: each request needed a new connection


async def test_a_session_too_small_for_the_load_is_refused() -> None:
    async with open_session(4) as small, open_session(None) as unbounded:
        assert unbounded.connector is not None and unbounded.connector.limit == 0
        work = Workload(WorkloadConfig(MODEL))
        with pytest.raises(ValueError, match="pool of 4 connections would throttle concurrency 8"):
            Runner(RunConfig(url="http://x", concurrency=8, requests=1), work, small)
        with pytest.raises(ValueError, match="would throttle an open loop"):
            Runner(RunConfig(url="http://x", rate=5.0, requests=1), work, small)
        Runner(RunConfig(url="http://x", concurrency=4, requests=1), work, small)
        Runner(RunConfig(url="http://x", rate=5.0, requests=1), work, unbounded)


def _loadtest(out: Path, url: str) -> dict[str, object]:
    args = ["--url", url, "--concurrency", "3", "--requests", "15", "--seed", "9",
            "--input-len", "uniform:5:30", "--output-len", "lognormal:6:3",
            "--no-progress", "--out", str(out)]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", *args], cwd=ROOT, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    text = done.stdout.decode()
    assert "input words    uniform:5:30" in text and "max_tokens     lognormal:6:3" in text
    result: dict[str, object] = json.loads((out / "result.json").read_text())
    return result


def test_cli_records_specs_and_realised_lengths_reproducibly(tmp_path: Path) -> None:
    sim = start_sim(tmp_path, "--units", "1", "--followers", "0", "--ttft-ms", "1", "--itl-ms", "1")
    try:
        first, second = (
            _loadtest(tmp_path / "a", sim.units[0]["leader"]),
            _loadtest(tmp_path / "b", sim.units[0]["leader"]),
        )
    finally:
        stop_process(sim.proc)
    config = first["config"]
    assert isinstance(config, dict)
    assert (config["input_len"], config["output_len"]) == ("uniform:5:30", "lognormal:6:3")
    summary = first["summary"]
    assert isinstance(summary, dict)
    lengths = summary["lengths"]
    assert set(lengths) == {
        "input_words",
        "input_tokens",
        "prompt_tokens",
        "max_tokens",
        "output_tokens",
    }
    assert lengths["input_tokens"]["count"] == 0  # words asked for, no tokenizer counted them
    assert summary["output_tokens_from"] == {"usage": 15}
    assert set(lengths["max_tokens"]) == {"count", "mean", "p50", "p90", "p99", "max"}
    assert (
        lengths["output_tokens"] == lengths["max_tokens"] and lengths["max_tokens"]["count"] == 15
    )

    def asked(result: dict[str, object]) -> list[tuple[int, int]]:
        records = result["requests"]
        assert isinstance(records, list)
        return [(r["input_words"], r["max_tokens"]) for r in records]

    assert asked(first) == asked(second)  # the same seed sends the same lengths
    assert len(set(asked(first))) > 5
