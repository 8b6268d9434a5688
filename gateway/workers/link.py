"""A worker's end of its socket pair: the control plane's state in, traffic's evidence out.

Out go, as they happen: breaker evidence (`outcome`, with its age rather than a time, since
the two processes' loop clocks are not one clock) and events recorded here (a resumption).
Every `REPORT_EVERY` seconds goes a report: which units' streams flow (the probers' reason
to call a unit slow rather than dead) and the in-flight count per unit (the fleet's
"drained"); every second, and whenever a /metrics scrape asks, the metrics' samples. Writes
never block the request path: they are buffered by the transport, and a control plane gone
away is seen by the reader as EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.observability import fleet
from gateway.observability.events import Event
from gateway.proxy.call import Call
from gateway.proxy.signals import Observer
from gateway.units import UnitRegistry, UnitState
from gateway.workers import frames

log = logging.getLogger("unitgate")

REPORT_EVERY = 0.1  # seconds
METRICS_EVERY = 10  # reports: the metrics' samples go once a second


class Link(Observer):
    """Also a request-path observer, for one signal: `ended` counts the requests answered."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.requests = 0
        self.units: UnitRegistry | None = None
        self.flowing: Callable[[str, float], bool] = lambda _unit, _now: False
        self.registry: CollectorRegistry | None = None
        self._reporter: asyncio.Task[None] | None = None

    def attach(
        self,
        units: UnitRegistry,
        flowing: Callable[[str, float], bool],
        registry: CollectorRegistry,
    ) -> None:
        """What the reports read: the worker's units, its streams' pace, its metrics."""
        self.units, self.flowing, self.registry = units, flowing, registry

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(frames.encode(message))

    def outcome(self, unit: UnitState, ok: bool, started: float) -> None:
        """The breaker feed's `record`: evidence for the control plane's breakers."""
        age = asyncio.get_running_loop().time() - started
        self.send({"t": "outcome", "unit": unit.id, "ok": ok, "age": age})

    def ended(self, call: Call) -> None:
        self.requests += 1

    def event(self, event: Event) -> None:
        self.send({"t": "event", **event.to_json()})

    def start(self) -> None:
        self._reporter = asyncio.get_running_loop().create_task(self._report())

    async def stop(self) -> None:
        """The last report and metrics, after the streams have drained."""
        if self._reporter is not None:
            self._reporter.cancel()
            await asyncio.gather(self._reporter, return_exceptions=True)
            self._reporter = None
        self.report()
        self.send_metrics()
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()

    def send_metrics(self, scrape: int | None = None) -> None:
        """`scrape`: the number of the control plane's scrape this answers."""
        if self.registry is not None:
            samples = fleet.samples(self.registry)
            self.send({"t": "metrics", "samples": samples, "scrape": scrape})

    def report(self) -> None:
        if self.units is None:
            return
        now = asyncio.get_running_loop().time()
        units = self.units.units.values()
        self.send(
            {
                "t": "report",
                "flowing": [u.id for u in units if self.flowing(u.id, now)],
                "inflight": {u.id: u.inflight for u in units if u.inflight},
                "requests": self.requests,
            }
        )

    async def _report(self) -> None:
        count = 0
        while True:
            self.report()
            count += 1
            if count % METRICS_EVERY == 0:
                self.send_metrics()
            await asyncio.sleep(REPORT_EVERY)
