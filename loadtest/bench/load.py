"""The closed-loop load generator and what one run of it records."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from loadtest.bench.params import CONCURRENCIES, ITLS_MS, MODEL, MODES, TOKENS
from loadtest.bench.processes import CLK_TCK, Cluster, cpu_ticks

DONE = b"data: [DONE]\n\n"
RUN_DEADLINE_S = 300.0
REQUEST_TIMEOUT_S = 120.0
BODY = orjson.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": TOKENS,
    }
)
HEADERS = {"content-type": "application/json"}


@dataclass
class Run:
    mode: str
    itl_ms: float
    concurrency: int
    requested: int
    completed: int
    failures: int
    wall_s: float
    # CPU of the relay in the request path; None for "direct", which has none.
    relay_cpu_ticks: int | None
    ttft_ms: list[float]

    @property
    def rps(self) -> float:
        return self.completed / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def relay_cpu_us_per_request(self) -> float:
        if self.relay_cpu_ticks is None or not self.completed:
            return math.nan
        return self.relay_cpu_ticks / CLK_TCK * 1e6 / self.completed


async def _one(session: aiohttp.ClientSession, url: str) -> float | None:
    """TTFT in seconds, or None unless the answer is a 200 stream that ends with [DONE]."""
    start = time.perf_counter()
    ttft: float | None = None
    tail = b""
    try:
        async with session.post(url, data=BODY, headers=HEADERS) as resp:
            async for chunk in resp.content.iter_any():
                if ttft is None:
                    ttft = time.perf_counter() - start
                tail = (tail + chunk)[-len(DONE) :]
            ok = resp.status == 200 and tail == DONE
    except (aiohttp.ClientError, TimeoutError):
        return None
    return ttft if ok else None


async def _closed_loop(
    session: aiohttp.ClientSession, urls: Sequence[str], count: int, concurrency: int, spread: float
) -> tuple[list[float], int]:
    """Workers start `spread` seconds apart in total: streams of equal length started together
    stay in lockstep, and every TTFT would then measure a burst of `concurrency` arrivals.
    Requests never sent because the deadline struck count as failures: the run is short.
    """
    deadline = time.monotonic() + RUN_DEADLINE_S
    ttfts: list[float] = []
    sent = failures = 0

    async def worker(index: int) -> None:
        nonlocal sent, failures
        await asyncio.sleep(spread * index / concurrency)
        while sent < count and time.monotonic() < deadline:
            url = urls[sent % len(urls)]
            sent += 1
            ttft = await _one(session, url)
            if ttft is None:
                failures += 1
            else:
                ttfts.append(ttft)

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return ttfts, failures + count - sent


async def _measure(
    session: aiohttp.ClientSession,
    cluster: Cluster,
    mode: str,
    itl: float,
    conc: int,
    n: int,
    lockstep: bool,
) -> Run:
    """Warm-up failures are added to the run's: a broken warm-up is as broken as the run."""
    spread = 0.0 if lockstep else TOKENS * itl / 1e3
    relay = cluster.relays.get(mode)
    bases = cluster.leaders if relay is None else (relay.url,)
    urls = [f"{b}/v1/chat/completions" for b in bases]
    _, warm_failures = await _closed_loop(session, urls, 2 * conc, conc, spread)
    cpu0 = cpu_ticks(relay.pid) if relay else 0
    t0 = time.perf_counter()
    ttfts, failures = await _closed_loop(session, urls, n, conc, spread)
    wall = time.perf_counter() - t0
    cpu = cpu_ticks(relay.pid) - cpu0 if relay else None
    ttft_ms = [round(t * 1e3, 4) for t in ttfts]
    return Run(mode, itl, conc, n, len(ttfts), failures + warm_failures, wall, cpu, ttft_ms)


async def _set_itl(session: aiohttp.ClientSession, cluster: Cluster, itl: float) -> None:
    for uid in cluster.unit_ids:
        body = {"itl_ms": itl, "ttft_ms": 0, "tokens": TOKENS}
        async with session.post(f"{cluster.control}/units/{uid}/settings", json=body) as resp:
            resp.raise_for_status()


def _progress(run: Run) -> None:
    failed = f"  *** {run.failures} FAILED ***" if run.failures else ""
    line = f"  {run.mode:7} itl={run.itl_ms:g}ms c={run.concurrency}: {run.rps:.0f} req/s"
    print(line + failed, flush=True)


async def run_all(cluster: Cluster, counts: dict[float, int], lockstep: bool) -> list[Run]:
    runs: list[Run] = []
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for itl in ITLS_MS:
            await _set_itl(session, cluster, itl)
            for conc in CONCURRENCIES:
                for mode in MODES:
                    run = await _measure(session, cluster, mode, itl, conc, counts[itl], lockstep)
                    _progress(run)
                    runs.append(run)
    return runs
