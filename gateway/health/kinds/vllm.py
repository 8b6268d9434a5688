"""The `vllm` kind: a stock `vllm serve` leader (its followers: `unitgate watch` sidecars).

Alive means `GET /health` answers 200 (vLLM answers it with an empty body, and 503 once its
engine is dead). Load and progress come from vLLM's own `/metrics` (vllm_metrics.py), read on
its own interval (`load_interval`, 2 s by default) rather than every round: the cheap /health
keeps the detection of a dead leader at the round's pace, and the prober reuses the last load
between reads (marked not fresh, so the stall check waits for the next reading rather than
taking an old one for an engine standing still).

The report carries the identity the config gives the leader, since vLLM reports none, with
`pending` = requests running + waiting, `running` = running, and `step` = the engine's step
count, so engine-load routing and stall detection work as for the builtin engine: a stall is
work running or waiting while the step count stands still for `[health].stall_timeout`.

A long prefill is told apart from a stall because vLLM prefills in chunks (chunked prefill,
at most `max_num_batched_tokens` tokens a step) and every chunk moves the KV-cache usage the
stall check watches besides the step count (vllm_metrics.py: `progress`). What cannot be told
apart is one step longer than `stall_timeout`: set it above the slowest step the unit takes
(a full chunk of prefill), as for the builtin engine.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from gateway.config import UnitConfig
from gateway.health.kinds.vllm_metrics import FULL, QUERY, EngineLoad, parse_load
from gateway.health.probe import ProbeFailed, Target, get
from gateway.health.result import NodeReport
from gateway.proxy.pool import ConnectionPool

log = logging.getLogger("unitgate.health")


class VllmProbe:
    __slots__ = ("full", "health", "interval", "load", "metrics", "read_at", "unit_id", "warned")

    def __init__(
        self,
        unit_id: str,
        url: str,
        extra: bytes,
        interval: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.unit_id = unit_id
        self.health = Target(url, "/health", extra, tls=tls)
        self.metrics = Target(url, QUERY, extra, accept="text/plain", tls=tls)
        self.full = Target(url, FULL, extra, accept="text/plain", tls=tls)  # QUERY not served
        self.interval = interval
        self.load: EngineLoad | None = None
        self.read_at: float | None = None  # loop time of the last /metrics read
        self.warned = False  # a /metrics without vLLM's gauges is said once

    async def __call__(self, pool: ConnectionPool, within: float) -> NodeReport:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            status, _, latency_ms = await get(pool, self.health, within)
        except ProbeFailed as failed:
            return failed.report
        if status != 200:
            return NodeReport(latency_ms, f"HTTP {status} from /health")
        # (a 200 without load, the first rounds or a server without gauges, is fresh: there is
        # no progress reading to wait for)
        fresh = self.read_at is None or start - self.read_at >= self.interval
        if fresh:
            fresh = await self._read_load(pool, within - (loop.time() - start))
        load = self.load
        if load is None:
            return NodeReport(latency_ms, None, "ok", self.unit_id, "leader", 0)
        return NodeReport(
            latency_ms,
            None,
            "ok",
            self.unit_id,
            "leader",
            0,
            None,
            load.steps,
            load.running + load.waiting,
            load.running,
            kv_usage=load.kv_usage,
            progress=load.progress,
            fresh=fresh,
        )

    async def _read_load(self, pool: ConnectionPool, within: float) -> bool:
        """Whether a new load was read. A failed read keeps the last load (a slow /metrics is
        no evidence of death: the /health answer is); one without vLLM's gauges forgets it."""
        self.read_at = asyncio.get_running_loop().time()
        if within <= 0:
            return False
        try:
            status, body, _ = await get(pool, self.metrics, within)
            if status != 200 and self.metrics is not self.full:
                self.metrics = self.full  # a server without the filtered path: read it all
                status, body, _ = await get(pool, self.metrics, within)
        except ProbeFailed:
            return False
        self.load = parse_load(body) if status == 200 else None
        if self.load is None and not self.warned:
            self.warned = True
            log.warning(
                "unit %s: %s/metrics answered HTTP %d without vLLM's request gauges: no engine"
                " load or stall detection for it",
                self.unit_id,
                self.metrics.endpoint.host_header.decode(),
                status,
            )
        return self.load is not None


def leader_probe(unit: UnitConfig, extra: bytes, tls: ssl.SSLContext | None = None) -> VllmProbe:
    return VllmProbe(unit.id, unit.nodes[0], extra, unit.load_interval, tls)
