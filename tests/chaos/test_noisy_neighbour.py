"""A noisy neighbour: tenant A floods at ten times tenant B's rate, both with API keys in the
same class, past what the units serve; B, sending steadily, keeps its time to first token
and is never refused. Real processes: a gateway in front of the simulator.

The simulated units take 200 ms to a first token (a prefill) and answer 8 tokens, so B has
one or two requests in flight at a time: its TTFT is the units' own unless the queue holds B
behind A's flood. 20 s of B at 6 requests a second give 120 samples, so the p99 is the
second-slowest, not one outlier.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path

import orjson
import pytest

from loadtest.gen.stats import percentile
from tests.chaos.clusters import start_gateway
from tests.chaos.openloop import Result, closed_loop_capacity, open_loop
from tests.chaos.simulated import paced
from tests.support import MODEL, SimProcess

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(240)]

CHAT = "/v1/chat/completions"
SLOTS_PER_UNIT = 4  # 3 simulated units: 12 slots
TTFT_MS, ITL_MS = 200.0, 10.0  # 8 tokens: about 0.28 s a request, ~40 requests/s in all
B_RATE = 6.0  # requests a second, steady
FLOOD = 10  # A sends FLOOD times B's rate
DURATION = 20.0
RATIO = 1.25  # B's TTFT p99 with the flood, at most this times B's alone


def p99(results: list[Result]) -> float:
    return percentile(sorted(r.ttft for r in results if r.ttft is not None), 99)


async def test_a_flooding_tenant_does_not_slow_a_steady_one_in_its_class(
    sim: SimProcess, tmp_path: Path
) -> None:
    paced(sim, TTFT_MS, ITL_MS)
    # This process measures B's first bytes: its own collector must not add pauses to them
    # (in a long pytest session the heap is large and a full collection takes tens of ms).
    gc.collect()
    gc.freeze()
    gw = start_gateway(
        tmp_path,
        sim,
        MODEL,
        admission={"unit_max_inflight": SLOTS_PER_UNIT},
        priority={},
        auth={"required": True},
    )
    try:
        url = gw.public + CHAT
        keys = {t: gw.ops.admin("/admin/keys", {"tenant": t})["key"] for t in ("a", "b")}
        auth = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
        capacity = await closed_loop_capacity(url, 3 * SLOTS_PER_UNIT, 3.0, auth["a"])
        assert 1.5 * capacity < (FLOOD + 1) * B_RATE, f"no overload at {capacity:.1f} req/s"

        alone = await open_loop(url, B_RATE, DURATION, lambda i: ("b", auth["b"]))
        assert all(r.completed for r in alone), [r.status for r in alone if not r.completed]

        # A floods from a process of its own (tests/chaos/flood.py), B is measured here.
        argv = [url, orjson.dumps(auth["a"]).decode(), str(FLOOD * B_RATE), str(DURATION), "a"]
        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.chaos.flood", *argv, stdout=asyncio.subprocess.PIPE
        )
        b = await open_loop(url, B_RATE, DURATION, lambda i: ("b", auth["b"]))
        out, _ = await asyncio.wait_for(flood.communicate(), 90.0)
        a = orjson.loads(out)
        a_served, a_refused = a["completed"], a["statuses"].get("429", 0)
        print(
            f"\nnoisy neighbour: capacity {capacity:.1f} req/s; B alone TTFT p99"
            f" {p99(alone) * 1000:.0f} ms, with A's flood {p99(b) * 1000:.0f} ms"
            f" ({p99(b) / p99(alone):.2f}x); B {sum(r.completed for r in b)}/{len(b)} served;"
            f" A {a_served}/{a['sent']} served, {a_refused} refused with 429"
        )
        assert [r.status for r in b if r.status != 200] == []  # B: no 429, nothing else
        assert all(r.completed for r in b)
        assert a_refused > 0, "A's flood was never refused: there was no overload"
        assert p99(b) <= RATIO * p99(alone), (p99(b), p99(alone))
    finally:
        gc.unfreeze()
        sim.post("/reset")
        gw.close()
