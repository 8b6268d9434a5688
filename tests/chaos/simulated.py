"""What the scenarios on simulated units share: the load's shape, node health faults, and the
gateway's health as its operator sees it (admin view, events)."""

from __future__ import annotations

import asyncio

from loadtest.gen.shapes import RunConfig
from tests.chaos.clusters import GatewayProcess
from tests.chaos.harness import Fault, Load
from tests.support import SimProcess

CONCURRENCY = 24
MAX_TOKENS = 50  # 20 ms apart: 1 s streams
DURATION = 8.0
FAULT_AT = 2.5


def sim_load(gw: GatewayProcess, duration: float = DURATION) -> RunConfig:
    return RunConfig(
        gw.public, concurrency=CONCURRENCY, duration=duration, requests=2000, timeout=30.0
    )


def paced(sim: SimProcess, ttft_ms: float, itl_ms: float) -> SimProcess:
    """The simulator with its faults cleared and every unit streaming at this pace."""
    sim.post("/reset")
    for unit in sim.units:
        sim.post(f"/units/{unit['id']}/settings", {"ttft_ms": ttft_ms, "itl_ms": itl_ms})
    return sim


async def node_health(sim: SimProcess, unit: str, rank: int, **mode: object) -> None:
    await asyncio.to_thread(sim.post, f"/units/{unit}/nodes/{rank}/health", mode)


def health_state(gateway: GatewayProcess, unit: str) -> str:
    state: str = gateway.ops.unit(unit)["health"]["state"]
    return state


def assert_load_outlasted(load: Load, fault: Fault, margin_s: float = 1.0) -> None:
    """A soft fault (probes that time out) is judged by whether the unit's traffic flows; if
    the closed loop stopped sending before the fault's window closed, the unit goes idle with
    its probes still failing and an ejection is the right verdict, so the scenario would test
    nothing. Fails with that cause named, not as an ejection."""
    assert fault.done_perf is not None, f"the fault {fault.name!r} never closed"
    last = max((t.sent_at for t in load.traces), default=0.0)
    assert last >= fault.done_perf + margin_s, (
        f"the load stopped sending {fault.done_perf + margin_s - last:.2f} s too early:"
        f" it must outlast the fault's window by {margin_s} s (lengthen its duration)"
    )


def ejections(gateway: GatewayProcess, after_wall: float) -> list[str]:
    """Every unhealthy or breaker-ejected event since `after_wall`, as 'unit: what (reason)'."""
    return [
        f"{e['unit']}: {e['what']} ({e['reason']})"
        for e in gateway.ops.events()
        if e["time"] >= after_wall and e["what"] in ("unhealthy", "breaker ejected")
    ]
