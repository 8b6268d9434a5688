"""No feedback loops at high concurrency, on simulated units: a burst of 3,000 requests
arriving at once on three units that stream one token a second, while 300 streams flow.

Before issue 18 such a burst slowed the units' /health past the probe timeout, the probes
ejected units, each ejection broke the streams that had gone a fixed second without data (all
of them, at one token a second), the breakers counted those breaks as failures, and the
resumptions drained the retry budget. Now: 0 failures, 0 ejections, and not one stream broken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from loadtest.gen.shapes import RunConfig
from tests.chaos.clusters import WORKERS, GatewayProcess, start_gateway
from tests.chaos.harness import Fault, Trace, run_load, send_traced, workload
from tests.chaos.ops import resumptions
from tests.chaos.report import Report, conclude
from tests.chaos.simulated import ejections, paced
from tests.support import MODEL, SimProcess

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(180)]

BURST = 3000
FLOWING = 300
TOKENS = 8  # one a second: 8 s streams
BURST_AT = 3.0


@pytest.fixture
def slow_sim(simulator: SimProcess) -> SimProcess:
    """One token a second, as a big model serves under load."""
    return paced(simulator, ttft_ms=50, itl_ms=1000)


@pytest.fixture
def roomy(slow_sim: SimProcess, tmp_path: Path) -> Iterator[GatewayProcess]:
    """Admission sized for the burst (the defaults would answer most of it with 429, which
    is right, but not what this scenario is about); probes with the production timeout."""
    room = BURST + FLOWING
    gw = start_gateway(
        tmp_path,
        slow_sim,
        MODEL,
        admission={"unit_max_inflight": room, "queue_size": room},
        health={"timeout": 0.2},
        gateway={"workers": WORKERS},
    )
    try:
        yield gw
    finally:
        gw.close()


async def test_12_a_burst_of_3000_streams_at_one_token_a_second(
    slow_sim: SimProcess, roomy: GatewayProcess
) -> None:
    burst: list[Trace] = []
    resumed_before = await asyncio.to_thread(resumptions, roomy.ops)
    started = time.time()

    async def arrive_at_once() -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            burst.extend(Trace(100_000 + i) for i in range(BURST))
            work = workload(MODEL, TOKENS, seed=11)
            sends = [
                send_traced(session, roomy.public, work.next_request(), t, 60.0) for t in burst
            ]
            await asyncio.gather(*sends)

    run = RunConfig(
        roomy.public, concurrency=FLOWING, duration=14.0, requests=5 * FLOWING, timeout=60.0
    )
    fault = Fault(BURST_AT, f"{BURST} requests at once", arrive_at_once)
    load = await run_load(run, workload(MODEL, TOKENS), [fault], roomy.ops)
    report = Report(
        f"12. a burst of {BURST:,} streams at once, 1 s between tokens (sim)",
        [*load.traces, *burst],
        fault.fired_perf,
        None,
        False,
        fault_end=fault.fired_perf,
    )
    after = await asyncio.to_thread(resumptions, roomy.ops)
    resumed = sum(after.values()) - sum(resumed_before.values())
    out = ejections(roomy, started)
    slow = sum(1 for e in roomy.ops.events() if e["time"] >= started and e["what"] == "slow")
    done = sum(1 for t in burst if t.outcome == "completed")
    report.notes.append(
        f"burst: {done}/{BURST} completed; ejections {len(out)}; slow marks {slow};"
        f" streams broken and resumed: {resumed:g}"
    )
    assert out == [], out
    assert resumed == 0, "a flowing stream was broken"
    await conclude(report, load, roomy.ops)
