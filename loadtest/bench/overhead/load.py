"""One run of the benchmark: loadtest.gen's closed loop against one mode, and what it records."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from loadtest.bench.overhead.cluster import Cluster
from loadtest.bench.overhead.params import CONCURRENCIES, ITLS_MS, TOKENS
from loadtest.bench.processes import CLK_TCK, MODEL, tree_ticks
from loadtest.gen.client import RequestRecord, open_session
from loadtest.gen.shapes import RunConfig, Runner
from loadtest.gen.stats import Slo, aggregate
from loadtest.gen.workload import Workload, WorkloadConfig

RUN_DEADLINE_S = 300.0
REQUEST_TIMEOUT_S = 120.0


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
    # loadtest.gen's error kinds (e.g. "http_503", "missing_done"), and "not_sent".
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.completed / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def relay_cpu_us_per_request(self) -> float:
        if self.relay_cpu_ticks is None or not self.completed:
            return math.nan
        return self.relay_cpu_ticks / CLK_TCK * 1e6 / self.completed


@dataclass(frozen=True)
class Loop:
    """One closed-loop run's records (all workers merged), wall time and unsent requests."""

    records: list[RequestRecord]
    wall_s: float
    unsent: int


async def _worker(
    session: aiohttp.ClientSession, base: str, count: int, delay: float, seed: int, tokens: int
) -> list[RequestRecord]:
    """One loadtest.gen closed loop of concurrency 1, started `delay` seconds late, on the
    mode's shared session: the warm-up's connections serve the measured run."""
    await asyncio.sleep(delay)
    config = RunConfig(
        url=base,
        concurrency=1,
        duration=RUN_DEADLINE_S - delay,
        requests=count,
        timeout=REQUEST_TIMEOUT_S,
        seed=seed,
    )
    workload = Workload(WorkloadConfig(MODEL, max_tokens=tokens, seed=seed))
    state = await Runner(config, workload, session).run()
    return state.records


async def closed_loop(
    session: aiohttp.ClientSession,
    bases: Sequence[str],
    count: int,
    concurrency: int,
    spread: float,
    tokens: int = TOKENS,
) -> Loop:
    """`concurrency` loadtest.gen workers, started `spread` seconds apart in total: streams of
    equal length started together stay in lockstep, and every TTFT would then measure a burst
    of `concurrency` arrivals. loadtest.gen starts its workers together, hence one Runner per
    worker; worker i sends to bases[i % len(bases)] and its share of `count`, each asking for
    `tokens`. Requests never sent because the deadline struck are counted: the run is short.
    """
    share, extra = divmod(count, concurrency)
    t0 = time.perf_counter()
    per_worker = await asyncio.gather(
        *(
            _worker(
                session,
                bases[i % len(bases)],
                share + (i < extra),
                spread * i / concurrency,
                i,
                tokens,
            )
            for i in range(concurrency)
            if share + (i < extra)
        )
    )
    wall = time.perf_counter() - t0
    records = [r for worker in per_worker for r in worker]
    return Loop(records, wall, count - len(records))


def _errors(loop: Loop) -> dict[str, int]:
    summary = aggregate(loop.records, loop.wall_s, Slo())
    errors = summary["errors"]
    assert isinstance(errors, dict)
    return errors | ({"not_sent": loop.unsent} if loop.unsent else {})


async def _measure(
    cluster: Cluster, mode: str, itl: float, conc: int, n: int, lockstep: bool
) -> Run:
    """Warm-up failures are added to the run's: a broken warm-up is as broken as the run."""
    spread = 0.0 if lockstep else TOKENS * itl / 1e3
    relay = cluster.relays.get(mode)
    bases = cluster.leaders if relay is None else (relay.url,)
    async with open_session(conc) as session:
        warm = await closed_loop(session, bases, 2 * conc, conc, spread)
        # The whole tree: nginx's worker is its master's child.
        cpu0 = tree_ticks(relay.pid) if relay else 0
        loop = await closed_loop(session, bases, n, conc, spread)
        cpu = tree_ticks(relay.pid) - cpu0 if relay else None
    errors = _errors(loop)
    for kind, count in _errors(warm).items():
        errors[f"warmup_{kind}"] = count
    ok = [r for r in loop.records if r.ok and r.ttft is not None]
    ttft_ms = [round(r.ttft * 1e3, 4) for r in ok if r.ttft is not None]
    failures = sum(errors.values())
    return Run(mode, itl, conc, n, len(ok), failures, loop.wall_s, cpu, ttft_ms, errors)


async def _set_itl(session: aiohttp.ClientSession, cluster: Cluster, itl: float) -> None:
    for uid in cluster.unit_ids:
        body = {"itl_ms": itl, "ttft_ms": 0, "tokens": TOKENS}
        async with session.post(f"{cluster.control}/units/{uid}/settings", json=body) as resp:
            resp.raise_for_status()


def _progress(run: Run) -> None:
    failed = f"  *** {run.failures} FAILED: {run.errors} ***" if run.failures else ""
    line = f"  {run.mode:7} itl={run.itl_ms:g}ms c={run.concurrency}: {run.rps:.0f} req/s"
    print(line + failed, flush=True)


def idle_cpu(cluster: Cluster, seconds: float) -> dict[str, float]:
    """Each relay's CPU, milliseconds per second, while none has any load (they are all up
    at once): its background work (a gateway's probes and loop-lag timer). At R requests per
    second it adds about 1000 * this / R us to each request's CPU."""
    before = {mode: tree_ticks(relay.pid) for mode, relay in cluster.relays.items()}
    time.sleep(seconds)
    return {
        mode: (tree_ticks(relay.pid) - before[mode]) * 1e3 / CLK_TCK / seconds
        for mode, relay in cluster.relays.items()
    }


async def run_all(cluster: Cluster, counts: dict[float, int], lockstep: bool) -> list[Run]:
    runs: list[Run] = []
    for itl in ITLS_MS:
        async with aiohttp.ClientSession() as control:
            await _set_itl(control, cluster, itl)
        for conc in CONCURRENCIES:
            for mode in cluster.modes:
                run = await _measure(cluster, mode, itl, conc, counts[itl], lockstep)
                _progress(run)
                runs.append(run)
    return runs
