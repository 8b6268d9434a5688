"""Chaos on real builtin-engine units: `unitgate up` runs two units of two nodes (TP=2, the
seeded tiny model) and its gateway; the load is a few concurrent streams of 48 tokens.

The scenarios share one `unitgate up` and run in file order; each starts once every unit is
routable again (a killed node makes `unitgate up` restart its whole unit). Faults are real
signals to the node processes, by the pid each node's /health reports.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from loadtest.gen.shapes import RunConfig
from tests.chaos.clusters import REAL_MODEL, RealCluster, start_real
from tests.chaos.harness import Fault, run_load, streaming_on, workload
from tests.chaos.ops import first_event_after, until
from tests.chaos.report import Report, conclude

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(240)]

CONCURRENCY = 6  # a 2-core machine runs 4 engine processes; more would only queue
MAX_TOKENS = 48
DURATION = 10.0
FAULT_AT = 4.0


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    cluster = start_real(tmp_path_factory.mktemp("chaos-real"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
async def cluster(up: RealCluster) -> RealCluster:
    """Every unit routable with all nodes healthy (a unit restarted by the last scenario has
    to load its model again first)."""
    await until(up.ready, 90.0, "every unit routable", step=0.2)
    return up


def load_config(cluster: RealCluster, duration: float = DURATION) -> RunConfig:
    return RunConfig(
        cluster.public, concurrency=CONCURRENCY, duration=duration, requests=300, timeout=30.0
    )


def signal_node(pid: int, sig: signal.Signals, unit: str) -> Fault:
    async def send() -> None:
        os.kill(pid, sig)

    return Fault(FAULT_AT, f"{sig.name} pid {pid}", send, when=streaming_on(unit))


async def _kill_node(cluster: RealCluster, unit: str, rank: int, title: str) -> None:
    """SIGKILL one node of `unit` under load; the unit must be ejected and nothing lost."""
    fault = signal_node(cluster.node_pid(unit, rank), signal.SIGKILL, unit)
    load = await run_load(
        load_config(cluster), workload(REAL_MODEL, MAX_TOKENS), [fault], cluster.ops
    )
    report = Report(title, load.traces, fault.fired_perf, (unit,), True)
    await conclude(report, load, cluster.ops, eject_unit=unit)


async def test_11_open_loop_overload_is_refused_with_429_only(cluster: RealCluster) -> None:
    """Busy is not broken: arrivals at twice what the units serve, open loop, for 20 s. The
    excess waits in the admission queue and past `queue_timeout` gets 429 with Retry-After:
    never a 503, no unit ejected (probes answering late on busy leaders make them slow)."""
    ops = cluster.ops
    cap = sum(int(u["cap"]) for u in ops.units())
    work = workload(REAL_MODEL, MAX_TOKENS)
    # Capacity first, measured here: a closed loop at the units' combined in-flight cap.
    full = RunConfig(cluster.public, concurrency=cap, duration=8.0, requests=500, timeout=30.0)
    measured = await run_load(full, work, [], ops)
    ended = [t.ended_at for t in measured.traces if t.outcome == "completed" and t.ended_at]
    assert len(ended) >= 10, f"capacity run completed only {len(ended)} requests"
    capacity = (len(ended) - 1) / (max(ended) - min(ended))
    started = time.time()
    rate, duration = 2.0 * capacity, 20.0
    run = RunConfig(
        cluster.public, rate=rate, duration=duration, requests=int(rate * duration * 2), timeout=60
    )
    load = await run_load(run, work, [], ops)
    report = Report(
        "11. open-loop overload at 2x capacity for 20 s (real)",
        load.traces,
        None,
        None,
        False,
        refusals_ok=True,
    )
    statuses = sorted({t.status for t in load.traces if t.status is not None})
    refused = [t for t in load.traces if t.status == 429]
    out = [
        f"{e['unit']}: {e['what']}"
        for e in ops.events()
        if e["time"] >= started and e["what"] in ("unhealthy", "breaker ejected")
    ]
    slow = sum(1 for e in ops.events() if e["time"] >= started and e["what"] == "slow")
    report.notes.append(
        f"capacity {capacity:.2f} req/s measured, {rate:.2f} req/s offered; {len(refused)}"
        f" refused with 429 + Retry-After; statuses {statuses}; ejections {len(out)};"
        f" slow marks {slow}"
    )
    assert refused, "2x capacity for 20 s refused nothing: the overload did not happen"
    assert all(t.refused for t in refused), [t.kind for t in refused if not t.refused]
    assert set(statuses) <= {200, 429}, statuses
    assert out == [], out
    await conclude(report, load, ops)


async def test_7_admin_drain_under_load(cluster: RealCluster) -> None:
    ops = cluster.ops
    applied: list[float] = []  # when the drain call returned: the unit is out from then on
    drained_after: list[float] = []

    async def drain() -> None:
        started = time.perf_counter()
        await asyncio.to_thread(ops.admin, "/admin/units/u1/drain", {"reason": "chaos drain"})
        applied.append(time.perf_counter())
        await until(lambda: ops.unit("u1")["drained"], 30.0, "u1 drained", step=0.02)
        drained_after.append(time.perf_counter() - started)

    fault = Fault(FAULT_AT, "drain u1", drain, when=streaming_on("u1"))
    try:
        load = await run_load(load_config(cluster), workload(REAL_MODEL, MAX_TOKENS), [fault], ops)
    finally:
        await asyncio.to_thread(ops.admin, "/admin/units/u1/enable")
    report = Report(
        "7. admin drain of a unit (real)", load.traces, fault.fired_perf, ("u1",), False
    )
    late = [t for t in load.traces if applied and t.sent_at > applied[0] and t.unit == "u1"]
    if drained_after:
        report.notes.append(f"drained (0 in flight) {drained_after[0]:.2f} s after the drain")
    report.notes.append(f"{len(late)} requests sent after the drain went to u1")
    await conclude(report, load, ops)
    assert not late, f"u1 got {len(late)} new requests after its drain"


async def test_3_sigstop_follower_for_5s(cluster: RealCluster) -> None:
    pid = cluster.node_pid("u0", 1)
    continued: list[float] = []

    async def freeze() -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(5.0)  # the fault itself: frozen for 5 s
        finally:
            os.kill(pid, signal.SIGCONT)
            continued.append(time.time())

    fault = Fault(FAULT_AT, f"SIGSTOP pid {pid} for 5 s", freeze, when=streaming_on("u0"))
    try:
        load = await run_load(
            load_config(cluster, DURATION + 3),
            workload(REAL_MODEL, MAX_TOKENS),
            [fault],
            cluster.ops,
        )
    finally:
        os.kill(pid, signal.SIGCONT)  # whatever failed, never leave the node frozen
    report = Report(
        "3. SIGSTOP a follower 5 s, SIGCONT (real)", load.traces, fault.fired_perf, ("u0",), True
    )
    back = await until(
        lambda: first_event_after(cluster.ops, "u0", ("healthy",), continued[0]),
        30.0,
        "u0 readmitted after SIGCONT",
    )
    report.notes.append(f"readmitted {back['time'] - continued[0]:.2f} s after SIGCONT")
    await conclude(report, load, cluster.ops, eject_unit="u0")


async def test_1_kill_follower(cluster: RealCluster) -> None:
    await _kill_node(cluster, "u0", 1, "1. kill -9 a follower (real)")


async def test_2_kill_leader(cluster: RealCluster) -> None:
    await _kill_node(cluster, "u1", 0, "2. kill -9 a leader (real)")
