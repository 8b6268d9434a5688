"""How a run ends: the max_tokens sent by default, the bounded grace after `--duration` and
timeouts said in words. In-process runs against simulated units, and the CLI in a subprocess
against a paced server of this file, all on 127.0.0.1 at OS-assigned ports."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from loadtest.gen.report import progress_text
from loadtest.gen.shapes import RunConfig, Runner, RunState
from loadtest.gen.stats import Slo, aggregate
from loadtest.gen.workload import Workload, WorkloadConfig
from loadtest.simunits import Settings, SimCluster
from tests.support import ROOT

SIM_MODEL = "unitgate-sim"
UNBOUNDED = 10_000  # tokens the paced server sends when a request has no max_tokens
FAST_TOKENS = 2  # a fast answer's: the model stops at once
TOKEN = b'data: {"choices": [{"index": 0, "delta": {"content": "hi "}}]}\n\n'
DEFAULT_LINE = (
    "max_tokens: 128 by default (as vllm bench serve); --max-tokens N to change, 0 to send none"
)


async def _run(url: str, max_tokens: int, **shape: Any) -> RunState:
    work = WorkloadConfig(SIM_MODEL, max_tokens=max_tokens, seed=1)
    return await Runner(RunConfig(url=url, **shape), Workload(work)).run()


@pytest.fixture
async def slow_sim() -> AsyncIterator[str]:
    """One simulated unit answering a token every 20 ms after 5 ms."""
    async with SimCluster(units=1, followers=0, settings=Settings(5, 20, 8)) as running:
        yield running.units[0].leader_url


async def test_requests_in_flight_are_cut_at_the_end_of_the_grace(slow_sim: str) -> None:
    """Answers of 500 tokens take 10 s; the run still ends at duration + grace."""
    started = time.perf_counter()
    state = await _run(slow_sim, 500, concurrency=3, duration=0.3, grace=0.4, timeout=30.0)
    took = time.perf_counter() - started
    assert 0.7 <= took < 2.0, took
    assert [r.ended for r in state.records] == ["cut"] * 3
    assert all(r.error is None and not r.ok for r in state.records)
    summary = aggregate(state.records, state.elapsed(), Slo())
    assert (summary["requests"], summary["failed"], summary["cut"]) == (0, 0, 3)
    lengths = summary["lengths"]
    assert isinstance(lengths, dict) and lengths["max_tokens"]["count"] == 3  # all were sent


async def test_a_request_ending_in_the_grace_is_measured_and_marked(slow_sim: str) -> None:
    """One answer of 10 tokens (about 0.2 s) started at 0 outlasts a 0.1 s duration."""
    state = await _run(slow_sim, 10, concurrency=1, duration=0.1, grace=5.0, timeout=30.0)
    assert [(r.ended, r.ok) for r in state.records] == [("grace", True)]
    assert state.elapsed() < 2.0
    summary = aggregate(state.records, state.elapsed(), Slo())
    assert (summary["requests"], summary["succeeded"], summary["ended_in_grace"]) == (1, 1, 1)
    assert summary["cut"] == 0 and summary["e2e_ms"]["count"] == 1  # type: ignore[index]


def test_the_progress_line_says_when_the_grace_cuts() -> None:
    state = RunState(origin=time.perf_counter() - 5.0, started=2, duration=4.0, cut_at=34.0)
    assert progress_text(state).endswith("in-flight 2 0.0 req/s, grace: cut at 34s")
    state.finished, state.cut = 2, 2
    text = progress_text(state)  # 2 done in 5 s
    assert "done 2 ok 0 err 0 in-flight 0 0.4 req/s cut 2" in text and "grace" not in text


@dataclass
class Paced:
    """Streams max_tokens tokens (UNBOUNDED without one), one every `gap_s`; the first
    `fast` requests, and every one when `gap_s` is 0, get FAST_TOKENS at once."""

    gap_s: float
    fast: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        gap = 0.0 if len(self.bodies) <= self.fast else self.gap_s
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        count = body.get("max_tokens") or UNBOUNDED
        if not gap:
            count = min(count, FAST_TOKENS)
        for _ in range(count):
            await asyncio.sleep(gap)
            await response.write(TOKEN)
        usage = {"prompt_tokens": 3, "completion_tokens": count, "total_tokens": count + 3}
        await response.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response


async def _serve(server: Paced) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.answer)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@dataclass
class Served:
    url: str
    server: Paced


@pytest.fixture
async def quick() -> AsyncIterator[Served]:
    """Every answer at once."""
    server = Paced(0.0)
    async for url in _serve(server):
        yield Served(url, server)


@pytest.fixture
async def first_fast() -> AsyncIterator[Served]:
    """The first answer at once, every later one a token a second."""
    server = Paced(1.0, fast=1)
    async for url in _serve(server):
        yield Served(url, server)


@pytest.fixture
async def slow() -> AsyncIterator[Served]:
    """A token a second."""
    server = Paced(1.0)
    async for url in _serve(server):
        yield Served(url, server)


async def _loadtest(
    url: str, *args: str, out: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`out` only where result.json is read: writing it also draws the plots (seconds)."""
    argv = [sys.executable, "-m", "loadtest", "--url", url, "--no-progress", *args]
    if out is not None:
        argv += ["--out", str(out)]
    return await asyncio.to_thread(
        subprocess.run, argv, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _result(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


@pytest.mark.parametrize(
    ("flags", "sent", "said"),
    [((), 128, True), (("--max-tokens", "7"), 7, False), (("--max-tokens", "0"), None, False)],
)
async def test_max_tokens_is_sent_by_default_and_the_summary_says_so(
    quick: Served, flags: tuple[str, ...], sent: int | None, said: bool
) -> None:
    done = await _loadtest(quick.url, "--requests", "2", *flags)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [b.get("max_tokens") for b in quick.server.bodies] == [sent, sent]
    assert (DEFAULT_LINE in done.stdout) is said
    row = next(line for line in done.stdout.splitlines() if line.startswith("max_tokens "))
    spec = "128 (default)" if said else "not sent" if sent is None else str(sent)
    assert row[15:37].strip() == spec, row


async def test_a_request_cut_at_the_end_of_the_grace_does_not_fail_the_run(
    first_fast: Served, tmp_path: Path
) -> None:
    """The first request ends at once; the second streams for hours and is cut."""
    done = await _loadtest(
        first_fast.url, "--concurrency", "1", "--duration", "1", "--grace", "0.3",
        "--max-tokens", "9000", out=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "requests 1  succeeded 1  failed 0" in done.stdout
    assert re.search(r"^throughput 0\.\d\d req/s", done.stdout, re.MULTILINE)  # 1 in 1.3 s
    assert (
        "grace: 0 requests ended within the 0.3 s --grace after --duration 1 s, counted above; "
        "1 cut at its end, still answering, not counted: raise --grace or lower --max-tokens"
    ) in done.stdout
    assert "checks: all passed" in done.stdout
    result = _result(tmp_path)
    assert [r["ended"] for r in result["requests"]] == ["run", "cut"]
    assert result["config"]["grace_s"] == 0.3 and not result["config"]["output_len_default"]
    assert result["summary"]["cut"] == 1 and result["summary"]["wall_s"] < 1.3 + 0.5


async def test_a_run_where_every_request_was_cut_fails_and_says_why(
    slow: Served, tmp_path: Path
) -> None:
    done = await _loadtest(
        slow.url, "--concurrency", "2", "--duration", "0.2", "--grace", "0.2", out=tmp_path
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  error_rate: no request ended, 2 cut at the end of the grace" in done.stdout
    result = _result(tmp_path)
    assert result["summary"]["cut"] == 2
    assert result["config"]["output_len"] == "128" and result["config"]["output_len_default"]


@pytest.mark.parametrize(
    ("flags", "hint"),
    [((), "lower --max-tokens"), (("--max-tokens", "0"), "set --max-tokens")],
)
async def test_timeouts_within_the_duration_fail_the_run_and_are_said_in_words(
    slow: Served, flags: tuple[str, ...], hint: str
) -> None:
    """Each request times out after 0.2 s, so two or three start within the 0.5 s."""
    done = await _loadtest(
        slow.url, "--concurrency", "1", "--duration", "0.5", "--timeout", "0.2", *flags
    )
    assert done.returncode == 1, done.stdout + done.stderr
    said = re.search(r"^(\d+) requests timed out after 0.2 s; raise --timeout or (.+)$",
                     done.stdout, re.MULTILINE)  # fmt: skip
    assert said is not None, done.stdout
    n = int(said[1])
    assert n >= 2 and said[2] == hint
    assert f"requests {n}  succeeded 0  failed {n}" in done.stdout
    assert f"errors: timeout {n}\n" in done.stdout and "; 0 cut\n" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--requests", "1", "--grace", "5"), "--grace needs --duration"),
        (("--duration", "1", "--grace", "-1"), "--grace must be a number of seconds >= 0"),
        (("--duration", "1", "--max-tokens", "-1"), "--max-tokens"),
    ],
)
def test_bad_grace_and_max_tokens_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", "--url", "http://127.0.0.1:1", "--model", "m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
