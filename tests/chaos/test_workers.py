"""`[gateway].workers = 2`: a control plane and two worker processes behind one port, in front
of simulated units, all real processes and sockets.

An admin change reaches every worker; a killed worker is started again while the other keeps
serving; failures seen by different workers trip one breaker at the configured count; SIGTERM
drains every worker; and workers leave when the control plane dies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.chaos.clusters import GatewayProcess, pid_alive, start_gateway
from tests.chaos.ops import samples, until
from tests.chaos.simulated import paced
from tests.support import MODEL, SimProcess, chat_body

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(120)]

CHAT = "/v1/chat/completions"


@pytest.fixture
def gateway(two_workers: GatewayProcess) -> GatewayProcess:
    return two_workers


def workers(gw: GatewayProcess) -> list[dict[str, Any]]:
    doc: dict[str, Any] = orjson.loads(gw.ops._get("/admin/workers"))
    return list(doc["workers"])


def session() -> aiohttp.ClientSession:
    """A new connection per request, so the kernel spreads requests over the workers."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def served_by(
    gw: GatewayProcess, count: int, stream: bool = False, batch: int = 20
) -> Counter[str]:
    units: Counter[str] = Counter()
    async with session() as http:

        async def one() -> None:
            async with http.post(gw.public + CHAT, json=chat_body(stream, max_tokens=4)) as resp:
                await resp.read()
                assert resp.status == 200, await resp.text()
                units[resp.headers["x-unitgate-unit"]] += 1

        for start in range(0, count, batch):
            await asyncio.gather(*(one() for _ in range(min(batch, count - start))))
    return units


async def test_an_admin_disable_reaches_every_worker(gateway: GatewayProcess) -> None:
    before = await served_by(gateway, 60)
    assert set(before) == {"u0", "u1", "u2"}, before
    gateway.ops.admin("/admin/units/u0/disable", {"reason": "maintenance"})
    after = await served_by(gateway, 300)
    assert "u0" not in after and sum(after.values()) == 300, after
    views = workers(gateway)
    assert len(views) == 2 and all(w["pid"] for w in views)
    served = [w["requests"] for w in await until(lambda: _reported(gateway, 360), 3.0, "reports")]
    assert sum(served) == 360 and min(served) > 0, served  # both workers answered
    assert all(w["propagation_ms"] is not None for w in views), views


def _reported(gw: GatewayProcess, total: int) -> list[dict[str, Any]] | None:
    views = workers(gw)
    return views if sum(w["requests"] for w in views) >= total else None


def requests_counted(gw: GatewayProcess) -> float:
    return gw.ops.counter("unitgate_requests_total")


async def test_one_metrics_endpoint_counts_every_workers_requests(
    gateway: GatewayProcess,
) -> None:
    """/metrics sums the workers; a killed worker's counts stay counted after its restart."""
    await served_by(gateway, 80, stream=True)
    # at once: a scrape asks every worker for fresh samples before it renders
    assert requests_counted(gateway) == 80
    text = gateway.ops.metrics()
    assert text.count("# TYPE unitgate_requests_total counter") == 1
    ttft = sum(samples(text, "unitgate_time_to_first_token_seconds_count").values())
    assert ttft == 80
    victim = workers(gateway)[1]
    os.kill(victim["pid"], signal.SIGKILL)
    await until(
        lambda: workers(gateway)[1]["pid"] not in (None, victim["pid"]), 10.0, "a new worker 1"
    )
    assert requests_counted(gateway) == 80  # not backwards
    await served_by(gateway, 20)
    assert requests_counted(gateway) == 100


async def test_a_killed_worker_is_started_again_and_the_other_serves_on(
    gateway: GatewayProcess,
) -> None:
    victim = workers(gateway)[0]
    results: list[int | str] = []
    async with session() as http:

        async def stream() -> None:
            try:
                async with http.post(gateway.public + CHAT, json=chat_body(max_tokens=60)) as r:
                    body = await r.read()
                    results.append(r.status if body.rstrip().endswith(b"[DONE]") else "cut")
            except aiohttp.ClientError:
                results.append("cut")

        streams = [asyncio.ensure_future(stream()) for _ in range(20)]
        await asyncio.sleep(0.5)  # every stream is mid-answer (60 tokens, 20 ms apart)
        os.kill(victim["pid"], signal.SIGKILL)
        await asyncio.gather(*streams)
    completed = results.count(200)
    assert completed + results.count("cut") == 20, results
    assert completed > 0, results  # the other worker's streams finished untouched

    def restarted() -> dict[str, Any] | None:
        view = workers(gateway)[0]
        return view if view["pid"] not in (None, victim["pid"]) else None

    view = await until(restarted, 10.0, "the worker started again")
    assert view["restarts"] == 1
    assert sum((await served_by(gateway, 40)).values()) == 40
    assert gateway.log_tail(20000).count("exited with") == 1


async def test_failures_seen_by_both_workers_trip_one_breaker(
    sim: SimProcess, tmp_path: Path
) -> None:
    breaker = {"enabled": True, "consecutive_failures": 6, "base_ejection": 30.0}
    gw = start_gateway(
        tmp_path,
        sim,
        MODEL,
        gateway={"workers": 2},
        breaker=breaker,
        retry={"budget_min_per_second": 100.0},
    )
    try:
        sim.fault("u0", "error", status=500)
        seen = sim.stats("u0")["requests"]
        # One request at a time (each on a new connection, so both workers take some): the
        # breaker's count is then the only bound on the failures. Concurrent requests would
        # add those already sent to u0 when the 6th failure tripped it, up to a whole batch.
        await served_by(gw, 60, batch=1)  # retried on u1 and u2: every answer is 200
        failed = sim.stats("u0")["requests"] - seen
        # Per-worker breakers would have let 6 failures in a row through on each worker.
        assert 6 <= failed < 12, failed
        assert gw.ops.unit("u0")["breaker"]["state"] == "ejected"
        assert [e["what"] for e in gw.ops.events("u0")].count("breaker ejected") == 1
    finally:
        sim.post("/reset")
        gw.close()


async def answers_around(gw: GatewayProcess, streams: int, sig: int) -> list[bytes]:
    """`streams` 40-token answers, with `sig` sent to the control plane while they stream."""
    async with session() as http:

        async def stream() -> bytes:
            async with http.post(gw.public + CHAT, json=chat_body(max_tokens=40)) as r:
                return await r.read()

        running = [asyncio.ensure_future(stream()) for _ in range(streams)]
        await asyncio.sleep(0.3)
        gw.proc.send_signal(sig)
        return await asyncio.gather(*running)


async def test_a_units_cap_holds_across_workers(sim: SimProcess, tmp_path: Path) -> None:
    """3 in flight per unit, 60 streams over 2 workers: each worker admits its share (2 + 1),
    so no unit ever runs more than 3, where two copies of the cap would allow 6."""
    admission = {"unit_max_inflight": 3, "queue_size": 200, "queue_timeout": 30.0}
    gw = start_gateway(tmp_path, sim, MODEL, gateway={"workers": 2}, admission=admission)
    try:
        sim.post("/reset")
        paced(sim, ttft_ms=20, itl_ms=20)
        assert sum((await served_by(gw, 60, stream=True, batch=60)).values()) == 60
        peaks = {u["id"]: sim.stats(u["id"])["peak_in_flight"] for u in sim.units}
        # never past the cap, and every unit was full (the load did press against it)
        assert max(peaks.values()) <= 3 and min(peaks.values()) >= 2, peaks
    finally:
        gw.close()


async def test_affinity_picks_the_same_unit_in_every_worker(
    sim: SimProcess, tmp_path: Path
) -> None:
    """One session's requests arrive on new connections, so on both workers; each worker
    ranks the units for the key from the same state, so all go to one unit."""
    gw = start_gateway(
        tmp_path, sim, MODEL, gateway={"workers": 2}, routing={"affinity": "session"}
    )
    try:
        async with session() as http:
            for key in ("alice", "bob", "carol"):
                units = set()
                for _ in range(30):
                    headers = {"x-session-id": key}
                    body = chat_body(False, max_tokens=2)
                    async with http.post(gw.public + CHAT, json=body, headers=headers) as resp:
                        await resp.read()
                        units.add(resp.headers["x-unitgate-unit"])
                assert len(units) == 1, (key, units)
        served = [w["requests"] for w in await until(lambda: _reported(gw, 90), 3.0, "reports")]
        assert min(served) > 0, served  # both workers answered this session's requests
    finally:
        gw.close()


async def test_sigterm_drains_every_worker(gateway: GatewayProcess) -> None:
    pids = [w["pid"] for w in workers(gateway)]
    bodies = await answers_around(gateway, 10, signal.SIGTERM)
    assert all(b.rstrip().endswith(b"[DONE]") for b in bodies)
    assert gateway.proc.wait(timeout=20) == 0
    assert not any(pid_alive(p) for p in pids)


async def test_workers_leave_when_the_control_plane_dies(gateway: GatewayProcess) -> None:
    """kill -9 of the control plane: each worker stops accepting, finishes its streams, exits,
    and the port is free for the gateway's restart."""
    pids = [w["pid"] for w in workers(gateway)]
    bodies = await answers_around(gateway, 6, signal.SIGKILL)
    assert all(b.rstrip().endswith(b"[DONE]") for b in bodies)
    deadline = time.monotonic() + 15
    while any(pid_alive(p) for p in pids):
        assert time.monotonic() < deadline, "workers outlived their control plane"
        await asyncio.sleep(0.05)
