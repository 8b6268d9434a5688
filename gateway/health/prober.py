"""One prober per unit: probe every node each interval, judge the round, apply the verdict.

Nodes of a round are probed concurrently, so a round costs one probe timeout at worst and a
dead follower is seen as soon as a leader would be. Rounds run start to start every
`interval` +- `jitter`, so a thousand probers drift apart instead of hitting their units in
lockstep; within that window a round joins another prober's wake-up if one is planned, a few
rounds a wake-up at most (ticks.py). The prober is the only writer of its unit's health and
of `unit.nodes`. A flip is applied once: the state (with its reason), one event (whose log
line is the only one: steady state logs nothing), and one transition count. A round whose
only problems are timeouts asks `traffic` whether the unit's live streams still flow (then it
is slow, not dead). When the leader answered and only followers timed out, it asks for
progress made since the round's probes went out: every token needs every node, so a follower
is vouched for only by tokens it helped make after it fell silent, never by earlier traffic.
A leader that reports its own engine's work (a stock vLLM's /metrics) brings that witness in
its report; the verdict weighs it beside the traffic.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import Future
from collections.abc import Callable, Coroutine
from random import Random
from typing import Any

from gateway.config import HealthConfig
from gateway.health.kinds import node_probes, report_window
from gateway.health.probe import canary
from gateway.health.result import NodeReport
from gateway.health.signals import HealthObserver
from gateway.health.ticks import ProbeTicks
from gateway.health.verdict import Flip, GangVerdict, Round
from gateway.health_states import Lag
from gateway.routing.load import others
from gateway.tls import unit_context
from gateway.units import UnitRegistry, UnitState
from gateway.upstream.pool import ConnectionPool, Endpoint

log = logging.getLogger("unitgate.health")

# (unit id, loop time, since) -> whether the unit's live traffic arrives at its own pace
# right now; with `since` (a loop time), whether the unit made progress after it.
Traffic = Callable[[str, float, float | None], bool]


def no_traffic(unit_id: str, now: float, since: float | None = None) -> bool:
    return False


# (unit id) -> why the unit's learned latency lags the fleet's (gateway/routing/forecast.py)
# or it is on probation, with the share of slow_weight it keeps; None: it is then `slow`
# while its probes pass.
Lagging = Callable[[str], Lag | None]


def never_lagging(unit_id: str) -> Lag | None:
    return None


# This gateway's requests on a unit, as the prober subtracts them from the leader's count.
Own = Callable[[UnitState], int]


def live_count(unit: UnitState) -> int:
    """In one process the live count: it holds every request the leader can have of ours
    (counted from the pick, before the leader sees it, to the end of the relay, after)."""
    return unit.inflight


class UnitProber:
    def __init__(
        self,
        unit: UnitState,
        registry: UnitRegistry,
        signals: HealthObserver,
        pool: ConnectionPool,
        config: HealthConfig,
        rng: Random,
        traffic: Traffic = no_traffic,
        own: Own | None = live_count,
        ticks: ProbeTicks | None = None,
        lagging: Lagging = never_lagging,
    ) -> None:
        self.unit, self.registry, self.signals = unit, registry, signals
        self.lagging = lagging
        self.ticks = ticks  # shared wake-ups with other probers; None: a timer of its own
        self.own = own  # None: [routing].engine_load is off, the leader's counts are not read
        self.pool, self.config, self.rng = pool, config, rng
        self.traffic = traffic
        urls = unit.config.nodes
        self.probes = node_probes(unit.config, unit.models)
        self.leader = Endpoint(unit.leader, unit_context(unit.config))  # the canary's
        self.extra = unit.config.header_lines()
        self.verdict = GangVerdict(
            unit.id,
            urls,
            fall=config.fall,
            rise=config.rise,
            stall_timeout=config.stall_timeout,
            state=unit.health,
            slow_grace=config.slow_grace(),
            report_window=report_window(unit.config),
        )
        self.rounds = 0

    async def run(self, first_after: float = 0.0) -> None:
        """Until cancelled; the first round starts after `first_after` seconds."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(first_after)
        while True:
            started = loop.time()
            try:
                await self.probe_round()
            except Exception:
                # A bug must not silently freeze the unit's health in its last state.
                log.exception("prober of unit %s: probe round failed", self.unit.id)
            await self._until_next(started, loop.time())

    async def probe_round(self) -> Round:
        h = self.config
        started = asyncio.get_running_loop().time()
        idle = self.unit.inflight == 0  # no stream of ours that could show progress
        own_then: list[int] = []

        async def leader() -> NodeReport:
            report = await self.probes[0](self.pool, h.timeout)
            if self.own is not None:
                # Taken as the leader's count arrives, not at the round's end: a follower
                # that answers late holds the round open, and our streams that end meanwhile
                # would pass for other replicas' (and route this unit's traffic away).
                own_then.append(self.own(self.unit))
            return report

        canary_error: str | None = None
        due = self._model() if h.canary_every and self.rounds % h.canary_every == 0 else None
        if due is not None:
            canary_error, reports = await asyncio.gather(
                canary(self.pool, self.leader, due, h.canary_timeout, self.extra),
                self._all(leader()),
            )
        elif len(self.probes) == 1:  # a lone leader (a `vllm serve`): no task to gather
            reports = [await leader()]
        else:
            reports = await self._all(leader())
        self.rounds += 1
        now = asyncio.get_running_loop().time()
        # Asked only when it matters: a round whose problems are all timeouts.
        since = None if reports[0].timed_out else started  # followers only: fresh progress
        flowing = any(r.timed_out for r in reports) and self.traffic(self.unit.id, now, since)
        # A canary sent with the probes answers for the whole gang; else one may be asked now.
        asked = due is not None and canary_error is None
        model = None if due is not None else self._model()
        if model is not None and self.verdict.wants_canary(reports, flowing, idle):
            canary_error = await canary(self.pool, self.leader, model, h.canary_timeout, self.extra)
            asked = canary_error is None
            now = asyncio.get_running_loop().time()
        lag = self.lagging(self.unit.id)
        reason = None if lag is None else lag.reason
        result = self.verdict.observe(reports, now, canary_error, flowing, reason, asked)
        self._weigh_slow(1.0 if lag is None else lag.share)
        self._record_nodes(reports, result.nodes)
        if own_then:
            first = reports[0]
            self.unit.foreign = others(first.pending, first.running, own_then[0])
        if result.flip is not None:
            self._apply(result.flip)
        return result

    def _model(self) -> str | None:
        """The model a canary asks for; None while the unit's models are not known."""
        return self.unit.config.served_model or next(iter(self.unit.models), None)

    def _all(self, leader: Coroutine[Any, Any, NodeReport]) -> Future[list[NodeReport]]:
        """The leader's probe and every follower's, concurrently."""
        h = self.config
        return asyncio.gather(leader, *(probe(self.pool, h.timeout) for probe in self.probes[1:]))

    def _record_nodes(self, reports: list[NodeReport], problems: tuple[str | None, ...]) -> None:
        for node, report, problem in zip(self.unit.nodes, reports, problems, strict=True):
            node.healthy = problem is None
            node.error = problem
            node.latency_ms = report.latency_ms
            node.step, node.pending, node.pid = report.step, report.pending, report.pid
            node.kv_usage = report.kv_usage
            if problem is not None:
                self.signals.probe_failed(self.unit.id, node.rank)
        leader = reports[0]
        if leader.error is None:  # what a leader that answered says of itself
            self.unit.tied = leader.tied

    def _weigh_slow(self, share: float) -> None:
        """The share of slow_weight the unit keeps while it is slow (set before a flip, so
        that a unit turning slow gets it at once)."""
        if self.registry.units.get(self.unit.id) is self.unit:
            self.registry.set_slow_share(self.unit.id, share)

    def _apply(self, flip: Flip) -> None:
        if self.registry.units.get(self.unit.id) is not self.unit:
            return  # removed while this round was out; its bit is nobody's business now
        self.registry.set_health(self.unit.id, flip.health, flip.reason, flip.hard, "prober")
        self.signals.flipped(self.unit.id, flip.health, flip.reason)

    async def _until_next(self, started: float, now: float) -> None:
        """Sleep until the next round's start, `interval` +- `jitter` after `started`."""
        target = started + self._interval()
        if self.ticks is None:
            await asyncio.sleep(max(0.0, target - now))
            return
        h = self.config
        spread = h.interval * h.jitter
        lo, hi = started + h.interval - spread, started + h.interval + spread
        await self.ticks.sleep_within(lo, hi, target)

    def _interval(self) -> float:
        h = self.config
        return h.interval * (1.0 + h.jitter * self.rng.uniform(-1.0, 1.0))
