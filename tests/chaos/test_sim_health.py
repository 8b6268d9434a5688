"""Health that never causes an outage, on simulated units: probes that answer late on units
that serve (one node, then every node), and a gateway restarting while a unit is down.

A probe timeout is soft evidence: while a unit's streams keep flowing it is marked `slow`,
never ejected. A restarted gateway must not route to a unit before a probe round has judged
it, and its /readyz must not claim what it has not seen.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.chaos.clusters import GatewayProcess, gateway_config, spawn_gateway
from tests.chaos.harness import Fault, run_load, streaming_on, workload
from tests.chaos.ops import first_event_after, until
from tests.chaos.report import Report, conclude
from tests.chaos.simulated import (
    FAULT_AT,
    MAX_TOKENS,
    OUTLAST_S,
    assert_load_outlasted,
    assert_never_ejected,
    health_state,
    node_health,
    sim_load,
    story,
)
from tests.support import MODEL, SimProcess

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(120)]


async def test_4_node_answering_probes_slowly(sim: SimProcess, gateway: GatewayProcess) -> None:
    """u0's follower answers /health in 0.8 s (the probe timeout is 0.5 s) for 3 s while u0
    keeps streaming: slow, not dead. u0 is marked `slow`, never ejected, nothing breaks."""

    async def slow() -> None:
        await node_health(sim, "u0", 1, mode="slow", delay_ms=800)
        try:
            await until(lambda: health_state(gateway, "u0") == "slow", 5.0, "u0 marked slow")
            await asyncio.sleep(3.0)  # the fault itself: slow for 3 s
        finally:
            await node_health(sim, "u0", 1, mode="ok")

    fault = Fault(FAULT_AT, "u0 follower probes slow", slow, when=streaming_on("u0", fresh_s=0.3))
    # The window is the wait for the `slow` mark (1.3 s here; up to 5 s) plus 3 s: the load
    # runs on until OUTLAST_S past it, or an idle u0 whose probes still fail would rightly be
    # ejected.
    config = sim_load(gateway)
    load = await run_load(config, workload(MODEL, MAX_TOKENS), [fault], gateway.ops, OUTLAST_S)
    assert_load_outlasted(load, fault)
    report = Report(
        "4. a node answers probes slowly (sim)", load.traces, fault.fired_perf, ("u0",), False
    )
    fired = fault.fired_wall or 0.0
    marked = first_event_after(gateway.ops, "u0", ("slow",), fired)
    assert marked is not None, story(gateway, load, fault, ["u0"], "u0 was never marked slow")
    back = await until(
        lambda: first_event_after(gateway.ops, "u0", ("healthy",), fired),
        10.0,
        "u0 healthy again once its probes are fast again",
    )
    report.notes.append(
        f"marked slow {marked['time'] - fired:.2f} s after the fault, never ejected;"
        f" healthy again: {back['reason']}"
    )
    assert_never_ejected(gateway, load, fault)
    await conclude(report, load, gateway.ops)


async def test_9_every_node_answers_probes_slowly(sim: SimProcess, gateway: GatewayProcess) -> None:
    """For 5 s every node of every unit answers /health in 0.8 s (the probe timeout is 0.5 s)
    while serving, as saturated leaders do: 0 client failures and 0 ejections."""
    nodes = [(u["id"], rank) for u in sim.units for rank in range(len(u["nodes"]))]

    async def all_slow() -> None:
        await asyncio.gather(*(node_health(sim, u, r, mode="slow", delay_ms=800) for u, r in nodes))
        try:
            await asyncio.sleep(5.0)
        finally:
            await asyncio.gather(*(node_health(sim, u, r, mode="ok") for u, r in nodes))

    fault = Fault(FAULT_AT, "every node's probes slow", all_slow)
    config = sim_load(gateway)
    load = await run_load(config, workload(MODEL, MAX_TOKENS), [fault], gateway.ops, OUTLAST_S)
    assert_load_outlasted(load, fault)
    report = Report(
        "9. every node answers probes slowly for 5 s (sim)",
        load.traces,
        fault.fired_perf,
        None,
        False,
    )
    fired = fault.fired_wall or 0.0
    slow = sorted(
        {e["unit"] for e in gateway.ops.events() if e["what"] == "slow" and e["time"] >= fired}
    )
    report.notes.append(f"marked slow: {', '.join(slow) or 'none'}; ejections: 0")
    assert_never_ejected(gateway, load, fault)
    assert slow == sorted(u["id"] for u in sim.units)  # seen, and judged busy, not dead
    await conclude(report, load, gateway.ops)


class Readyz:
    """/readyz polled every 10 ms from before the gateway listens: (wall time the answer came,
    status), with None for a refused connection. The time is taken after the answer: one taken
    before the request would date a 200 that a verdict made while it was in flight to before
    that verdict."""

    def __init__(self, url: str) -> None:
        self.url = url + "/readyz"
        self.seen: list[tuple[float, int | None]] = []
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            status = await asyncio.to_thread(self._status)
            self.seen.append((time.time(), status))
            await asyncio.sleep(0.01)

    def _status(self) -> int | None:
        try:
            with urllib.request.urlopen(self.url, timeout=1.0) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def first(self, status: int) -> float | None:
        return next((at for at, s in self.seen if s == status), None)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def test_10_gateway_restart_while_a_unit_is_down(sim: SimProcess, tmp_path: Path) -> None:
    """u0's follower reports itself unhealthy (hard evidence) while u0's leader still takes
    requests, so a request sent there would show in its counters. The gateway runs under load,
    is stopped and started again on the same ports: 0 requests reach u0 across both lives, and
    the new gateway's /readyz is 503 until a probe round has judged a live unit."""
    await node_health(sim, "u0", 1, mode="unhealthy")
    config, token = gateway_config(tmp_path, sim, MODEL)
    first = spawn_gateway(tmp_path, config, token, name="first")
    try:
        before = await run_load(sim_load(first, 3.0), workload(MODEL, MAX_TOKENS), [], first.ops)
    finally:
        first.close()
    readyz = Readyz(first.public)
    second = None
    try:
        await until(lambda: readyz.seen and readyz.seen[-1][1] is None, 5.0, "the first is gone")
        restarted = time.time()
        second = spawn_gateway(tmp_path, config, token, routes=False, name="second")
        await until(lambda: readyz.first(200) is not None, 10.0, "the second gateway ready")
        after = await run_load(sim_load(second, 4.0), workload(MODEL, MAX_TOKENS), [], second.ops)
        await readyz.stop()
        judged = [e for e in second.ops.events() if e["what"] == "healthy"]
        u0 = health_state(second, "u0")
        traces = before.traces + after.traces
        report = Report("10. gateway restart while a unit is down (sim)", traces, None, None, False)
        ready_at = readyz.first(200)
        assert ready_at is not None and judged
        not_ready = sum(1 for at, s in readyz.seen if s == 503 and at >= restarted)
        first_judged = min(e["time"] for e in judged)
        requests_u0 = sim.stats("u0")["requests"]
        report.notes.append(
            f"/readyz 200 {ready_at - restarted:.2f} s after the restart, after its first"
            f" verdict ({first_judged - restarted:.2f} s), 503 {not_ready} times before;"
            f" u0 {u0}; requests that reached u0: {requests_u0}"
        )
        # Honest: no 200 before the gateway had judged a live unit, none at all from u0.
        assert all(s != 200 for at, s in readyz.seen if at < first_judged)
        assert u0 == "unhealthy" and requests_u0 == 0
        await conclude(report, after, second.ops)
    finally:
        await readyz.stop()
        if second is not None:
            second.close()
