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

Busy is not dead: a vLLM loaded by other clients answers `/health` late (its API server's loop
lags), which no traffic through this gateway explains. Its own report does: every report says
`busy_at`, when the latest /metrics read was asked for, if it showed requests running or
waiting and progress changed since the read before (None otherwise). The verdict lets that
vouch for a timed-out leader while it is at most `FRESH_READS` read intervals old
(`report_window`). Which reads happen when: a read normally follows a 200 from /health, so a
leader whose /health times out is not read at all, and its last report ages, as it must. While
/health times out, a due read goes out beside it instead, so a server that answers /metrics
but not /health in time still renews its report (a frozen one answers neither). A read that got
no answer is retried once at the next round, so one unlucky read does not age the report by a
whole interval.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import replace

from gateway.config import UnitConfig
from gateway.health.kinds.vllm_metrics import FULL, QUERY, EngineLoad, parse_load
from gateway.health.probe import ProbeFailed, Target, get
from gateway.health.result import NodeReport
from gateway.upstream.pool import ConnectionPool

log = logging.getLogger("unitgate.health")

# How many read intervals old a report of work moving may be and still vouch for a leader whose
# /health times out: reads come every `load_interval` (plus up to a round) while /health
# answers, and none while it does not, so one read may be missing, not two. With the default
# 2 s that keeps a busy unit in through a /health answered up to about 1.7 s late, and ejects a
# frozen leader that was busy when last read at most 4 s (plus `fall` rounds) after that read.
FRESH_READS = 2


def report_window(unit: UnitConfig) -> float:
    """How long the leader's report of work moving vouches for it (seconds since it was read)."""
    return FRESH_READS * unit.load_interval


class VllmProbe:
    __slots__ = (
        "busy_at",
        "full",
        "health",
        "interval",
        "late",
        "load",
        "metrics",
        "misses",
        "read_at",
        "unit_id",
        "warned",
    )

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
        self.read_at: float | None = None  # loop time of the last /metrics read (attempt)
        self.misses = 0  # /metrics reads in a row that got no answer
        self.busy_at: float | None = None  # what the reports carry: see the module's doc
        self.late = False  # the last /health probe timed out
        self.warned = False  # a /metrics without vLLM's gauges is said once

    async def __call__(self, pool: ConnectionPool, within: float) -> NodeReport:
        loop = asyncio.get_running_loop()
        start = loop.time()
        due = self.read_at is None or start - self.read_at >= self.interval or self.misses == 1
        read: bool | None = None  # whether a new load was read; None: not tried this round
        if due and self.late:  # /health timed out last round: read beside it, not after it
            answer, read = await asyncio.gather(
                self._health(pool, within), self._read_load(pool, within)
            )
        else:
            answer = await self._health(pool, within)
        if isinstance(answer, NodeReport):  # no 200 from /health
            self.late = answer.timed_out
            return replace(answer, busy_at=self.busy_at) if answer.timed_out else answer
        self.late, latency_ms = False, answer
        if read is None and due:
            read = await self._read_load(pool, within - (loop.time() - start))
        load = self.load
        if load is None:
            # (a 200 without load, the first rounds or a server without gauges, is fresh:
            # there is no progress reading to wait for)
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
            fresh=bool(read),
            busy_at=self.busy_at,
        )

    async def _health(self, pool: ConnectionPool, within: float) -> NodeReport | float:
        """The milliseconds /health took to answer 200, or the report of why it did not."""
        try:
            status, _, latency_ms = await get(pool, self.health, within)
        except ProbeFailed as failed:
            return failed.report
        if status != 200:
            return NodeReport(latency_ms, f"HTTP {status} from /health")
        return latency_ms

    async def _read_load(self, pool: ConnectionPool, within: float) -> bool:
        """Whether a new load was read. A failed read keeps the last load and its `busy_at`,
        which age from their own read (a slow /metrics is no evidence of death: the /health
        answer is); one without vLLM's gauges forgets both."""
        sent = self.read_at = asyncio.get_running_loop().time()
        if within <= 0:  # /health answered at its deadline: no time left, retried next round
            self.misses += 1
            return False
        try:
            status, body, _ = await get(pool, self.metrics, within)
            if status != 200 and self.metrics is not self.full:
                self.metrics = self.full  # a server without the filtered path: read it all
                status, body, _ = await get(pool, self.metrics, within)
        except ProbeFailed:
            self.misses += 1
            return False
        self.misses = 0
        before, load = self.load, parse_load(body) if status == 200 else None
        self.load = load
        moved = (
            load is not None
            and before is not None
            and load.progress is not None
            and load.progress != before.progress
        )
        busy = load is not None and load.running + load.waiting > 0
        self.busy_at = sent if busy and moved else None
        if load is None and not self.warned:
            self.warned = True
            log.warning(
                "unit %s: %s/metrics answered HTTP %d without vLLM's request gauges: no engine"
                " load or stall detection for it",
                self.unit_id,
                self.metrics.endpoint.host_header.decode(),
                status,
            )
        return load is not None


def leader_probe(unit: UnitConfig, extra: bytes, tls: ssl.SSLContext | None = None) -> VllmProbe:
    return VllmProbe(unit.id, unit.nodes[0], extra, unit.load_interval, tls)
