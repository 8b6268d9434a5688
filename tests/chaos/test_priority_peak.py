"""A peak with priority classes: an open loop at twice what the units serve, 30% interactive
and 70% batch, through a gateway process in front of the simulator (real processes, real
sockets). Interactive requests keep their goodput and their time to first token; batch
absorbs the shedding.
"""

from __future__ import annotations

from pathlib import Path
from random import Random

import pytest

from loadtest.gen.stats import percentile
from tests.chaos.clusters import start_gateway
from tests.chaos.openloop import closed_loop_capacity, open_loop
from tests.chaos.simulated import paced
from tests.support import MODEL, SimProcess

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(180)]

CHAT = "/v1/chat/completions"
SLOTS_PER_UNIT = 2  # 3 simulated units: 6 slots
TTFT_MS, ITL_MS = 20.0, 25.0  # 8 tokens: about 0.2 s a request, about 27 requests/s in all
INTERACTIVE_SHARE = 0.3
DURATION = 8.0
INTERACTIVE_TTFT_SLO = 1.0  # seconds, p99
CLASSES = [
    {"name": "interactive", "rank": 0, "reserved_share": 0.2, "queue_timeout": 5.0},
    {"name": "standard", "rank": 1},
    {"name": "batch", "rank": 2, "queue_size": 32, "queue_timeout": 2.0, "unit_priority": 1},
]


async def test_at_twice_capacity_interactive_keeps_its_goodput_and_batch_is_shed(
    sim: SimProcess, tmp_path: Path
) -> None:
    paced(sim, TTFT_MS, ITL_MS)
    gw = start_gateway(
        tmp_path,
        sim,
        MODEL,
        admission={"unit_max_inflight": SLOTS_PER_UNIT, "queue_size": 256},
        priority={"classes": CLASSES},
    )
    try:
        url = gw.public + CHAT
        slots = SLOTS_PER_UNIT * len(sim.units)
        capacity = await closed_loop_capacity(url, slots, 3.0, {"x-unitgate-priority": "batch"})
        rate = 2.0 * capacity
        rng = Random(7)

        def sender(_: int) -> tuple[str, dict[str, str]]:
            klass = "interactive" if rng.random() < INTERACTIVE_SHARE else "batch"
            return klass, {"x-unitgate-priority": klass}

        results = await open_loop(url, rate, DURATION, sender)
        interactive = [r for r in results if r.label == "interactive"]
        batch = [r for r in results if r.label == "batch"]
        good = [r for r in interactive if r.status == 200 and r.completed]
        ttfts = sorted(r.ttft for r in good if r.ttft is not None)
        p50, p99 = percentile(ttfts, 50), percentile(ttfts, 99)
        batch_shed = sum(1 for r in batch if r.status == 429)
        batch_served = sum(1 for r in batch if r.completed)
        print(
            f"\npeak: capacity {capacity:.1f} req/s, offered {rate:.1f} req/s for {DURATION:g} s;"
            f" interactive {len(good)}/{len(interactive)} served, TTFT p50 {p50 * 1000:.0f} ms"
            f" p99 {p99 * 1000:.0f} ms; batch {batch_served}/{len(batch)} served,"
            f" {batch_shed} shed with 429"
        )
        assert len(good) >= 0.99 * len(interactive), [r for r in interactive if r not in good]
        assert p99 <= INTERACTIVE_TTFT_SLO, p99
        assert batch_shed > 0, "twice the capacity shed no batch request: no overload happened"
        assert batch_served > 0, "batch starved outright"
        assert {r.status for r in results} <= {200, 429}, {r.status for r in results}
    finally:
        sim.post("/reset")
        gw.close()
