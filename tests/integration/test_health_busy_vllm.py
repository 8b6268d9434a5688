"""Busy is not dead for a stock vLLM, end to end: a real gateway probing a vLLM-shaped server on
127.0.0.1 whose /health answers late, as vLLM's does while other clients load it. No traffic
goes through the gateway: only the server's own /metrics can vouch for it.

- its /metrics shows requests running and the engine stepping: the unit is `slow`, never out;
- its engine stands still with work waiting: out after `fall` rounds, as with no report;
- /metrics as late as /health (a lagging server, or a frozen one): `slow` while its last report
  is fresh, out once that report is older than its window (2 x `load_interval`).

Default probe settings (every 0.25 s, 0.2 s timeout, fall 2); `load_interval` 1 s, so the window
is 2 s. Times are loop times; the server runs on the gateway's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.config import config_from_dict
from gateway.health_states import Health
from gateway.server import Gateway, running
from gateway.units import BitChange
from tests.gateway.servers import serve_app, until
from tests.support import MODEL

LOAD_INTERVAL = 1.0
WINDOW = 2 * LOAD_INTERVAL
LATE = 5.0  # how late a slow answer comes: never within a probe's timeout


class BusyVllm:
    """vLLM's /health (200, empty) and /metrics: `running` requests and `waiting` ones, and an
    engine step per /metrics read while `moving`; each answer after its delay. `answered`:
    when each /metrics request that got its answer came in."""

    def __init__(self, moving: bool = True) -> None:
        self.running, self.waiting = 3, 1
        self.moving = moving
        self.steps = 100
        self.health_delay = self.metrics_delay = 0.0
        self.answered: list[float] = []
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/metrics/", self.metrics)  # vLLM's filtered path
        self.app = app

    async def health(self, _: web.Request) -> web.Response:
        await asyncio.sleep(self.health_delay)
        return web.Response()

    async def metrics(self, _: web.Request) -> web.Response:
        came = asyncio.get_running_loop().time()
        await asyncio.sleep(self.metrics_delay)
        self.steps += self.moving
        self.answered.append(came)
        labels = '{engine="0",model_name="smol"}'
        return web.Response(
            text=(
                f"vllm:num_requests_running{labels} {self.running}.0\n"
                f"vllm:num_requests_waiting{labels} {self.waiting}.0\n"
                f"vllm:kv_cache_usage_perc{labels} 0.25\n"
                f"vllm:iteration_tokens_total_count{labels} {self.steps}.0\n"
            )
        )


@dataclass
class Watched:
    gw: Gateway
    server: BusyVllm
    states: list[tuple[float, Health]] = field(default_factory=list)  # (when, new state)

    @property
    def health(self) -> Health:
        return self.gw.units.units["v0"].health

    @property
    def reason(self) -> str:
        return self.gw.units.units["v0"].reasons.get("healthy", "")

    def since(self, start: float) -> list[Health]:
        return [state for at, state in self.states if at >= start]


@contextlib.asynccontextmanager
async def watched(server: BusyVllm, **health: Any) -> AsyncIterator[Watched]:
    """A gateway probing `server` as unit v0 (kind vllm), its health changes recorded."""
    async with serve_app(server.app) as url:
        config = config_from_dict(
            {
                "gateway": {"port": 0, "models": [MODEL], "shutdown_timeout": 2.0},
                "metrics": {"port": 0},
                "admin": {"enabled": False},
                "breaker": {"enabled": False},
                "health": {"enabled": True, **health},
                "units": [
                    {"id": "v0", "kind": "vllm", "leader": url, "load_interval": LOAD_INTERVAL}
                ],
            }
        )
        async with running(config) as gw:
            state = Watched(gw, server)
            loop = asyncio.get_running_loop()

            def changed(c: BitChange) -> None:
                if c.bit == "healthy":
                    state.states.append((loop.time(), c.unit.health))

            gw.units.on_change(changed)
            yield state


async def healthy_and_read_twice(w: Watched) -> None:
    """Healthy, and a report to vouch: two reads of /metrics (the second shows the move)."""
    await until(lambda: w.health is Health.HEALTHY, 5.0, "v0 healthy")
    await until(lambda: len(w.server.answered) >= 3, 3 * LOAD_INTERVAL + 2.0, "three reads")


async def test_a_leader_answering_health_late_while_its_engine_works_stays_in() -> None:
    server = BusyVllm()
    async with watched(server) as w:
        await healthy_and_read_twice(w)
        loop = asyncio.get_running_loop()
        late_from = loop.time()
        server.health_delay = LATE
        await until(lambda: w.health is Health.SLOW, 2.0, "v0 slow")
        assert w.reason.startswith("probes time out while its engine reports work moving: ")
        # Longer than the window: /metrics read beside the late /health renews the report.
        while loop.time() < late_from + WINDOW + 1.5:
            assert w.health is Health.SLOW, w.reason
            await asyncio.sleep(0.01)
        reads = [at for at in server.answered if at > late_from]
        assert len(reads) >= 2
        server.health_delay = 0.0
        await until(lambda: w.health is Health.HEALTHY, 2.0, "v0 healthy again")
        assert w.since(late_from) == [Health.SLOW, Health.HEALTHY]


async def test_an_engine_standing_still_vouches_for_nothing() -> None:
    """Work waiting and no step for as long as it was read (the stall check set far off): the
    late /health ejects the unit after `fall` rounds, as for a unit with no report at all."""
    server = BusyVllm(moving=False)
    async with watched(server, stall_timeout=600.0) as w:
        await healthy_and_read_twice(w)
        loop = asyncio.get_running_loop()
        late_from = loop.time()
        server.health_delay = LATE
        out = await until(lambda: w.health is Health.UNHEALTHY, 2.0, "v0 ejected")
        assert out - late_from < 1.0  # two timed-out rounds, as ever
        assert w.since(late_from) == [Health.UNHEALTHY]
        assert w.reason.endswith(
            "no live traffic on the unit, nor a fresh report of its engine working, to vouch for it"
        )


async def test_a_report_older_than_its_window_vouches_for_nothing() -> None:
    """/metrics as late as /health, as from a frozen (SIGSTOP) leader: slow while the last
    report that showed work moving is fresh, out once it is older than the window."""
    server = BusyVllm()
    async with watched(server) as w:
        await healthy_and_read_twice(w)
        loop = asyncio.get_running_loop()
        late_from = loop.time()
        server.health_delay = server.metrics_delay = LATE
        await until(lambda: w.health is Health.SLOW, 2.0, "v0 slow")
        out = await until(lambda: w.health is Health.UNHEALTHY, WINDOW + 2.0, "v0 ejected")
        last_read = max(server.answered)
        # (equal: it came in the loop pass that set the delay, before it did: uvloop's clock
        # is read once a pass, to the millisecond)
        assert last_read <= late_from
        print(f"\nreport read {late_from - last_read:.2f} s before /health went late;")
        print(f"ejected {out - last_read:.2f} s after that read ({out - late_from:.2f} s after)")
        # Vouched for up to the window after the read, then `fall` bad rounds.
        assert WINDOW <= out - last_read < WINDOW + 1.0
        assert w.since(late_from) == [Health.SLOW, Health.UNHEALTHY]
        assert w.reason.endswith("nor a fresh report of its engine working, to vouch for it")
