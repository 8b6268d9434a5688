"""Owns the per-unit probers: one task per unit, started and ended with unit membership.

Every prober task has this one owner, which cancels it when its unit is removed and awaits
all of them (with a deadline) at shutdown, so no probe outlives the gateway or its unit.
The probers share one connection pool of their own: probes never wait behind, or get
counted against, the request path's upstream connections.
"""

from __future__ import annotations

import asyncio
import logging
from random import Random
from types import TracebackType

from gateway.config import Config
from gateway.health.probe import probe_pool
from gateway.health.prober import (
    Lagging,
    Own,
    Traffic,
    UnitProber,
    live_count,
    never_lagging,
    no_traffic,
)
from gateway.health.signals import HealthObserver
from gateway.health.ticks import ProbeTicks
from gateway.units import UnitRegistry, UnitState
from gateway.upstream.pool import ConnectionPool

log = logging.getLogger("unitgate.health")

# Probers only ever wait on bounded probes and sleeps, so cancellation takes one loop pass.
STOP_TIMEOUT_S = 5.0


class HealthSupervisor:
    def __init__(
        self,
        config: Config,
        registry: UnitRegistry,
        signals: HealthObserver,
        rng: Random | None = None,
        traffic: Traffic = no_traffic,
        own: Own = live_count,
        lagging: Lagging = never_lagging,
    ) -> None:
        self.config = config
        self.traffic = traffic
        self.lagging = lagging
        self.own = own
        self.registry = registry
        self.signals = signals  # the probers' flips and failures, for their observers
        self.rng = rng or Random()
        self._pool: ConnectionPool | None = None
        self._ticks: ProbeTicks | None = None  # the probers' shared wake-ups
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ending: set[asyncio.Task[None]] = set()  # cancelled, not yet finished
        self._subscribed = False

    @property
    def running(self) -> bool:
        return self._pool is not None

    @property
    def ticks(self) -> ProbeTicks | None:
        """The probers' shared wake-ups while they run (for tests)."""
        return self._ticks

    def task(self, unit_id: str) -> asyncio.Task[None] | None:
        """The prober task of a unit, if one runs (for the admin view and tests)."""
        return self._tasks.get(unit_id)

    async def start(self) -> None:
        """Start a prober for every unit; a no-op when `[health].enabled` is false."""
        h = self.config.health
        if not h.enabled or self.running:
            return
        self._pool = probe_pool(h.timeout, self.config.upstream.keepalive_timeout)
        self._ticks = ProbeTicks(asyncio.get_running_loop())
        if not self._subscribed:  # the registry has no unsubscribe: subscribe once
            self.registry.on_membership(self._membership)
            self._subscribed = True
        for unit in list(self.registry.units.values()):
            # Spread over one interval: a thousand units probed in the same instant are a
            # connect storm that times probes out and ejects every unit at start-up.
            self._spawn(unit, first_after=self.rng.uniform(0.0, h.interval))
        log.info("probing %d units every %g s", len(self._tasks), h.interval)

    async def stop(self) -> None:
        """Cancel every prober, wait for them (bounded), then close the probe connections."""
        pool, self._pool = self._pool, None
        ticks, self._ticks = self._ticks, None
        tasks = [*self._tasks.values(), *self._ending]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if ticks is not None:
            ticks.close()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            if late:
                log.error("%d probers did not stop within %g s", len(late), STOP_TIMEOUT_S)
        self._ending.clear()
        if pool is not None:
            pool.close()

    async def __aenter__(self) -> HealthSupervisor:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _membership(self, unit: UnitState, added: bool) -> None:
        if not self.running:
            return
        if added:
            self._spawn(unit)
        else:
            self._end(unit.id)

    def _spawn(self, unit: UnitState, first_after: float = 0.0) -> None:
        """A unit added at run time is probed at once: it is unroutable until it passes."""
        assert self._pool is not None
        self._end(unit.id)  # an id re-added before its old prober finished ending
        prober = UnitProber(
            unit,
            self.registry,
            self.signals,
            self._pool,
            self.config.health,
            self.rng,
            self.traffic,
            self.own if self.config.routing.engine_load else None,
            self._ticks,
            self.lagging,
        )
        run = prober.run(first_after)
        self._tasks[unit.id] = asyncio.get_running_loop().create_task(
            run, name=f"unitgate-prober-{unit.id}"
        )

    def _end(self, unit_id: str) -> None:
        task = self._tasks.pop(unit_id, None)
        if task is None:
            return
        task.cancel()
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
