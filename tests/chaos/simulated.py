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
# Scenarios whose fault lasts as long as the machine makes it send on this long after it
# closed. The closed loop sends in waves (its 24 streams of 1 s start and end together), so
# this is `assert_load_outlasted`'s 1 s margin plus one wave and some slack.
OUTLAST_S = 2.5
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
        f" it must outlast the fault's window by {margin_s} s (run it with outlast_s)"
    )


def ejections(gateway: GatewayProcess, after_wall: float) -> list[str]:
    """Every unhealthy or breaker-ejected event since `after_wall`, as 'unit: what (reason)'."""
    return [
        f"{e['unit']}: {e['what']} ({e['reason']})"
        for e in gateway.ops.events()
        if e["time"] >= after_wall and e["what"] in ("unhealthy", "breaker ejected")
    ]


def assert_never_ejected(gateway: GatewayProcess, load: Load, fault: Fault) -> None:
    """No unit was ejected since the fault fired; if one was, the failure shows what vouching
    saw: each unit's events and how many of its streams were in flight around them."""
    found = ejections(gateway, fault.fired_wall or 0.0)
    if found:
        units = sorted({e.split(":")[0] for e in found})
        what = f"ejected after the fault: {found}"
        raise AssertionError(story(gateway, load, fault, units, what))


def story(gateway: GatewayProcess, load: Load, fault: Fault, units: list[str], what: str) -> str:
    """`what` went wrong, then the fault's window, and each of `units`' events from 1 s before
    the fault with how many of its streams were in flight at each (what vouching saw)."""
    fired_wall = fault.fired_wall or 0.0
    fired = fault.fired_perf or 0.0
    lines = [
        what,
        f"(the fault's own error: {fault.error})" if fault.error else "",
        "(times in s from the fault; closed at "
        f"{(fault.done_perf or fired) - fired:.2f}; last send at "
        f"{max((t.sent_at for t in load.traces), default=fired) - fired:.2f})",
    ]
    for event in gateway.ops.events():
        unit = event["unit"]
        if unit in units and event["time"] >= fired_wall - 1.0:
            at = event["time"] - fired_wall
            streams = _flowing(load, unit, fired + at)
            lines.append(f"  {at:6.2f} {unit} {event['what']} ({streams}): {event['reason']}")
    return "\n".join(line for line in lines if line)


def _flowing(load: Load, unit: str, at: float) -> str:
    """Streams of `unit` started and not ended at `at`, and when the unit's last one began."""
    began = [
        (t.started_at, t.ended_at)
        for t in load.traces
        if t.unit == unit and t.started_at is not None and t.started_at <= at
    ]
    live = sum(1 for _, ended in began if ended is None or ended > at)
    last = f"{at - max(start for start, _ in began):.2f} s before" if began else "never"
    return f"{live}; the last began {last}"
